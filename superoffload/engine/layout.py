"""Bucket layout on the model's real parameters: the engine's side of `superoffload.packing`.

Parameters are packed (`superoffload.packing.plan_buckets`, the one packer the planner shares) in the
order their gradients become ready in backward, measured on the first step. Because the host kernel is
split-invariant, the several calls a bucket's runs take give bit-identically what one call on the whole
would. Each rank owns one contiguous shard of every bucket: its gradients after the reduce-scatter, its
fp32 master and Adam moments on the host. With one rank the shard is the whole (padded) bucket: the same
code path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from superoffload.packing import BucketLayout, layout_bucket, padded_numel, plan_buckets

__all__ = ["BucketLayout", "ParamSlot", "layout_bucket", "padded_numel", "plan_buckets", "runs"]


@dataclass
class ParamSlot:
    index: int  # position in the engine's parameter list
    param: torch.nn.Parameter
    name: str
    group: int
    numel: int
    bucket: int = -1
    offset: int = 0  # element offset inside its bucket
    shape: torch.Size = torch.Size()  # the parameter's shape (weight flow may swap its data for a placeholder)


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
