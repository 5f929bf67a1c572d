"""The bucket packer: which parameter tensors travel and step together, and each rank's shard.

One torch-free implementation, used by the engine (`engine/layout.py`, on the model's real tensors in
measured gradient-arrival order) and by the planner (on the tensor list a `ModelShape` describes), so
the planner's buckets, "device tail buckets" and memory are the engine's, exactly.

The rule: take tensors in arrival order and start a new bucket when the next tensor would overflow
`bucket_size` elements. A tensor never straddles buckets, so one larger than `bucket_size` gets a
bucket of its own. Refinements (`plan_buckets`):
- a segment's tensors (weight flow: a flowed block's) are packed on their own, so a bucket is either
  resident on the device or flowed, never both;
- inside a bucket, tensors are ordered by param group, so a bucket's elements form at most one
  contiguous run per group (the host kernel takes one set of hyper-parameters per call);
- sharding: a bucket's flat buffer is padded to a multiple of `world * SHARD_ALIGN` elements and split
  into `world` contiguous shards; rank r owns elements [r * shard, (r + 1) * shard).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SHARD_ALIGN = 16  # elements: a shard starts on a 64-byte boundary in fp32 (the kernel's vector width)


class Packable(Protocol):
    """What the packer needs of a tensor (the engine's ParamSlot; the planner's ShapeTensor)."""

    numel: int
    group: int
    bucket: int
    offset: int


def pack_whole_tensors(numels: Sequence[int], bucket_size: int) -> list[list[int]]:
    """Positions (indices into `numels`) of each bucket, in order; every position appears once."""
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be a positive number of elements, got {bucket_size}")
    buckets: list[list[int]] = [[]]
    size = 0
    for pos, n in enumerate(numels):
        if buckets[-1] and size + n > bucket_size:
            buckets.append([])
            size = 0
        buckets[-1].append(pos)
        size += n
    return [b for b in buckets if b]


def tail_start(n_buckets: int, device_tail_buckets: int) -> int:
    """Index of the first device tail bucket: the last `device_tail_buckets` buckets by arrival."""
    return max(0, n_buckets - max(0, device_tail_buckets))


@dataclass
class ShapeTensor:
    """A parameter tensor described by a shape (the planner's side of the packer)."""

    name: str
    numel: int
    group: int = 0
    unit: str = ""
    bucket: int = -1
    offset: int = 0


@dataclass
class BucketLayout:
    index: int
    slots: list[Any] = field(default_factory=list)
    numel: int = 0  # elements of the parameters
    padded: int = 0  # elements of the flat buffer (a multiple of world * SHARD_ALIGN)
    on_device: bool = False  # a repartitioned tail bucket: grads + Adam state stay on the device
    flow_block: Any = None  # the flowed block whose weights these are, else None

    def shard(self, rank: int, world: int) -> tuple[int, int]:
        n = self.padded // world
        return rank * n, (rank + 1) * n


def padded_numel(numel: int, world: int) -> int:
    unit = world * SHARD_ALIGN
    return max(unit, math.ceil(numel / unit) * unit)


def layout_bucket(index: int, members: list[Packable], world: int, flow_block: Any = None) -> BucketLayout:
    """One bucket of `members`, ordered by param group (stable: arrival order within a group)."""
    members = sorted(members, key=lambda s: s.group)
    lay = BucketLayout(index=index, flow_block=flow_block)
    for s in members:
        s.bucket, s.offset = index, lay.numel
        lay.slots.append(s)
        lay.numel += s.numel
    lay.padded = padded_numel(lay.numel, world)
    return lay


def plan_buckets(slots: Sequence[Packable], order: list[int], bucket_size: int, device_tail_buckets: int,
                 world: int = 1, segment: Callable[[Any], Hashable] | None = None,
                 fixed: dict[Hashable, list[BucketLayout]] | None = None) -> list[BucketLayout]:
    """Pack `slots` (taken in `order`, a permutation of slot indices) into buckets, numbered in order.

    `segment(slot)` (weight flow: the flowed block, or None) keeps a segment's tensors in buckets of
    their own; a segment stands in the order where its last tensor arrives (when it completes).
    `fixed[segment]`: buckets already laid out for that segment (weight flow lays out its blocks at
    initialize, before the arrival order is known); they are renumbered, not repacked. The last
    `device_tail_buckets` buckets by arrival are marked `on_device`.
    """
    if sorted(order) != list(range(len(slots))):
        raise ValueError("order must be a permutation of the parameter indices")
    seg = segment or (lambda s: None)
    fixed = fixed or {}
    last = {seg(slots[i]): pos for pos, i in enumerate(order) if seg(slots[i]) is not None}
    units: list[tuple[Hashable, list[int]]] = []  # (segment or None, slot indices), in arrival order
    for pos, i in enumerate(order):
        sg = seg(slots[i])
        if sg is None:
            if units and units[-1][0] is None:
                units[-1][1].append(i)
            else:
                units.append((None, [i]))
        elif last[sg] == pos:
            units.append((sg, [j for j in order if seg(slots[j]) == sg]))
    buckets: list[BucketLayout] = []
    for sg, members in units:
        if sg is not None and sg in fixed:
            for lay in fixed[sg]:
                lay.index = len(buckets)
                for s in lay.slots:
                    s.bucket = lay.index
                buckets.append(lay)
            continue
        for positions in pack_whole_tensors([slots[i].numel for i in members], bucket_size):
            buckets.append(layout_bucket(len(buckets), [slots[members[p]] for p in positions], world, sg))
    for lay in buckets:
        lay.on_device = False
    for lay in buckets[tail_start(len(buckets), device_tail_buckets):]:
        lay.on_device = True
    return buckets
