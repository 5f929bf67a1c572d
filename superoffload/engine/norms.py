"""Each bucket's gradient norm, and the step's Σ norm² from them.

At launch a bucket costs one reduction per norm part: `kernels.grad_norm`, the L2 norm of the reduced
gradient (pads excluded) accumulated in fp64, written into this step's per-bucket fp64 vector. Once per
step the vector's squares are summed (`sum_sq`: one dot). A non-finite gradient element makes its
bucket's norm non-finite and so the sum: squares of finite fp32/bf16/fp16 values cannot overflow fp64,
so "the sum is finite" is the step's finite flag, with no count to reduce.

fp64 accumulation keeps the global norm within an fp64 rounding of exact whatever the bucket layout, so
bucket size, tail buckets, weight flow and a resume give the same clip factor (the engine's policies stay
bit-identical under clipping). Against `torch.nn.utils.clip_grad_norm_` (per-tensor norms in the
gradient's dtype, then the norm of their vector) the engine's norm is the more exact one and can differ in
the last bits (docs/engine.md, "The gradient norm"). Speculation and validate-first read the same vector.

Sharded, a rank computes its own shard's norm per bucket; the step's total is its sum over buckets on
each rank, then over ranks (one fp64 all-reduce). Replicated (engine config `replicate`), every rank
holds every bucket whole; it computes the norm of each rank's would-be shard separately and sums them
the same way, buckets first, then ranks in order, so the clip factor and the reported norm are the
sharded run's bit for bit (at two ranks, where a sum of two is the same in either order; with more ranks
the all-reduce's order is the backend's) and need no collective.
"""

from __future__ import annotations

import torch

from superoffload.device import Device
from superoffload.packing import BucketLayout


class BucketNorms:
    def __init__(self, device: Device, buckets: int, parts: int) -> None:
        """`parts`: shards per bucket whose norms this rank computes (1 when sharded or on one rank)."""
        self.parts, self.buckets = parts, buckets
        # bucket-major: a bucket's parts are adjacent
        self.values = device.zeros(buckets * parts, torch.float64, "staging")
        # the 0-dim output of each norm, made once (a view per launch would be Python work per bucket)
        self.slot = list(self.values.unbind())

    def part_views(self, layout: BucketLayout, reduced: torch.Tensor, offset: int = 0) -> list[torch.Tensor]:
        """What each norm part of a bucket reads in `reduced` (which starts at flat element `offset`):
        this rank's shard (parts == 1) or every rank's would-be shard, pads excluded."""
        if self.parts == 1:
            return [reduced[: max(0, min(layout.numel - offset, reduced.numel()))]]
        views = []
        for r in range(self.parts):
            lo, hi = layout.shard(r, self.parts)
            views.append(reduced[lo - offset: max(lo, min(hi, layout.numel)) - offset])
        return views

    def compute(self, kernels, index: int, views: list[torch.Tensor]) -> None:
        """Bucket `index`'s norm part(s) from `part_views`' views of its reduced gradient."""
        at = index * self.parts
        for r, v in enumerate(views):
            kernels.grad_norm(v, self.slot[at + r])

    def sum_sq(self) -> torch.Tensor:
        """[Σ norms²] (fp64) over this rank's parts (1 element; not finite when a gradient is not);
        summing it over the ranks is still to do when sharded."""
        if self.parts == 1:
            return torch.dot(self.values, self.values).reshape(1)
        total = None
        for r in range(self.parts):  # each rank's vector contiguous: the same reduction a rank's own gets
            v = self.values.view(self.buckets, self.parts)[:, r].contiguous()
            s = torch.dot(v, v)
            total = s if total is None else total + s
        return total.reshape(1)
