"""SuperOffloadEngine: the life of a bucket (DESIGN.md), one code path for CUDA and CPU-only.

Per optimizer step:
1. gradient ready: a post-accumulate-grad hook per parameter; a bucket whose parameters are all ready
   is launched at once (params with no gradient are flushed at the end of backward);
2. device side, on a side stream: flatten (cast per policy), the bucket's gradient norm in fp64 (its
   finiteness is the bucket's finite flag), D2H into the landing buffer, an event;
3. speculative host step: the worker waits for the event and runs GraceAdam before the global norm
   is known; deferred-commit mode writes only the upload copy, full-copy mode writes the new state
   into a second buffer set (commit = swap);
4. device tail buckets keep grads and Adam state on the device and step there after validation;
5. validation in `step()`: the global norm from the per-bucket norms, reduced in bucket order (so it
   is deterministic), then commit, redo with the clip factor, or skip; all exact;
6. parameter return: each bucket's H2D on an upload stream as soon as its step is final; the next
   forward waits per module on its buckets' events, never on a global barrier;
7. weight flow (`flow_layers`, weight_flow.py): flowed blocks keep their weights in a host store that
   step 6 writes instead of the device, fetched before each use and released after.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from typing import Any

import torch
import torch.nn as nn

from superoffload.device import get_device
from superoffload.engine.bucket import Bucket, HyperParams
from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.layout import ParamSlot, plan_buckets, runs
from superoffload.engine.loss_scale import DynamicLossScale
from superoffload.engine.optimizer import OffloadOptimizer
from superoffload.engine.weight_flow import WeightFlow
from superoffload.engine.worker import HostWorker

log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Counters:
    """Thread-safe accumulators (the worker and the training thread both add)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: collections.Counter[str] = collections.Counter()

    def add(self, **kw: float) -> None:
        with self._lock:
            self.values.update(kw)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.values)


