"""The step's decision: commit the speculation, redo with the clip factor, or skip (non-finite gradients).

One reduction of the step's Σ norm² (`norms.py`; one fp64 all-reduce across ranks when sharded), the
step's one host synchronization, then the same decision on every rank for every host bucket, queued on
the worker in the order the next forward needs the weights; the device tail steps on the compute stream
(`tail.py`). Also here: the loss scale's update, the rollback-rate window that turns speculation off
when it keeps failing, the skip counters and the error a run of skipped steps raises.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

from superoffload.engine.bucket import Bucket, Finalize, HyperParams
from superoffload.engine.context import EngineContext
from superoffload.engine.launch import Launcher
from superoffload.engine.loss_scale import DynamicLossScale
from superoffload.engine.step_state import StepState
from superoffload.engine.tail import TailStep


def _commit_passes(host: list[Bucket]) -> None:
    """The deferred commit pass of every host bucket, in bucket order, each released when done (and every
    one released if a pass fails: the failure is the worker's to report)."""
    i = 0
    try:
        for i, b in enumerate(host):  # noqa: B007 - `i` is read in finally
            try:
                b.commit_state()
            finally:
                b.release()
    finally:
        for b in host[i + 1:]:
            b.release()


class Validator:
    def __init__(self, ctx: EngineContext, launcher: Launcher, step_state: StepState, loss_scale: DynamicLossScale,
                 hyper_params: Callable[[], dict[int, HyperParams]]) -> None:
        self.ctx, self.launcher, self.step_state, self.loss_scale = ctx, launcher, step_state, loss_scale
        self.hyper_params = hyper_params
        self.tail: TailStep | None = None
        self.spec_counts: collections.Counter[str] = collections.Counter()
        self.recent_rollbacks: collections.deque[bool] = collections.deque(
            maxlen=ctx.config.speculation_policy.window)
        self.last_grad_norm = float("nan")  # the global gradient norm of the last step (after unscaling)
        self.last_clip_coef = 1.0
        self.skips_in_row = 0
        self.nonfinite_error = ""

    def reconfigured(self) -> None:
        self.recent_rollbacks = collections.deque(maxlen=self.ctx.config.speculation_policy.window)

    def unscale(self) -> float:
        """Factor from the reduced gradient to the true one: 1/loss_scale, and 1/world for a mean."""
        mean = self.ctx.comm.world if self.ctx.config.gradient_reduction == "mean" else 1
        return 1.0 / (self.loss_scale.scale * mean)

    def spec_inputs(self) -> tuple[float, dict[int, HyperParams]]:
        """The speculative step's gradient factor (the clip factor assumed 1) and hyper-parameters: read
        once per step (the launches of a step share them)."""
        st = self.step_state
        if st.inputs is None:
            st.inputs = (self.unscale(), self.hyper_params())
        return st.inputs

    def speculation_allowed(self) -> bool:
        cfg = self.ctx.config
        if not cfg.speculation:
            return False
        recent = self.recent_rollbacks
        return not recent or sum(recent) / len(recent) <= cfg.speculation_policy.max_rollback_rate

    # --- the global norm -----------------------------------------------------------------------------
    def _global_norm_sq(self) -> float:
        """Σ over buckets and ranks of the squared norms (not finite when a gradient is not): one
        all-reduce in fp64 on the device, then the step's one host synchronization."""
        dev, launcher = self.ctx.device, self.launcher
        launcher.complete()  # already done at the end of backward; a norm is never read half-reduced
        launcher.side_waited()
        total = launcher.norms.sum_sq()
        if self.ctx.comm.sharded:  # replicated, every rank summed every rank's part (norms.py)
            self.ctx.comm.all_reduce_sum(total)
        with dev.allow_sync():
            return float(dev.to_host(total)[0])

    def reduced_norm_sq(self) -> float:
        """This step's global Σ norm², reduced once: asked early by `step_grad_norm` (a clip_grad_norm_
        before step()), then used by validation."""
        st = self.step_state
        if st.norm is None:
            st.norm = self._global_norm_sq()
        return st.norm

    def step_grad_norm(self, clip: float | None = None) -> float:
        """This step's global gradient norm (after unscaling; nan when not finite), before step() applies
        it. `clip` > 0 clips this step at that threshold too (the smaller of it and `grad_clip` holds)."""
        total2 = self.reduced_norm_sq()
        if clip is not None and clip > 0:
            asked = self.step_state.step_clip
            self.step_state.step_clip = clip if asked is None else min(asked, clip)
        return math.sqrt(total2) * self.unscale() if math.isfinite(total2) else float("nan")

    # --- the decision --------------------------------------------------------------------------------
    def validate_and_apply(self, buckets: list[Bucket], steps: list[int], global_step: int) -> bool:
        """Decide and queue every bucket's finalize; step the device tail; update steps and the loss
        scale. Returns whether the step was applied."""
        t0 = time.perf_counter()
        cfg, st = self.ctx.config, self.step_state
        total2 = self.reduced_norm_sq()
        st.norm = None
        clip = cfg.grad_clip
        if st.step_clip is not None:
            clip = min(clip, st.step_clip) if clip > 0 else st.step_clip
            st.step_clip = None
        finite = math.isfinite(total2)
        unscale = self.unscale()
        self.last_grad_norm = math.sqrt(total2) * unscale if finite else float("nan")
        coef = 1.0
        if finite and clip > 0:
            coef = min(clip / (self.last_grad_norm + 1e-6), 1.0)  # torch.nn.utils.clip_grad_norm_'s epsilon
        self.last_clip_coef = coef
        scale = unscale * coef
        skip = not finite and cfg.skip_nonfinite
        hps = self.hyper_params()
        self.ctx.counters.add(validate_wait_s=time.perf_counter() - t0)
        host, speculated = [], False
        for b in buckets:
            if b.host is not None:
                host.append(b)
                speculated = speculated or b.spec.queued
        needs_rollback = skip or coef != 1.0
        # two phases on the worker: first every bucket's weights, in the order the next forward needs them
        # (the last-arriving buckets, i.e. the first layers, first); then the deferred commit passes in the
        # order the next backward needs their landing buffers back (the first-arriving bucket first), in
        # one task (a task per bucket was Python work per bucket on the training thread)
        for b in reversed(host):
            # a speculation stands only if it used the final inputs and the gradients were finite (with
            # skip_nonfinite off a non-finite step is redone, not committed)
            spec = b.spec
            kind = (Finalize.NOTHING if skip else Finalize.COMMIT if (
                spec.queued and finite and spec.scale == scale and spec.hps == hps) else Finalize.REDO)
            if kind is not Finalize.NOTHING:
                b.expect_upload()
            snap, queued = b.steps_snapshot(steps), spec.queued
            b.submit(lambda b=b, kind=kind, snap=snap, q=queued: b.finalize(kind, scale, hps, snap, q), kind.value)
        if host:
            for b in host:
                b.hold()
            self.ctx.worker.submit(lambda: _commit_passes(host), "commit passes")
        if not skip:
            every = not st.partial
            if self.tail is not None:
                self.tail.step(scale, hps, steps, every)
            if every:
                for i in range(len(steps)):
                    steps[i] += 1
            else:
                for i in set().union(*(b.present_indices for b in buckets)):  # once per split parameter
                    steps[i] += 1
        self._note_nonfinite(skip, global_step)
        self.loss_scale.update(found_nonfinite=not finite)
        self.recent_rollbacks.append(needs_rollback)
        self._count(speculated, skip, coef != 1.0, needs_rollback)
        return not skip

    def _note_nonfinite(self, skipped: bool, global_step: int) -> None:
        """Skipped steps are loud when they go on: NonFiniteError after `max_consecutive_skips` in a row, or
        at once for an fp16 overflow with the loss scale already at its minimum (raised by step())."""
        self.skips_in_row = self.skips_in_row + 1 if skipped else 0
        cfg, ls = self.ctx.config, self.loss_scale
        limit = cfg.max_consecutive_skips
        if skipped and ls.enabled and cfg.loss_scale.raise_at_min_scale and ls.scale <= cfg.loss_scale.min_scale:
            self.nonfinite_error = (f"step {global_step + 1}: fp16 gradients overflow with the loss scale at "
                                    f"its minimum ({ls.scale:g}): the weights or the data hold NaN/Inf, or the "
                                    f"learning rate is too high (set loss_scale.raise_at_min_scale: false to keep "
                                    f"skipping)")
        elif limit and self.skips_in_row >= limit:
            self.nonfinite_error = (f"{self.skips_in_row} consecutive optimizer steps (to step "
                                    f"{global_step + 1}) had non-finite gradients (NaN/Inf) and were skipped: "
                                    f"the weights are unchanged since; the data or the weights hold NaN/Inf, or "
                                    f"the learning rate is too high (max_consecutive_skips: {limit}; 0 never "
                                    f"raises)")

    def take_error(self) -> str:
        msg, self.nonfinite_error = self.nonfinite_error, ""
        return msg

    def _count(self, speculated: bool, skip: bool, clipped: bool, needs_rollback: bool) -> None:
        c = self.spec_counts
        c["steps"] += 1
        c["skipped"] += int(skip)
        c["clipped"] += int(clipped and not skip)
        if speculated:
            c["speculated"] += 1
            c["rolled_back"] += int(needs_rollback)
            c["committed"] += int(not needs_rollback)
        else:
            c["validate_first"] += 1

    def recent_rate(self) -> float:
        window = self.recent_rollbacks
        return sum(window) / len(window) if window else 0.0
