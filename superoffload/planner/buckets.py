"""Parameter units and gradient buckets in the order gradients arrive during backward.

A *unit* is the parameters one forward op needs: the embedding, one block, the final norm (+ an untied
LM head). Gradients arrive head first, then blocks last-to-first, then the embedding (a tied
embedding/head matrix completes only at the very end). Buckets are packed by the packer the
SuperOffload engine uses (``superoffload.packing.pack_pieces``) on the shape's parameter tensors
(``ModelShape.param_tensors``) in reverse registration order, so ``device_tail_buckets`` means the same
buckets here as in the engine: a new bucket when the next tensor would overflow ``bucket_size``, a
tensor larger than ``bucket_size`` split over buckets of its own (its last piece shared).

For simulation speed, consecutive real buckets are merged into at most ``max_groups`` *groups*; a
group's op costs are the sum of its real buckets' costs (each real bucket still pays its own per-copy
latency), only the pipelining granularity gets coarser.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from superoffload.packing import pack_pieces, tail_start
from superoffload.shapes import EMBEDDING_UNIT, FINAL_UNIT, ModelShape, block_unit

EMB = EMBEDDING_UNIT
FINAL = FINAL_UNIT
layer_unit = block_unit


@dataclass
class BucketGroup:
    """Consecutive real buckets, with the units (and their parameter counts) they cover."""

    pieces: list[tuple[str, int]]
    real_buckets: int
    on_device: bool
    first_forward: bool = False  # among the first ``last_host`` host buckets in forward order
    params: int = field(init=False)  # sum of the pieces (read for every op a bucket adds to a prediction)

    def __post_init__(self) -> None:
        self.params = sum(p for _, p in self.pieces)

    @property
    def last_unit(self) -> str:
        return self.pieces[-1][0]


def pack_buckets(shape: ModelShape, bucket_size: int, world: int = 1,
                 split: bool = True) -> tuple[list[tuple[str, int]], ...]:
    """The engine's buckets in arrival order, each as merged (unit, params) pieces. `world` sets where a
    split tensor is cut (at most `world` * 16 elements apart from one rank's cut: timing ignores it);
    `split` off packs whole tensors (the peers' buckets). Read only (cached: a plan prices many tails and
    casts over the same buckets)."""
    if bucket_size <= 0:
        raise ValueError("bucket_size must be positive")
    return _pack(tuple(reversed(shape.param_tensors())), bucket_size, world, split)


@functools.lru_cache(maxsize=128)
def _pack(arrival: tuple[tuple[str, int], ...], bucket_size: int, world: int,
          split: bool) -> tuple[list[tuple[str, int]], ...]:
    return tuple(_merge([(arrival[pos][0], n) for pos, _, n in b])
                 for b in pack_pieces([n for _, n in arrival], bucket_size, world, split))


def _merge(pieces: list[tuple[str, int]]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for name, p in pieces:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + p)
        else:
            out.append((name, p))
    return out


def split_params(shape: ModelShape, device_tail_buckets: int, bucket_size: int,
                 split: bool = True) -> tuple[int, int]:
    """(host params, device-tail params): the tail is the last ``device_tail_buckets`` engine buckets of
    backward."""
    sizes = [sum(p for _, p in b) for b in pack_buckets(shape, bucket_size, split=split)]
    tail = sum(sizes[tail_start(len(sizes), device_tail_buckets):])
    return sum(sizes) - tail, tail


def bucket_groups(shape: ModelShape, bucket_size: int, device_tail_buckets: int,
                  max_groups: int = 48, max_tail_groups: int = 8, last_host: int = 0,
                  split: bool = True) -> list[BucketGroup]:
    """Groups of consecutive engine buckets in arrival order: host buckets first, then the device tail.
    ``last_host``: the last that many host buckets (the first in forward order: those an upload ring
    lets speculate, config ``upload_slots``) are grouped apart from the others, so the model sees them."""
    packed = pack_buckets(shape, bucket_size, split=split)
    n_tail = len(packed) - tail_start(len(packed), device_tail_buckets)
    host = packed[:len(packed) - n_tail]
    last = min(last_host, len(host))
    parts = ((host[:len(host) - last], False, max_groups), (host[len(host) - last:], False, max_tail_groups),
             (packed[len(packed) - n_tail:], True, max_tail_groups))
    groups: list[BucketGroup] = []
    for i, (buckets, on_device, cap) in enumerate(parts):
        per_group = math.ceil(len(buckets) / cap) if buckets else 1
        for k in range(0, len(buckets), per_group):
            chunk = buckets[k:k + per_group]
            groups.append(BucketGroup(_merge([p for b in chunk for p in b]), len(chunk), on_device, i == 1))
    return groups
