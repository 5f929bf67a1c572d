"""Bucket layout: which parameters travel and step together, in gradient-arrival order.

Parameters are packed into buckets of about `bucket_size` elements in the order their gradients
become ready in backward (measured on the first step; until then, reverse registration order, which is
the usual arrival order). Inside a bucket, parameters are ordered by param group so a bucket's
elements form at most one contiguous run per group: the kernel takes one set of hyper-parameters per
call, and because it is split-invariant, several calls on sub-ranges give bit-identically the result of
one call on the whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
class BucketSpec:
    index: int
    slots: list[ParamSlot] = field(default_factory=list)
    numel: int = 0
    on_device: bool = False  # a repartitioned tail bucket: grads + Adam state stay on the device


def plan_buckets(slots: list[ParamSlot], order: list[int], bucket_size: int,
                 device_tail_buckets: int) -> list[BucketSpec]:
    """Pack `slots` (taken in `order`, a permutation of slot indices) into buckets.

    A parameter never straddles buckets; one larger than `bucket_size` gets a bucket of its own. The
    last `device_tail_buckets` buckets by arrival are marked `on_device`.
    """
    if sorted(order) != list(range(len(slots))):
        raise ValueError("order must be a permutation of the parameter indices")
    groups: list[list[ParamSlot]] = [[]]
    size = 0
    for i in order:
        s = slots[i]
        if groups[-1] and size + s.numel > bucket_size:
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += s.numel
    buckets = []
    for b, members in enumerate(g for g in groups if g):
        members = sorted(members, key=lambda s: s.group)  # stable: arrival order within a group
        spec = BucketSpec(index=b)
        for s in members:
            s.bucket, s.offset = b, spec.numel
            spec.slots.append(s)
            spec.numel += s.numel
        buckets.append(spec)
    for spec in buckets[max(0, len(buckets) - device_tail_buckets):]:
        spec.on_device = True
    return buckets


def runs(slots: list[ParamSlot], key) -> list[tuple[int, int, list[ParamSlot]]]:
    """Maximal contiguous (start, end, members) element ranges of a bucket with equal `key(slot)`;
    slots whose key is None (e.g. no gradient this step) are left out."""
    out: list[tuple[int, int, list[ParamSlot]]] = []
    prev = object()
    for s in slots:
        k = key(s)
        if k is None:
            prev = object()
            continue
        if out and k == prev and out[-1][1] == s.offset:
            start, _, members = out[-1]
            out[-1] = (start, s.offset + s.numel, members + [s])
        else:
            out.append((s.offset, s.offset + s.numel, [s]))
        prev = k
    return out
