"""Parameter units and gradient buckets in the order gradients arrive during backward.

A *unit* is the parameters one forward op needs: the embedding, one block, the final norm (+ an untied
LM head). Gradients arrive head first, then blocks last-to-first, then the embedding (a tied
embedding/head matrix completes only at the very end). Buckets are packed the way the SuperOffload
engine packs them (engine/layout.py ``plan_buckets``): whole parameter tensors in reverse registration
order, a new bucket when the next tensor would overflow ``bucket_params``, so a tensor larger than a
bucket gets one of its own. ``device_tail_buckets`` therefore means the same buckets here as in the
engine (an even split made the planner's tail of gpt-13b 264 buckets of 11M params, while the
engine's last 264 buckets, whole 26-105M tensors among them, held most of the model).

For simulation speed, consecutive real buckets are merged into at most ``max_groups`` *groups*; a
group's op costs are the sum of its real buckets' costs (each real bucket still pays its own per-copy
latency), only the pipelining granularity gets coarser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superoffload.shapes import ModelShape

EMB = "emb"
FINAL = "final"


def layer_unit(i: int) -> str:
    return f"L{i}"


def units_forward_order(shape: ModelShape) -> list[tuple[str, int]]:
    final = (2 if shape.family == "gpt" else 1) * shape.hidden
    if not shape.tied_embeddings:
        final += shape.head_params()
    return ([(EMB, shape.embedding_params())]
            + [(layer_unit(i), shape.block_params()) for i in range(shape.layers)]
            + [(FINAL, final)])


def units_arrival_order(shape: ModelShape) -> list[tuple[str, int]]:
    fwd = units_forward_order(shape)
    return [fwd[-1]] + list(reversed(fwd[1:-1])) + [fwd[0]]


@dataclass
class BucketGroup:
    """Consecutive real buckets, with the units (and their parameter counts) they cover."""

    pieces: list[tuple[str, int]]
    real_buckets: int
    on_device: bool

    @property
    def params(self) -> int:
        return sum(p for _, p in self.pieces)

    @property
    def real_bucket_params(self) -> float:
        return self.params / self.real_buckets

    @property
    def last_unit(self) -> str:
        return self.pieces[-1][0]


def param_tensors(shape: ModelShape) -> list[tuple[str, int]]:
    """(unit, numel) of every parameter tensor in registration order (harness/models: GPT as in gpt.py;
    the "hf" family in transformers' Llama layout). Per block they add up to ``block_params()``; anything
    the list does not name (biases of an HF variant) is one more small tensor of the block."""
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.n_kv_heads * shape.head_dim
    if shape.family == "gpt":
        block = [h, h, h * (h + 2 * kv), h + 2 * kv, h * h, h, h, h, h * f, f, f * h, h]
        final = [h, h]
    else:
        mlp = [h * f, h * f, f * h] if shape.gated_mlp else [h * f, f * h]
        block = [h * h, h * kv, h * kv, h * h, *mlp, h, h]
        final = [h]
    rest = shape.block_params() - sum(block)
    if rest > 0:
        block.append(rest)
    emb = shape.embedding_params()
    tok = shape.vocab * h
    top = [(EMB, tok)] + ([(EMB, emb - tok)] if emb > tok else [])
    head = [] if shape.tied_embeddings else [(FINAL, shape.head_params())]
    return (top + [(layer_unit(i), n) for i in range(shape.layers) for n in block]
            + [(FINAL, n) for n in final] + head)


def pack_buckets(shape: ModelShape, bucket_params: int) -> list[list[tuple[str, int]]]:
    """The engine's buckets in arrival order, each as merged (unit, params) pieces."""
    if bucket_params <= 0:
        raise ValueError("bucket_params must be positive")
    buckets: list[list[tuple[str, int]]] = [[]]
    size = 0
    for unit, n in reversed(param_tensors(shape)):
        if buckets[-1] and size + n > bucket_params:
            buckets.append([])
            size = 0
        buckets[-1].append((unit, n))
        size += n
    return [_merge(b) for b in buckets if b]


def _merge(pieces: list[tuple[str, int]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for name, p in pieces:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + p)
        else:
            out.append((name, p))
    return out


def split_params(shape: ModelShape, tail_buckets: int, bucket_params: int) -> tuple[int, int]:
    """(host params, device-tail params): the tail is the last ``tail_buckets`` engine buckets of backward."""
    sizes = [sum(p for _, p in b) for b in pack_buckets(shape, bucket_params)]
    tail = sum(sizes[max(0, len(sizes) - tail_buckets):]) if tail_buckets > 0 else 0
    return sum(sizes) - tail, tail


def bucket_groups(shape: ModelShape, bucket_params: int, tail_buckets: int,
                  max_groups: int = 48, max_tail_groups: int = 8) -> list[BucketGroup]:
    """Groups of consecutive engine buckets in arrival order: host buckets first, then the device tail."""
    packed = pack_buckets(shape, bucket_params)
    n_tail = min(len(packed), max(0, tail_buckets))
    parts = ((packed[:len(packed) - n_tail], False, max_groups), (packed[len(packed) - n_tail:], True, max_tail_groups))
    groups: list[BucketGroup] = []
    for buckets, on_device, cap in parts:
        per_group = math.ceil(len(buckets) / cap) if buckets else 1
        for k in range(0, len(buckets), per_group):
            chunk = buckets[k:k + per_group]
            groups.append(BucketGroup(_merge([p for b in chunk for p in b]), len(chunk), on_device))
    return groups
