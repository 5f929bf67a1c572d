"""Each bucket's squared gradient norm, and the step's [Σ norm², non-finite count] from them.

Sharded, a rank computes its own shard's norm per bucket; the step's total is the sum over buckets on
each rank, then over ranks (one fp64 all-reduce). Replicated (engine config `replicate`), every rank
holds every bucket whole; it computes the norm of each rank's would-be shard separately and sums them
the same way, buckets first, then ranks in order, so the clip factor, the reported norm and the
non-finite count are the sharded run's bit for bit (at two ranks, where a sum of two is the same in
either order; with more ranks the all-reduce's order is the backend's) and need no collective.
"""

from __future__ import annotations

import torch

from superoffload.device import Device
from superoffload.packing import BucketLayout


class BucketNorms:
    def __init__(self, device: Device, buckets: int, parts: int) -> None:
        """`parts`: shards per bucket whose norms this rank computes (1 when sharded or on one rank)."""
        self.parts, self.buckets = parts, buckets
        # bucket-major: a bucket's parts are adjacent, so reading them (of_bucket, on a copy stream) touches
        # no other bucket's norms while those are being written
        self.values = device.zeros(buckets * parts, torch.float64, "staging")

    def compute(self, kernels, index: int, layout: BucketLayout, reduced: torch.Tensor) -> None:
        """Bucket `index`'s norm(s) from its reduced gradient (this rank's shard, or the whole bucket)."""
        if self.parts == 1:
            kernels.grad_norm_sq(reduced, self.values[index: index + 1])
            return
        for r in range(self.parts):
            lo, hi = layout.shard(r, self.parts)
            at = index * self.parts + r
            kernels.grad_norm_sq(reduced[lo:hi], self.values[at: at + 1])

    def of_bucket(self, index: int) -> torch.Tensor:
        """A one-element tensor that is finite exactly when bucket `index`'s gradient (here) is."""
        if self.parts == 1:
            return self.values[index: index + 1]
        return self.values[index * self.parts: (index + 1) * self.parts].sum().reshape(1)

    def stats(self) -> torch.Tensor:
        """[Σ finite norms², number of non-finite parts] (fp64) over this rank's parts; summing it over the
        ranks is still to do when sharded."""
        total = count = None
        rows = self.values.view(self.buckets, self.parts).t().contiguous() if self.parts > 1 else [self.values]
        for row in rows:  # contiguous: the same reduction a rank's own vector gets
            finite = torch.isfinite(row)
            s = torch.where(finite, row, torch.zeros_like(row)).sum()
            c = (~finite).sum().to(torch.float64)
            total, count = (s, c) if total is None else (total + s, count + c)
        return torch.stack([total, count])
