"""Bucket layout on the model's real parameters: the engine's side of `superoffload.packing`.

Parameters are packed (`superoffload.packing.plan_buckets`, the one packer the planner shares) in the
order their gradients become ready in backward, measured on the first step. A bucket holds pieces
(`ParamPiece`): a parameter larger than `bucket_size` is split over consecutive buckets, so a piece's
`numel` and `offset` are its own, and `start` is where it begins in its parameter's flat elements.
Because the host kernel is split-invariant, the several calls a bucket's runs take give bit-identically
what one call on the whole would. Each rank owns one contiguous shard of every bucket: its gradients
after the reduce-scatter, its fp32 master and Adam moments on the host. With one rank the shard is the
whole (padded) bucket: the same code path.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from superoffload.packing import BucketLayout, Piece, pack_layouts, padded_numel, plan_buckets

__all__ = ["BucketLayout", "ParamPiece", "ParamSlot", "pack_layouts", "padded_numel", "plan_buckets", "runs"]


@dataclass(eq=False)
class ParamSlot:
    index: int  # position in the engine's parameter list
    param: torch.nn.Parameter
    name: str
    group: int
    numel: int
    shape: torch.Size = torch.Size()  # the parameter's shape (weight flow may swap its data for a placeholder)
    pieces: list[ParamPiece] = field(default_factory=list)  # in element order, once laid out

    @property
    def buckets(self) -> list[int]:
        """The buckets holding this parameter (one, or consecutive ones for a split parameter)."""
        return [pc.bucket for pc in self.pieces]


class ParamPiece(Piece):
    """A piece of a parameter in a bucket; reads as its parameter where a bucket needs that."""

    tensor: ParamSlot

    @property
    def index(self) -> int:
        return self.tensor.index

    @property
    def param(self) -> torch.nn.Parameter:
        return self.tensor.param

    @property
    def name(self) -> str:
        return self.tensor.name

    def grad_view(self) -> torch.Tensor:
        """This piece's elements of the parameter's gradient, flat."""
        return self.tensor.param.grad.reshape(-1)[self.start: self.start + self.numel]


def runs(slots: Sequence[ParamPiece], key: Callable[[ParamPiece], Hashable | None],
         lo: int = 0, hi: int | None = None) -> list[tuple[int, int, list[ParamPiece]]]:
    """Maximal contiguous (start, end, members) element ranges of a bucket with equal `key(piece)`,
    clipped to [lo, hi); pieces whose key is None (e.g. no gradient this step) are left out."""
    out: list[tuple[int, int, list[ParamPiece]]] = []
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
