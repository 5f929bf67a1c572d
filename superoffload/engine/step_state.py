"""The flags of the optimizer step in progress, in one record the engine resets in one place.

A step's life: the backward that completes an accumulation window (`boundary`) launches buckets in
order (`next_launch`; on the measuring step `arrival` records the gradient order instead), speculating
or not (`speculating`); when every bucket is launched `backward_done` lets step() validate, using the
global norm reduced once (`norm`) and any clip threshold asked for this step (`step_clip`). An exception
in backward leaves `needs_zero_grad` until zero_grad() discards the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepState:
    boundary: bool = False  # inside the backward that completes an accumulation window
    speculating: bool = False  # host steps of this step run before validation
    backward_done: bool = False  # every bucket is launched: step() may validate
    needs_zero_grad: bool = False  # a backward raised: zero_grad() must discard the window first
    arrival: list[int] = field(default_factory=list)  # the measuring step: parameters in gradient order
    next_launch: int = 0  # the next bucket to launch, in bucket order
    norm: tuple[float, int] | None = None  # this step's (sum of norm^2, non-finite count), once reduced
    step_clip: float | None = None  # a clip threshold asked for this step (clip_grad_norm_)
    partial: bool = False  # a bucket launched with parameters that had no gradient
    inputs: Any = None  # the speculative step's (scale, hyper-parameters), read once per step

    def reset(self) -> None:
        """A new step (or the end of one that is discarded): everything but `needs_zero_grad`."""
        keep = self.needs_zero_grad
        self.__init__()  # type: ignore[misc]
        self.needs_zero_grad = keep


@dataclass
class InFlight:
    """A launched bucket whose reduce-scatter is still running (the CPU-only backend leaves it in flight
    while backward goes on): what completing the launch needs."""

    bucket: Any  # engine.bucket.Bucket
    work: Any  # the collective's handle
    target: Any  # engine.launch.Target: where the gradient was written and where its reduced part lands
    slot: int | None  # the staging slot the flat gradient was written to (read until the work is done)
    prev: torch.Tensor | None  # a carried launch's earlier shard, added once reduced
