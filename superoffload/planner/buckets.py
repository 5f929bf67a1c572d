"""Parameter units and gradient buckets in the order gradients arrive during backward.

A *unit* is the parameters one forward op needs: the embedding, one block, the final norm (+ an untied
LM head). Gradients arrive head first, then blocks last-to-first, then the embedding (a tied
embedding/head matrix completes only at the very end). Buckets cut that sequence into equal parameter
counts; a unit larger than a bucket spans several.

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


def _cut(seq: list[tuple[str, int]], size: int) -> list[list[tuple[str, int]]]:
    out: list[list[tuple[str, int]]] = []
    cur: list[tuple[str, int]] = []
    room = size
    for name, params in seq:
        while params > 0:
            take = min(params, room)
            cur.append((name, take))
            params -= take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], size
    if cur:
        out.append(cur)
    return out


def _merge(pieces: list[tuple[str, int]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for name, p in pieces:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + p)
        else:
            out.append((name, p))
    return out


def split_params(shape: ModelShape, tail_buckets: int, bucket_params: int) -> tuple[int, int]:
    """(host params, device-tail params): the tail is the last ``tail_buckets`` buckets of backward."""
    total = sum(p for _, p in units_arrival_order(shape))
    tail = min(total, tail_buckets * bucket_params)
    return total - tail, tail


def bucket_groups(shape: ModelShape, bucket_params: int, tail_buckets: int,
                  max_groups: int = 48, max_tail_groups: int = 8) -> list[BucketGroup]:
    """Groups of real buckets in arrival order: host buckets first, then the device tail."""
    if bucket_params <= 0:
        raise ValueError("bucket_params must be positive")
    arrival = units_arrival_order(shape)
    host_params, tail_params = split_params(shape, tail_buckets, bucket_params)
    # split the arrival sequence at host_params
    host_seq: list[tuple[str, int]] = []
    tail_seq: list[tuple[str, int]] = []
    consumed = 0
    for name, p in arrival:
        lo, hi = consumed, consumed + p
        consumed = hi
        if lo < host_params:
            host_seq.append((name, min(hi, host_params) - lo))
        if hi > host_params:
            tail_seq.append((name, hi - max(lo, host_params)))
    groups: list[BucketGroup] = []
    for seq, on_device, cap in ((host_seq, False, max_groups), (tail_seq, True, max_tail_groups)):
        n_params = sum(p for _, p in seq)
        if n_params == 0:
            continue
        n_real = math.ceil(n_params / bucket_params)
        per_group = math.ceil(n_real / cap)
        for chunk in _cut(seq, per_group * bucket_params):
            chunk_params = sum(p for _, p in chunk)
            groups.append(BucketGroup(_merge(chunk), math.ceil(chunk_params / bucket_params), on_device))
    return groups