def _param_groups(model: nn.Module, cfg: SuperOffloadConfig,
                  groups: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    o = cfg.optimizer
    defaults = {"lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    if groups is None:
        params = [p for p in model.parameters() if p.requires_grad]
        if cfg.weight_decay_split:
            decay = [p for p in params if p.dim() >= 2]
            groups = [{"params": decay}, {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        else:
            groups = [{"params": params}]
    out, seen = [], set()
    for g in groups:
        ps = [p for p in g["params"] if id(p) not in seen]
        seen.update(id(p) for p in ps)
        unknown = set(g) - {"params", *defaults}
        if unknown:
            raise ConfigError(f"param group keys {sorted(unknown)} are not supported; use {sorted(defaults)}")
        if ps:
            out.append({**defaults, **{k: v for k, v in g.items() if k != "params"}, "params": ps})
    if not out:
        raise ConfigError("the model has no trainable parameters")
    return out


class SuperOffloadEngine:
    def __init__(self, model: nn.Module, config: SuperOffloadConfig | dict | str | None = None,
                 param_groups: list[dict[str, Any]] | None = None) -> None:
        cfg = SuperOffloadConfig.from_any(config)
        self.config = cfg
        self.device = get_device(cfg.device, cfg.hbm_budget_bytes)
        self.dtype = DTYPES[cfg.precision]
        groups = _param_groups(model, cfg, param_groups)
        names = {id(p): n for n, p in model.named_parameters()}
        self.slots: list[ParamSlot] = []
        for gi, g in enumerate(groups):
            for p in g["params"]:
                if not p.is_floating_point():
                    raise ConfigError(f"parameter {names.get(id(p))} is not floating point")
                self.slots.append(ParamSlot(index=len(self.slots), param=p,
                                            name=names.get(id(p), f"param{len(self.slots)}"),
                                            group=gi, numel=p.numel()))
        self._slot_of = {id(s.param): s.index for s in self.slots}
        # fp32 masters come from the weights as given, before the device copy is cast to `precision`
        masters = {s.index: s.param.detach().to("cpu", torch.float32).reshape(-1).clone() for s in self.slots}
        self.model = model.to(device=self.device.torch_device, dtype=self.dtype)
        self.optimizer = OffloadOptimizer(self, groups)
        self.steps = [0] * len(self.slots)
        self.loss_scale = DynamicLossScale(cfg.loss_scale, enabled=cfg.precision == "fp16")
        self.worker = HostWorker()
        self.side_stream = self.device.new_stream()
        self.upload_stream = self.device.new_stream()
        self.counters = Counters()
        self.spec_counts: collections.Counter[str] = collections.Counter()
        self._recent_rollbacks: collections.deque[bool] = collections.deque(maxlen=cfg.speculation_policy.window)
        self.micro = 0
        self.global_step = 0
        self.layout_measured = False
        self._boundary = False
        self._speculating = False
        self._backward_done = False
        self._arrival: list[int] = []
        self._ready: list[int] = []
        self.buckets: list[Bucket] = []
        # validated before the layout (which must keep flowed weights out of device tail buckets); it
        # releases device storage only in start(), after every check has passed
        self.flow: WeightFlow | None = WeightFlow(self) if cfg.flow_layers else None
        self._build_layout(list(reversed(range(len(self.slots)))),
                           {i: (m, None, None, None) for i, m in masters.items()})
        self._hooks = [s.param.register_post_accumulate_grad_hook(self._on_grad) for s in self.slots]
        self._hooks += [m.register_forward_pre_hook(self._pre_forward) for m in self.model.modules()
                        if any(id(p) in self._slot_of for p in m.parameters(recurse=False))]
        if self.flow is not None:
            self.flow.start()

    # ============================================================================================
    # layout
    # ============================================================================================
    def _build_layout(self, order: list[int], state: dict[int, tuple]) -> None:
        specs = plan_buckets(self.slots, order, self.config.bucket_size, self.config.device_tail_buckets)
        self.order = order
        self.buckets = [Bucket(spec, self) for spec in specs]
        tail_bytes = sum(b.device_bytes() for b in self.buckets if b.on_device)
        if tail_bytes > self.device.hbm_budget_bytes:
            raise ConfigError(f"device_tail_buckets={self.config.device_tail_buckets} needs {tail_bytes} B of "
                              f"device memory for grads + Adam state, budget is {self.device.hbm_budget_bytes} B; "
                              f"lower device_tail_buckets or bucket_size")
        if self.flow is not None:
            self.flow.check_layout(self.buckets)
        for b in self.buckets:
            self.worker.register_waiter(b.uploaded)
            self.worker.register_waiter(b.idle)
            for s in b.slots:
                sl = slice(s.offset, s.offset + s.numel)
                for buf, src in zip((b.master, b.exp_avg, b.exp_avg_sq, b.max_exp_avg_sq), state[s.index],
                                    strict=True):
                    if buf is not None and src is not None:
                        buf[sl].copy_(src.reshape(-1))
        self._module_buckets: dict[nn.Module, list[Bucket]] = {}
        for m in self.model.modules():
            bs = {self.slots[self._slot_of[id(p)]].bucket for p in m.parameters(recurse=False)
                  if id(p) in self._slot_of}
            if bs:
                self._module_buckets[m] = [self.buckets[i] for i in sorted(bs)]

    def _param_state(self) -> dict[int, tuple]:
        out = {}
        for b in self.buckets:
            for s in b.slots:
                sl = slice(s.offset, s.offset + s.numel)
                out[s.index] = tuple(None if t is None else t[sl].detach().cpu().clone()
                                     for t in (b.master, b.exp_avg, b.exp_avg_sq, b.max_exp_avg_sq))
        return out

    def _remeasure(self) -> None:
        """After the first backward: rebuild the buckets in the measured gradient-arrival order."""
        seen = set(self._arrival)
        order = self._arrival + [i for i in reversed(range(len(self.slots))) if i not in seen]
        self.layout_measured = True
        if order != self.order:
            self.worker.drain()
            self._build_layout(order, self._param_state())

    # ============================================================================================
    # public API
    # ============================================================================================
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.worker.check()
        return self.model(*args, **kwargs)

    def train(self, mode: bool = True) -> SuperOffloadEngine:
        self.model.train(mode)
        return self

    def eval(self) -> SuperOffloadEngine:
        return self.train(False)

    @property
    def is_boundary(self) -> bool:
        """True when the next backward completes an optimizer step's gradient accumulation."""
        return (self.micro + 1) % self.config.grad_accum == 0

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (divided by grad_accum, times the fp16 loss scale)."""
        self.worker.check()
        boundary = self.is_boundary
        self._boundary = boundary
        if boundary:
            self._begin_boundary()
        factor = self.loss_scale.scale / self.config.grad_accum
        flow = self.flow
        if flow is not None:
            flow.begin_backward()
        try:
            (loss * factor if factor != 1.0 else loss).backward()
        finally:
            if flow is not None:  # before _finish_backward launches the remaining buckets
                flow.end_backward()
        self.micro += 1
        if boundary:
            self._finish_backward()

    def step(self) -> bool:
        """Validate and finish the optimizer step at an accumulation boundary (a no-op between).

        Returns True when the step was applied, False when it was skipped (non-finite gradients) or
        when this was not a boundary.
        """
        self.worker.check()
        if self.micro % self.config.grad_accum != 0:
            return False
        if not self._backward_done:
            raise RuntimeError("engine.step() at an accumulation boundary needs engine.backward() first")
        applied = self._validate_and_apply()
        self.optimizer._opt_called = True  # tell torch LR schedulers an optimizer step happened
        self._backward_done = False
        self.global_step += 1
        if self.flow is not None:
            self.flow.end_step()
        self.zero_grad()
        if not self.config.overlap_param_return:
            self.synchronize()
        return applied

    def zero_grad(self) -> None:
        cur = self.device.current_stream()
        for b in self.buckets:
            cur.wait_event(b.d2h_event)  # the side stream may still read these grads (CUDA)
        for s in self.slots:
            s.param.grad = None

    def synchronize(self) -> None:
        """Wait for every host task and transfer (checkpointing, timing, tests)."""
        self.worker.drain()
        for b in self.buckets:
            b.upload_event.synchronize()
        self.device.synchronize()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        try:
            if self.flow is not None:
                self.flow.close()  # weights back on the device: the model is a plain module again
        finally:
            self.worker.close()

    # ============================================================================================
    # backward: hooks and the device side
    # ============================================================================================
    def _begin_boundary(self) -> None:
        self._speculating = self._speculation_allowed()
        self._ready = [0] * len(self.buckets)
        self._arrival = []
        for b in self.buckets:
            b.launched = False
            b.spec_queued = False

    def _speculation_allowed(self) -> bool:
        if not self.config.speculation:
            return False
        recent = self._recent_rollbacks
        return not recent or sum(recent) / len(recent) <= self.config.speculation_policy.max_rollback_rate

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._boundary:
            return
        idx = self._slot_of[id(p)]
        if not self.layout_measured:
            self._arrival.append(idx)
            return
        bi = self.slots[idx].bucket
        self._ready[bi] += 1
        if self._ready[bi] == len(self.buckets[bi].slots):
            self._launch(self.buckets[bi])

    def _finish_backward(self) -> None:
        if not self.layout_measured:
            self._remeasure()
            self._ready = [0] * len(self.buckets)
        for b in self.buckets:
            if not b.launched:
                self._launch(b)  # buckets with unused parameters, or the measuring step
        self._backward_done = True

    def _current_hps(self) -> dict[int, HyperParams]:
        return {gi: HyperParams(lr=float(g["lr"]), beta1=float(g["betas"][0]), beta2=float(g["betas"][1]),
                                eps=float(g["eps"]), weight_decay=float(g["weight_decay"]))
                for gi, g in enumerate(self.optimizer.param_groups)}

    def _launch(self, b: Bucket) -> None:
        if not b.idle.is_set():
            self.worker.wait_event(b.idle)  # last step's commit still reads the landing buffer
        t0 = time.perf_counter()
        b.mark_present()
        b.launched = True
        side = self.side_stream
        side.wait_stream(self.device.current_stream())
        with self.device.stream(side):
            for s, present in zip(b.slots, b.present, strict=True):
                view = b.dev_grad[s.offset: s.offset + s.numel]
                if present:
                    view.copy_(s.param.grad.reshape(-1))
                else:
                    view.zero_()
            # one reduction gives both the squared norm and the finite flag (Device.grad_norm_sq)
            b.norm_host.copy_(self.device.grad_norm_sq(b.dev_grad), non_blocking=True)
            if b.landing is not None and b.landing is not b.dev_grad:
                b.landing.copy_(b.dev_grad, non_blocking=True)
                self.counters.add(bytes_d2h=b.dev_grad.numel() * b.dev_grad.element_size())
            b.d2h_event.record(side)
        self.counters.add(grad_launch_s=time.perf_counter() - t0)
        if not b.on_device and self._speculating:
            scale, hps, steps = 1.0 / self.loss_scale.scale, self._current_hps(), b.steps_snapshot()
            b.spec_queued, b.spec_scale, b.spec_hps = True, scale, hps
            b.expect_upload()
            b.submit(lambda: b.speculate(scale, hps, steps), "speculate")

    # ============================================================================================
    # validation and the end of the step
    # ============================================================================================
    def _validate_and_apply(self) -> bool:
        t0 = time.perf_counter()
        total2, finite = 0.0, True
        for b in self.buckets:  # fixed order: the reduction is deterministic
            b.d2h_event.synchronize()
            n2 = float(b.norm_host[0])  # the bucket's squared norm
            if math.isfinite(n2):
                total2 += n2
            else:
                finite = False
        inv = 1.0 / self.loss_scale.scale
        self.last_grad_norm = math.sqrt(total2) * inv if finite else float("nan")
        coef = 1.0
        if finite and self.config.grad_clip > 0:
            c = self.config.grad_clip / (self.last_grad_norm + 1e-6)
            coef = min(c, 1.0)
        self.last_clip_coef = coef
        scale = inv * coef
        skip = not finite and self.config.skip_nonfinite
        hps = self._current_hps()
        self.counters.add(validate_wait_s=time.perf_counter() - t0)

        speculated = any(b.spec_queued for b in self.buckets)
        needs_rollback = skip or coef != 1.0
        action = "skip" if skip else "commit"
        # the next forward needs the last-arriving buckets (first layers) first: finalize those first
        for b in reversed([b for b in self.buckets if not b.on_device]):
            same = b.spec_queued and scale == b.spec_scale and hps == b.spec_hps
            if action == "skip" and not b.spec_queued:
                continue
            counted = action == "skip" or not same
            if counted:
                b.expect_upload()  # this task writes the weights again; the next forward must wait for it
            steps = b.steps_snapshot()
            b.submit(lambda b=b, steps=steps, counted=counted: b.finalize(action, scale, hps, steps, counted),
                     action)
        if not skip:
            self._step_device_buckets(scale, hps)
            for b in self.buckets:
                for s in b.present_slots():
                    self.steps[s.index] += 1
        self.loss_scale.update(found_nonfinite=not finite)
        self._recent_rollbacks.append(needs_rollback)
        c = self.spec_counts
        c["steps"] += 1
        c["skipped"] += int(skip)
        c["clipped"] += int(coef != 1.0)
        if speculated:
            c["speculated"] += 1
            c["rolled_back"] += int(needs_rollback)
            c["committed"] += int(not needs_rollback)
        else:
            c["validate_first"] += 1
        return not skip

    def _step_device_buckets(self, scale: float, hps: dict[int, HyperParams]) -> None:
        t0 = time.perf_counter()
        cur = self.device.current_stream()
        for b in (b for b in self.buckets if b.on_device):
            cur.wait_event(b.d2h_event)
            present = {s.index for s in b.present_slots()}
            for start, end, members in runs(b.slots, key=lambda s, present=present: (
                    (s.group, self.steps[s.index]) if s.index in present else None)):
                hp, sl = hps[members[0].group], slice(start, end)
                self.device.adam_step(
                    b.master[sl], b.dev_grad[sl], b.exp_avg[sl], b.exp_avg_sq[sl],
                    step=self.steps[members[0].index] + 1, lr=hp.lr, beta1=hp.beta1, beta2=hp.beta2,
                    eps=hp.eps, weight_decay=hp.weight_decay, adamw=self.config.optimizer.adamw,
                    grad_scale=scale, max_exp_avg_sq=None if b.max_exp_avg_sq is None else b.max_exp_avg_sq[sl])
            for s in b.present_slots():
                s.param.data.copy_(b.master[s.offset: s.offset + s.numel].view(s.param.shape))
        self.counters.add(device_step_s=time.perf_counter() - t0)

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        buckets = self._module_buckets.get(module)
        if not buckets:
            return
        cur = self.device.current_stream()
        for b in buckets:
            if not b.uploaded.is_set():
                self.worker.wait_event(b.uploaded)
            cur.wait_event(b.upload_event)

    # ============================================================================================
    # checkpoints and stats
    # ============================================================================================
    def state_dict(self) -> dict[str, Any]:
        """Host master, Adam moments and step counts per parameter name, param-group hyper-parameters,
        the loss scale: everything needed for a bit-exact resume (the model's buffers are the model's)."""
        self.synchronize()
        state = self._param_state()
        params = {}
        for s in self.slots:
            master, m, v, vmax = state[s.index]
            entry = {"master": master.view(s.param.shape), "exp_avg": m.view(s.param.shape),
                     "exp_avg_sq": v.view(s.param.shape), "step": self.steps[s.index]}
            if vmax is not None:
                entry["max_exp_avg_sq"] = vmax.view(s.param.shape)
            params[s.name] = entry
        return {"version": 1, "params": params,
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups],
                "loss_scale": self.loss_scale.state_dict(), "global_step": self.global_step, "micro": self.micro,
                # the measured gradient-arrival order, so a resumed run keeps the same buckets
                "arrival_order": [self.slots[i].name for i in self.order], "layout_measured": self.layout_measured}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd.get("version") != 1:
            raise ValueError(f"unsupported engine state_dict version {sd.get('version')!r}")
        names = {s.name for s in self.slots}
        missing, unexpected = names - set(sd["params"]), set(sd["params"]) - names
        if missing or unexpected:
            raise ValueError(f"state_dict does not match the model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        if len(sd["param_groups"]) != len(self.optimizer.param_groups):
            raise ValueError(f"state_dict has {len(sd['param_groups'])} param groups, the engine has "
                             f"{len(self.optimizer.param_groups)}")
        self.synchronize()
        state = {}
        for s in self.slots:
            e = sd["params"][s.name]
            if tuple(e["master"].shape) != tuple(s.param.shape):
                raise ValueError(f"{s.name}: shape {tuple(e['master'].shape)} in state_dict, "
                                 f"{tuple(s.param.shape)} in the model")
            state[s.index] = (e["master"], e["exp_avg"], e["exp_avg_sq"], e.get("max_exp_avg_sq"))
            self.steps[s.index] = int(e["step"])
        for g, saved in zip(self.optimizer.param_groups, sd["param_groups"], strict=True):
            g.update(saved)
        by_name = {s.name: s.index for s in self.slots}
        order = [by_name[n] for n in sd.get("arrival_order", [])]
        if sorted(order) == list(range(len(self.slots))):
            self.order, self.layout_measured = order, bool(sd.get("layout_measured", False))
        self._build_layout(self.order, state)
        self.loss_scale.load_state_dict(sd["loss_scale"])
        self.global_step, self.micro = int(sd["global_step"]), int(sd["micro"])
        with torch.no_grad():
            for s in self.slots:  # device weights = the master cast to precision, as after any step
                if self.flow is not None and self.flow.owns(s.param):
                    self.flow.write_host(s.param, state[s.index][0])  # its device copy comes from there
                else:
                    s.param.data.copy_(state[s.index][0].reshape(s.param.shape))
        if self.flow is not None:
            self.flow.reload_resident()
        self.device.synchronize()

    @property
    def stats(self) -> dict[str, Any]:
        c = self.counters.snapshot()
        host = [b for b in self.buckets if not b.on_device]
        dev = [b for b in self.buckets if b.on_device]
        c.setdefault("bytes_d2h", 0)
        c.setdefault("bytes_h2d", 0)
        extra = {"weight_flow": self.flow.stats()} if self.flow is not None else {}
        return {
            "buckets_host": len(host), "buckets_device": len(dev),
            "bucket_size": self.config.bucket_size, "params": sum(s.numel for s in self.slots),
            "device_tail_params": sum(b.spec.numel for b in dev),
            "device_tail_bytes": sum(b.device_bytes() for b in dev),
            "host_state_bytes": sum(b.host_bytes() for b in host),
            "layout_measured": self.layout_measured,
            "bytes": {"d2h": int(c.pop("bytes_d2h")), "h2d": int(c.pop("bytes_h2d"))},
            "time_s": {**c, "host_worker_busy_s": self.worker.busy_s},
            "speculation": {**dict(self.spec_counts), "enabled": self.config.speculation,
                            "mode": self.config.rollback_mode,
                            "recent_rollback_rate": (sum(self._recent_rollbacks) / len(self._recent_rollbacks)
                                                     if self._recent_rollbacks else 0.0),
                            "rollback_time_s": c.get("rollback_s", 0.0)},
            "loss_scale": self.loss_scale.scale if self.loss_scale.enabled else None,
            "config": self.config.to_dict(),
            **extra,
        }
