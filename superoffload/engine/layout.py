"""Bucket layout: which parameters travel and step together, and which shard of each a rank owns.

Parameters are packed into buckets of about `bucket_size` elements (`superoffload.packing`, the one
packer the planner shares) in the order their gradients become ready in backward, measured on the first
step. Two refinements:
- a flowed block's parameters (weight flow) are packed on their own, so a bucket is either resident
  on the device or flowed, never both;
- inside a bucket, parameters are ordered by param group, so a bucket's elements form at most one
  contiguous run per group: the kernel takes one set of hyper-parameters per call, and because it is
  split-invariant, several calls on sub-ranges give bit-identically the result of one call on the whole.

Sharding: a bucket's flat buffer is padded to a multiple of `world_size * SHARD_ALIGN` elements and
split into `world_size` contiguous shards; rank r owns elements [r * shard, (r + 1) * shard) of every
bucket: its gradients after the reduce-scatter, its fp32 master and Adam moments on the host. With one
rank the shard is the whole (padded) bucket: the same code path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from superoffload.packing import pack_whole_tensors, tail_start

SHARD_ALIGN = 16  # elements: a shard starts on a 64-byte boundary in fp32 (the kernel's vector width)


@dataclass
class ParamSlot:
    index: int  # position in the engine's parameter list
    param: torch.nn.Parameter
    name: str
    group: int
    numel: int
    bucket: int = -1
    offset: int = 0  # element offset inside its bucket


@dataclass
class BucketLayout:
    index: int
    slots: list[ParamSlot] = field(default_factory=list)
    numel: int = 0  # elements of the parameters
    padded: int = 0  # elements of the flat buffer (a multiple of world_size * SHARD_ALIGN)
    on_device: bool = False  # a repartitioned tail bucket: grads + Adam state stay on the device
    flow_block: int | None = None  # the flowed block whose weights these are, else None

    def shard(self, rank: int, world: int) -> tuple[int, int]:
        n = self.padded // world
        return rank * n, (rank + 1) * n


def padded_numel(numel: int, world: int) -> int:
    unit = world * SHARD_ALIGN
    return max(unit, math.ceil(numel / unit) * unit)


def plan_buckets(slots: list[ParamSlot], order: list[int], bucket_size: int, device_tail_buckets: int,
                 world: int = 1, segment: Callable[[ParamSlot], Hashable] | None = None,
                 fixed: dict[Hashable, list[BucketLayout]] | None = None) -> list[BucketLayout]:
    """Pack `slots` (taken in `order`, a permutation of slot indices) into buckets, numbered in order.

    `segment(slot)` (weight flow: the flowed block, or None) keeps a segment's parameters in buckets of
    their own; a segment stands in the order where its last parameter arrives (when it completes).
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
            buckets.append(_layout(len(buckets), [slots[members[p]] for p in positions], world, sg))
    for lay in buckets:
        lay.on_device = False
    for lay in buckets[tail_start(len(buckets), device_tail_buckets):]:
        lay.on_device = True
    return buckets


def _layout(index: int, members: list[ParamSlot], world: int, flow_block: Hashable) -> BucketLayout:
    members = sorted(members, key=lambda s: s.group)  # stable: arrival order within a group
    lay = BucketLayout(index=index, flow_block=flow_block)  # type: ignore[arg-type]
    for s in members:
        s.bucket, s.offset = index, lay.numel
        lay.slots.append(s)
        lay.numel += s.numel
    lay.padded = padded_numel(lay.numel, world)
    return lay


def runs(slots: Sequence[ParamSlot], key: Callable[[ParamSlot], Hashable | None],
         lo: int = 0, hi: int | None = None) -> list[tuple[int, int, list[ParamSlot]]]:
    """Maximal contiguous (start, end, members) element ranges of a bucket with equal `key(slot)`,
    clipped to [lo, hi); slots whose key is None (e.g. no gradient this step) are left out."""
    out: list[tuple[int, int, list[ParamSlot]]] = []
    prev: object = object()
    for s in slots:
        start, end = max(s.offset, lo), s.offset + s.numel if hi is None else min(s.offset + s.numel, hi)
        k = key(s)
        if k is None or start >= end:
            prev = object()
            continue
        if out and k == prev and out[-1][1] == start:
            out[-1] = (out[-1][0], end, out[-1][2] + [s])
        else:
            out.append((start, end, [s]))
        prev = k
    return out
