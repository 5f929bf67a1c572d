"""A bucket at run time: its buffers, its per-step state, and the host tasks that act on it.

Buffers are allocated once and reused every step:
- device side: `dev_grad`, the flat gradient (fp32 when casting on the device, else the model dtype)
  and a pinned fp64 scalar receiving the bucket's gradient norm;
- host side (host buckets): fp32 `master`, `exp_avg`, `exp_avg_sq` (pinned with CUDA), the `landing`
  gradient buffer (aliases `dev_grad` when the device is the host) and the `upload` buffer the kernel
  writes the new low-precision (or fp32) weights into;
- device side (tail buckets): fp32 `master`, `exp_avg`, `exp_avg_sq` in HBM;
- rollback_mode full_copy (host buckets): `spare`, a second fp32 master/m/v set. The speculative step
  writes the new state there (out of place, one pass); committing swaps the sets, rolling back keeps
  the current one, so neither costs a pass over memory.

Host tasks (run on the worker, in order) are `speculate` and `finalize`; see engine.py for when.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from superoffload.engine.layout import BucketSpec, ParamSlot, runs

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine


@dataclass(frozen=True)
class HyperParams:
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


class Bucket:
    def __init__(self, spec: BucketSpec, eng: SuperOffloadEngine) -> None:
        self.spec = spec
        self.eng = eng
        dev, n = eng.device, spec.numel
        cfg = eng.config
        lowp = eng.dtype != torch.float32
        self.on_device = spec.on_device
        grad_dtype = eng.dtype if (lowp and cfg.grad_cast == "host" and not self.on_device) else torch.float32
        self.dev_grad = torch.zeros(n, dtype=grad_dtype, device=dev.torch_device)
        self.norm_host = dev.empty_host(1, torch.float64)
        self.d2h_event = dev.new_event()
        self.upload_event = dev.new_event()
        # set when no queued task will still write this bucket's weights: the next forward waits on it.
        # A counter, not a bare event: a speculative task finishing late must not mark a redo that was
        # queued after it as done.
        self.uploaded = threading.Event()
        self.uploaded.set()
        self._uploads_pending = 0
        self.idle = threading.Event()
        self.idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        state_dev = dev.torch_device if self.on_device else torch.device("cpu")

        def state() -> torch.Tensor:
            if self.on_device:
                return torch.zeros(n, dtype=torch.float32, device=state_dev)
            t = dev.empty_host(n, torch.float32)
            t.zero_()
            return t

        self.master, self.exp_avg, self.exp_avg_sq = state(), state(), state()
        self.max_exp_avg_sq = state() if cfg.optimizer.amsgrad else None
        if self.on_device:
            self.landing = self.upload = None
            self.aliased = set()
        else:
            self.landing = self.dev_grad if dev.shares_host_memory else dev.empty_host(n, grad_dtype)
            up_dtype = eng.dtype if (lowp and cfg.param_cast == "host") else torch.float32
            self.upload = dev.empty_host(n, up_dtype)
            self._alias_params(dev.shares_host_memory and up_dtype == eng.dtype)
        self.spare: list[torch.Tensor] | None = None
        if cfg.rollback_mode == "full_copy" and not self.on_device:
            self.spare = [state() for _ in range(4 if cfg.optimizer.amsgrad else 3)]
        # per-step state
        self.present: list[bool] = [False] * len(spec.slots)
        self._present_idx: set[int] = set()
        self.launched = False
        self.spec_queued = False
        self.spec_scale = 1.0
        self.spec_hps: dict[int, HyperParams] = {}
        self.spec_state = "none"  # set by the worker: "none" | "speculated" | "nonfinite"

    def _alias_params(self, possible: bool) -> None:
        """When the device is the host and the upload copy has the weights' dtype, make each parameter a
        view of its slice of `upload`: the kernel's output then *is* the new weight and the "H2D" copy
        disappears. Weight-flow parameters keep their own storage (it is released between uses)."""
        self.aliased: set[int] = set()
        if not possible:
            return
        flow = self.eng.flow
        for s in self.slots:
            if flow is not None and flow.owns(s.param):
                continue
            view = self.upload[s.offset: s.offset + s.numel]
            view.copy_(s.param.data.reshape(-1))
            s.param.data = view.view(s.param.shape)
            self.aliased.add(s.index)

    # --- sizes --------------------------------------------------------------------------------------
    @property
    def slots(self) -> list[ParamSlot]:
        return self.spec.slots

    def host_bytes(self) -> int:
        tensors = [self.master, self.exp_avg, self.exp_avg_sq, self.max_exp_avg_sq, self.upload, *(self.spare or [])]
        if self.landing is not None and self.landing is not self.dev_grad:
            tensors.append(self.landing)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None and not t.is_cuda)

    def device_bytes(self) -> int:
        tensors = [self.dev_grad] + ([self.master, self.exp_avg, self.exp_avg_sq, self.max_exp_avg_sq]
                                     if self.on_device else [])
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    # --- task bookkeeping ---------------------------------------------------------------------------
    def expect_upload(self) -> None:
        """Training thread: a task about to be queued will rewrite this bucket's device weights."""
        with self._lock:
            self._uploads_pending += 1
            self.uploaded.clear()

    def _upload_settled(self) -> None:
        with self._lock:
            self._uploads_pending -= 1
            if self._uploads_pending == 0:
                self.uploaded.set()

    def submit(self, fn, label: str) -> None:
        with self._lock:
            self._pending += 1
            self.idle.clear()

        def run() -> None:
            try:
                fn()
            finally:
                with self._lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self.idle.set()

        self.eng.worker.submit(run, f"bucket {self.spec.index}: {label}")

    # --- the kernel over this bucket's present parameters -------------------------------------------
    def _state(self) -> list[torch.Tensor]:
        return [t for t in (self.master, self.exp_avg, self.exp_avg_sq, self.max_exp_avg_sq) if t is not None]

    def _swap_state(self) -> None:
        """full_copy commit: the spare set, which the speculative step wrote, becomes the state."""
        assert self.spare is not None
        new, self.spare = self.spare, self._state()
        self.master, self.exp_avg, self.exp_avg_sq = new[:3]
        self.max_exp_avg_sq = new[3] if len(new) > 3 else None

    def _run_kernel(self, scale: float, hps: dict[int, HyperParams], steps: dict[int, int], *, commit: bool,
                    write_upload: bool, out_of_place: bool = False) -> None:
        """out_of_place (full_copy speculation): the new state goes to `spare`, the state is not written."""
        from superoffload.engine import host_adam

        eng = self.eng
        if out_of_place:
            assert self.spare is not None and not commit
            # parameters without a gradient are not stepped; the spare set must still hold their state
            for s in self.slots:
                if s.index not in self._present_idx:
                    for dst, src in zip(self.spare, self._state(), strict=True):
                        dst[s.offset: s.offset + s.numel].copy_(src[s.offset: s.offset + s.numel])
        lowp_up = self.upload is not None and self.upload.dtype != torch.float32

        def key(s: ParamSlot) -> tuple[int, int] | None:
            # one kernel call per run of parameters sharing a param group and a step count; parameters
            # without a gradient this step are not stepped at all (as torch.optim does)
            return (s.group, steps[s.index]) if s.index in self._present_idx else None

        for start, end, members in runs(self.slots, key=key):
            hp = hps[members[0].group]
            sl = slice(start, end)
            host_adam.adam_step(
                eng.config.host_optimizer, self.master[sl], self.landing[sl], self.exp_avg[sl], self.exp_avg_sq[sl],
                step=steps[members[0].index] + 1, lr=hp.lr, beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps,
                weight_decay=hp.weight_decay, adamw=eng.config.optimizer.adamw,
                bias_correction=eng.config.optimizer.bias_correction, grad_scale=scale,
                max_exp_avg_sq=None if self.max_exp_avg_sq is None else self.max_exp_avg_sq[sl],
                commit=commit,
                param_out=self.upload[sl] if write_upload and not lowp_up else None,
                lowp_out=self.upload[sl] if write_upload and lowp_up else None,
                state_out=[t[sl] for t in self.spare] if out_of_place else None,
                threads=eng.config.host_threads)

    def steps_snapshot(self) -> dict[int, int]:
        """Step counts of this bucket's parameters, taken in the training thread when a task is queued
        (the worker runs later, after the training thread may have advanced the counts)."""
        return {s.index: self.eng.steps[s.index] for s in self.slots}

    def mark_present(self) -> None:
        self.present = [s.param.grad is not None for s in self.slots]
        self._present_idx = {s.index for s, p in zip(self.slots, self.present, strict=True) if p}

    def present_slots(self) -> list[ParamSlot]:
        return [s for s, p in zip(self.slots, self.present, strict=True) if p]

    # --- host tasks (run on the worker thread) ------------------------------------------------------
    def _wait_upload_buffer_free(self) -> None:
        # a previous non-blocking H2D may still be reading `upload`; don't overwrite it under the DMA
        self.upload_event.synchronize()

    def _upload(self, slots: list[ParamSlot]) -> None:
        eng = self.eng
        flow = eng.flow
        t0 = time.perf_counter()
        h2d = 0
        with eng.device.stream(eng.upload_stream):
            # the compute stream may still have queued kernels that read these weights (a Linear's
            # grad-input uses W after W's grad is accumulated); the bucket's D2H event was recorded after
            # the side stream caught up with them, so writing after it cannot race those reads
            eng.upload_stream.wait_event(self.d2h_event)
            for s in slots:
                src = self.upload[s.offset: s.offset + s.numel].view(s.param.shape)
                if s.index in self.aliased:
                    continue  # the parameter is a view of `upload`: already written
                if flow is not None and flow.owns(s.param):
                    # a flowed weight's device storage may be released now: its home is the host store,
                    # which the block's next fetch reads (after waiting for this bucket's `uploaded`)
                    flow.write_host(s.param, src)
                    continue
                s.param.data.copy_(src, non_blocking=True)
                h2d += s.numel
            self.upload_event.record(eng.upload_stream)
        eng.counters.add(bytes_h2d=h2d * self.upload.element_size(), upload_s=time.perf_counter() - t0)

    def speculate(self, scale: float, hps: dict[int, HyperParams], steps: dict[int, int]) -> None:
        """Step this bucket before the global norm is known (clip factor assumed 1)."""
        eng = self.eng
        self.d2h_event.synchronize()
        if not math.isfinite(float(self.norm_host[0])):
            self.spec_state = "nonfinite"  # never step a bucket whose own gradient is not finite
            self._upload_settled()
            return
        t0 = time.perf_counter()
        self._wait_upload_buffer_free()
        # deferred: only the upload copy is written; full_copy: the new state goes to the spare set
        self._run_kernel(scale, hps, steps, commit=False, write_upload=True, out_of_place=self.spare is not None)
        eng.counters.add(host_step_s=time.perf_counter() - t0)
        self._upload(self.present_slots())
        self.spec_state = "speculated"
        self._upload_settled()

    def finalize(self, action: str, scale: float, hps: dict[int, HyperParams], steps: dict[int, int],
                 counted: bool) -> None:
        """After validation: "commit" with the final scale, or "skip" the step. Exact either way.
        `counted`: the training thread called expect_upload() for this task."""
        try:
            self._finalize(action, scale, hps, steps)
        finally:
            if counted:
                self._upload_settled()

    def _finalize(self, action: str, scale: float, hps: dict[int, HyperParams], steps: dict[int, int]) -> None:
        eng = self.eng
        self.d2h_event.synchronize()
        speculated = self.spec_state == "speculated"
        self.spec_state = "none"
        # in both rollback modes the speculative step left master/m/v untouched: nothing to restore
        if action == "skip":
            if speculated:  # put the device weights back to what the master still holds
                t0 = time.perf_counter()
                self._wait_upload_buffer_free()
                self.upload.copy_(self.master)  # torch's cast rounds to nearest even, as the kernel does
                self._upload(self.present_slots())
                eng.counters.add(rollback_s=time.perf_counter() - t0)
            return
        if speculated and scale == self.spec_scale and hps == self.spec_hps:
            t0 = time.perf_counter()
            if self.spare is None:  # deferred commit: same inputs, same arithmetic, now in place
                self._run_kernel(scale, hps, steps, commit=True, write_upload=False)
            else:
                self._swap_state()
            eng.counters.add(commit_s=time.perf_counter() - t0)
            return
        t0 = time.perf_counter()
        self._wait_upload_buffer_free()
        self._run_kernel(scale, hps, steps, commit=True, write_upload=True)
        self._upload(self.present_slots())
        eng.counters.add(**{("rollback_s" if speculated else "host_step_s"): time.perf_counter() - t0})
