"""SuperOffloadEngine: the life of a bucket, one code path for CUDA, the simulated device and CPU-only.

Per optimizer step (docs/engine.md has the full account):
1. gradient ready: a post-accumulate-grad hook per parameter; buckets are launched in bucket order as
   they complete (params with no gradient are flushed at the end of backward);
2. device side, on a side stream: flatten into a staging slot (casting per `grad_cast`), reduce-scatter
   across ranks, the shard's squared norm in fp64 (also the finite flag), then the gradient shard and
   its norm D2H on a copy stream into pinned buffers; the autograd gradients are freed (CPU-only, the
   reduce-scatter is left in flight and the rest done later, in bucket order: `_complete_launches`);
3. speculative host step: the worker waits for the D2H and runs the host kernel before the global norm
   is known. It writes only buffers the model does not read (`upload`, and `spare` with full_copy); with
   an upload ring (`upload_slots`) only the first buckets in forward order have a slot to write, the
   others step when step() publishes them;
4. device tail buckets keep their gradient shard, master and Adam state on the device;
5. validation in `step()`: one all-reduce of [Σ norm², non-finite count] in fp64, the one
   synchronization of the step, then the same decision on every rank for every bucket: commit, redo
   with the clip factor, or nothing (a skipped step);
6. parameter return: each host bucket's finalize task publishes its weights (H2D into the flat device
   buffer its parameters are views of, then an all-gather across ranks); the next forward waits per
   module on its buckets, never on a global barrier;
7. weight flow (`flow_layers`, weight_flow.py): flowed blocks' weights live in host stores that step 6
   writes, fetched before each use and released after.

What a training loop can observe follows torch: weights change only in step(); an exception in backward
leaves the engine where zero_grad() restores a clean state; misuse raises before any work.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any

import torch
import torch.nn as nn

from superoffload.device import get_device
from superoffload.engine import checkpoint as ckpt
from superoffload.engine.bucket import (
    Bucket,
    BucketContext,
    Counters,
    Finalize,
    HyperParams,
    Speculation,
)
from superoffload.engine.buffers import StagingRing, UploadRing
from superoffload.engine.build import BufferBuilder
from superoffload.engine.comm import Comm
from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.deepspeed_names import DeepSpeedNames
from superoffload.engine.hooks import EngineHook
from superoffload.engine.layout import ParamPiece, ParamSlot, plan_buckets, runs
from superoffload.engine.loss_scale import DynamicLossScale
from superoffload.engine.norms import BucketNorms
from superoffload.engine.optimizer import OffloadOptimizer
from superoffload.engine.params import build_param_groups
from superoffload.engine.plain_loop import PlainLoop
from superoffload.engine.step_state import InFlight, StepState
from superoffload.engine.weight_flow import WeightFlow, flow_segments
from superoffload.engine.worker import HostWorker, NonFiniteError
from superoffload.options import torch_dtype

log = logging.getLogger(__name__)


def _check_finite_weights(slots: list[ParamSlot]) -> None:
    """A NaN/Inf weight can never train (every step would be skipped, or poison the state): refuse it."""
    bad = []
    with torch.no_grad():
        for s in slots:
            n = int((~torch.isfinite(s.param)).sum()) if s.param.is_floating_point() else 0
            if n:
                bad.append(f"{s.name} ({n} of {s.numel})")
    if bad:
        raise ValueError(f"non-finite weights (NaN/Inf) in {', '.join(bad[:5])}{' and more' if len(bad) > 5 else ''}: "
                         f"the model cannot be trained from them; load or initialize finite weights")


def place_in_precision(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The model on the device with its floating-point parameters in the training precision. Buffers keep
    their dtype (RoPE's inverse frequencies stay fp32, as `from_pretrained(dtype=...)` keeps them).
    `calibrate` profiles a workload's compute on the model placed by this, as the engine trains it."""
    model.to(device=device)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return model


class SuperOffloadEngine(DeepSpeedNames):
    """`optimizer`: a torch Optimizer whose param groups (the very dicts) the engine reads, as torch.optim
    does, instead of building its own over `param_groups` (superoffload.AdamW passes itself; the DeepSpeed
    way in, a view over the script's optimizer's groups). `drive`: "engine" (`engine.backward()` /
    `engine.step()`) or "plain" (a plain `loss.backward()` and the optimizer's step(), plain_loop.py)."""

    def __init__(self, model: nn.Module, config: SuperOffloadConfig | dict | str | None = None,
                 param_groups: Any = None, process_group: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None, drive: str = "engine") -> None:
        if drive not in ("engine", "plain"):
            raise ValueError(f"drive must be 'engine' or 'plain', got {drive!r}")
        cfg = SuperOffloadConfig.from_any(config)
        self.config = cfg
        self.backend = get_device(cfg.device, cfg.hbm_budget_bytes)
        self.comm = Comm.create(process_group, replicate=cfg.replicate)
        self.dtype = torch_dtype(cfg.precision)
        groups = self._collect_params(model, optimizer, param_groups)
        self.order = list(reversed(range(len(self.slots))))  # provisional: the usual arrival order
        # fp32 masters come from the weights as given, before the device copy is cast to `precision`;
        # each moves into its bucket's host state when the bucket is created (the builder takes them)
        self._pending_master: dict[int, torch.Tensor] = {}
        self.builder = BufferBuilder(self.backend, cfg, self.comm, self.dtype, ctx=None,
                                     pending_master=self._pending_master)
        self._flow_segment = flow_segments(model, cfg)  # a flowed parameter's block, by id (weight_flow.py)
        self._check_budgets()  # before anything is moved, cast or allocated
        self._pending_master.update({s.index: s.param.detach().to("cpu", torch.float32).reshape(-1).clone()
                                     for s in self.slots})
        self.model = place_in_precision(model, self.backend.torch_device, self.dtype)
        offloader = getattr(model, "activation_offloader", None)  # checkpoints in host memory (sequence/)
        if offloader is not None and hasattr(offloader, "use_device"):
            offloader.use_device(self.backend)
        self.optimizer: torch.optim.Optimizer = optimizer if optimizer is not None else OffloadOptimizer(self, groups)
        self._init_runtime()
        self.flow: WeightFlow | None = None
        self._flow_buckets: list[Bucket] = []
        if cfg.flow_layers:  # flowed blocks are laid out now: their weights flow from the first step
            self.flow = WeightFlow(self.model, cfg, self.backend, self.comm, self.worker, self.slots)
            self.ctx.flow_sink = self.flow
            self.flow.check_tail_window(self.order, cfg.device_tail_buckets, cfg.bucket_size, measured=False)
            self._flow_buckets = self.builder.create(self.flow.layouts(self.comm.world))
            self._bucket_of.update({id(pc): b for b in self._flow_buckets for pc in b.slots})
            self.flow.start(self._flow_buckets)
        self._install_hooks()
        self._plain: PlainLoop | None = PlainLoop(self) if drive == "plain" else None
        # parameters the engine does not train that could still get a gradient: frozen when it was built
        # (those of the optimizer's groups when a plain loop drives it, else the model's)
        names = {id(p): n for n, p in model.named_parameters()}
        owned = {id(s.param) for s in self.slots}
        candidates = ([p for g in optimizer.param_groups for p in g["params"]] if drive == "plain" and optimizer
                      else list(model.parameters()))
        self._unowned = [(names.get(id(p), "?"), p) for p in dict.fromkeys(candidates) if id(p) not in owned]

    def _collect_params(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                        param_groups: Any) -> list[dict[str, Any]]:
        """The trained parameters (`slots`) and their groups, checked equal on every rank and finite."""
        cfg = self.config
        if optimizer is not None:
            groups = build_param_groups(model, cfg, optimizer.param_groups, as_torch=True)
        else:
            groups = build_param_groups(model, cfg, param_groups)
        names = {id(p): n for n, p in model.named_parameters()}
        self.slots = [ParamSlot(index=i, param=p, name=names[id(p)], group=gi, numel=p.numel(), shape=p.shape)
                      for i, (gi, p) in enumerate((gi, p) for gi, g in enumerate(groups) for p in g["params"])]
        self._slot_of = {id(s.param): s.index for s in self.slots}
        self.comm.check_same("the model's trainable parameters and param groups",
                             [(s.name, tuple(s.shape), s.group) for s in self.slots])
        # everything that shapes the collectives (bucketing, tail, flow, casting, precision) must agree;
        # host_threads may differ (each rank's share of its host's cores)
        self.comm.check_same("the engine config", {k: v for k, v in cfg.to_dict().items() if k != "host_threads"})
        _check_finite_weights(self.slots)
        return groups

    def _init_runtime(self) -> None:
        """The worker, streams, counters and the state of steps and buckets, before any is built."""
        cfg = self.config
        self.steps = [0] * len(self.slots)
        self.loss_scale = DynamicLossScale(cfg.loss_scale, enabled=cfg.precision == "fp16")
        self.worker = HostWorker(self.backend)
        self.side_stream = self.backend.new_stream("side")
        self.d2h_stream = self.backend.new_stream("d2h")
        self.upload_stream = self.backend.new_stream("upload")
        self.counters = Counters()
        self.spec_counts: collections.Counter[str] = collections.Counter()
        self._recent_rollbacks: collections.deque[bool] = collections.deque(maxlen=cfg.speculation_policy.window)
        self.micro = 0  # backward() calls so far
        self._window_micros = 0  # backward() calls in the current accumulation window
        self._boundary_override: bool | None = None  # set_gradient_accumulation_boundary()
        self.step_state = StepState()
        self._in_flight: collections.deque[InFlight] = collections.deque()  # launches not yet completed
        self.global_step = 0
        self.last_grad_norm = float("nan")  # the global gradient norm of the last step (after unscaling)
        self.last_step_applied: bool | None = None  # False: the last step was skipped (non-finite gradients)
        self._skips_in_row = 0
        self._nonfinite_error = ""
        self.last_clip_coef = 1.0
        self.layout_measured = False
        self.buckets: list[Bucket] = []
        self._buckets_of: list[list[Bucket]] = []  # per parameter, the buckets its gradient launches in
        self._module_buckets: dict[nn.Module, list[Bucket]] = {}
        self._bucket_of: dict[int, Bucket] = {}  # id(piece) -> the bucket holding it
        self._grad_gen = [0] * len(self.slots)  # bumped when a parameter's gradient is released (_launch)
        self._adopted: set[int] = set()  # parameters whose gradient a launch took and has not yet released
        self.ring: StagingRing | None = None
        self.upload_ring: UploadRing | None = None
        self.norms: BucketNorms | None = None
        self._upload_stage: torch.Tensor | None = None
        self._broken = ""
        self.ctx = BucketContext(
            device=self.backend, comm=self.comm, worker=self.worker, counters=self.counters, dtype=self.dtype,
            optimizer=cfg.optimizer, host_optimizer=cfg.host_optimizer, host_threads=cfg.host_threads,
            full_copy=cfg.rollback_mode == "full_copy", upload_stream=self.upload_stream,
            upload_staging=self._upload_staging)
        self.builder.ctx = self.ctx

    def _install_hooks(self) -> None:
        """Gradient-ready hooks per parameter, a forward pre-hook per module that owns parameters (it
        waits for their buckets), and the model's own (usability, load_state_dict, state_dict)."""
        self._hooks = [s.param.register_post_accumulate_grad_hook(EngineHook(self._on_grad)) for s in self.slots]
        self._hooks += [m.register_forward_pre_hook(EngineHook(self._pre_forward)) for m in self.model.modules()
                        if any(id(p) in self._slot_of for p in m.parameters(recurse=False))]
        self._hooks.append(self.model.register_forward_pre_hook(EngineHook(self._root_pre_forward)))
        self._hooks.append(self.model.register_load_state_dict_pre_hook(EngineHook(self._before_model_load)))
        self._hooks.append(self.model._register_state_dict_hook(EngineHook(self._model_state_dict_hook)))
        self._versions = self._weight_versions()

    # ============================================================================================
    # layout: measured on the first step, then built once
    # ============================================================================================
    def build_layout(self, order: list[int]) -> None:
        """Build the buckets and every buffer for a gradient-arrival order (parameter indices; measured on
        the first step, or a checkpoint's): once per engine."""
        cfg = self.config
        order = self.comm.broadcast_object(order)  # rank 0 decides; everyone builds the same buckets
        segment = self.flow.segment_of if self.flow is not None else None
        fixed = self.flow.fixed_layouts() if self.flow is not None else None
        layouts = plan_buckets(self.slots, order, cfg.bucket_size, cfg.device_tail_buckets, self.comm.world,
                               segment=segment, fixed=fixed, piece=ParamPiece)
        self.comm.check_same("the bucket layout", [[(pc.name, pc.start, pc.numel) for pc in lay.slots]
                                                   for lay in layouts])
        if self.flow is not None:
            self.flow.check_tail(layouts)
        created = {id(b.layout): b for b in self._flow_buckets}
        self._check_budgets([lay for lay in layouts if id(lay) not in created])
        new = self.builder.create([lay for lay in layouts if id(lay) not in created])
        self._bucket_of.update({id(pc): b for b in new for pc in b.slots})
        created.update({id(b.layout): b for b in new})
        self.buckets = [created[id(lay)] for lay in layouts]
        self._buckets_of = [[self.buckets[k] for k in s.buckets] for s in self.slots]
        self.order, self.layout_measured = order, True
        self.norms = BucketNorms(self.backend, len(self.buckets), self.comm.world if self.comm.replicate else 1)
        self.ring = self.builder.staging_ring(self.buckets)
        self.upload_ring = self.builder.upload_ring(self.buckets)
        if self.dtype != torch.float32 and cfg.param_cast == "device" and not self.backend.shares_host_memory:
            self._upload_stage = self.backend.empty(max(b.shard_numel for b in self.buckets), torch.float32,
                                                   "staging")
        self._module_buckets = {}
        for m in self.model.modules():
            bs = {k for p in m.parameters(recurse=False) if id(p) in self._slot_of
                  for k in self.slots[self._slot_of[id(p)]].buckets}
            if bs:
                self._module_buckets[m] = [self.buckets[i] for i in sorted(bs)]
        self._versions = self._weight_versions()

    def reconfigure(self, updates: dict[str, Any]) -> None:
        """Change config keys before the bucket layout is built: what a plan made at the first step sets
        (superoffload.AdamW). Checked as at initialize, and equal on every rank."""
        if self.layout_measured:
            raise RuntimeError("reconfigure() after the bucket layout was built")
        if not updates:
            return
        cfg = SuperOffloadConfig.from_any({**self.config.to_dict(), **updates})
        self.comm.check_same("the engine config", {k: v for k, v in cfg.to_dict().items() if k != "host_threads"})
        if cfg.replicate != self.comm.replicate and self._flow_buckets and self.comm.active:
            raise ConfigError("replicate cannot change after weight flow's buckets were built (at initialize): "
                              "set it in the config passed to initialize")
        self.comm.replicate = cfg.replicate
        self.config = self.builder.config = cfg
        self.ctx.host_optimizer, self.ctx.host_threads = cfg.host_optimizer, cfg.host_threads
        self.ctx.full_copy = cfg.rollback_mode == "full_copy"
        self._recent_rollbacks = collections.deque(maxlen=cfg.speculation_policy.window)
        self._check_budgets()
        if self.flow is not None:
            self.flow.check_tail_window(self.order, cfg.device_tail_buckets, cfg.bucket_size, measured=False)

    def _check_budgets(self, layouts: list[Any] | None = None) -> None:
        """The device tail and the host buffers must fit their budgets (`build.py`): checked at initialize
        on the provisional layout (before any work) and again on the measured one (`layouts`, the buckets
        still to build)."""
        if layouts is None:
            layouts = BufferBuilder.provisional_layouts(self.slots, self.order, self.config, self.comm.world,
                                                        lambda s: self._flow_segment.get(id(s.param)))
        self.builder.check_budgets(layouts)

    def _upload_staging(self, numel: int) -> torch.Tensor:
        """The device fp32 buffer a param_cast "device" return lands in before its cast on the device
        (used on the upload stream only, so its reuse is ordered)."""
        assert self._upload_stage is not None
        return self._upload_stage[:numel]

    # ============================================================================================
    # public API
    # ============================================================================================
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.worker.check()
        with self.backend.tracking():
            return self.model(*args, **kwargs)

    def train(self, mode: bool = True) -> SuperOffloadEngine:
        self.model.train(mode)
        return self

    def eval(self) -> SuperOffloadEngine:
        return self.train(False)

    @property
    def device(self) -> torch.device:
        """The torch device the model's weights and inputs live on (DeepSpeed's `engine.device`)."""
        return self.backend.torch_device

    @property
    def is_boundary(self) -> bool:
        """True when the next backward completes an optimizer step's gradient accumulation."""
        if self._boundary_override is not None:
            return self._boundary_override
        return self._window_micros + 1 >= self.config.grad_accum

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (divided by grad_accum, times the fp16 loss scale)."""
        self._check_native("backward()")
        self._check_ready_for_backward()
        dev = self.backend
        with dev.tracking(), dev.hot_path():
            self._adopt_user_weight_changes()
            boundary = self.is_boundary
            factor = self.loss_scale.scale / self.config.grad_accum
            try:
                if boundary:
                    self._begin_boundary()
                if self.flow is not None:
                    self.flow.begin_backward()
                (loss * factor if factor != 1.0 else loss).backward()
                self._check_unowned_grads()
                if self.flow is not None:  # before the remaining buckets launch
                    self.flow.end_backward()
                if boundary:
                    self._finish_backward()
            except BaseException:
                self._abort_backward()
                raise
            self.micro += 1
            self._window_micros = 0 if boundary else self._window_micros + 1

    def step(self) -> bool:
        """Validate and finish the optimizer step at an accumulation boundary (a no-op between).

        Returns True when the step was applied, False when it was skipped (non-finite gradients) or
        when this was not a boundary.
        """
        self._check_usable()
        self._check_native("step()")
        if not self.step_state.backward_done:
            if self._window_micros:
                return False  # between accumulation micro-batches, as DeepSpeed's step()
            raise RuntimeError("engine.step() at an accumulation boundary needs engine.backward() first")
        return self._finish_step()

    def _finish_step(self) -> bool:
        """Validation and the end of the step, once every bucket has been launched."""
        dev = self.backend
        with dev.tracking(), dev.hot_path():
            self._adopt_user_weight_changes()
            applied = self._validate_and_apply()
            self.optimizer._opt_called = True  # tell torch LR schedulers an optimizer step happened
            self.step_state.backward_done = False
            self.global_step += 1
            self.last_step_applied = applied
            if self.flow is not None:
                self.flow.end_step()
        if not self.config.overlap_param_return:
            self.synchronize()
        if self._nonfinite_error:  # the skipped step is complete: the engine stays usable
            msg, self._nonfinite_error = self._nonfinite_error, ""
            raise NonFiniteError(msg)
        return applied

    def zero_grad(self) -> None:
        """Drop accumulated gradients and start a new accumulation window (as torch's zero_grad).

        After an exception in backward() this is what makes the engine usable again: the interrupted
        window is discarded as if its micro-batches had never been seen."""
        self._check_native("zero_grad()")
        self._drop_grads()
        self.micro -= self._window_micros
        self._window_micros = 0
        self.step_state.needs_zero_grad = False

    def _check_unowned_grads(self) -> None:
        """A parameter frozen when the engine was built that now has a gradient: torch (an optimizer over
        the same parameters) would train it, the engine has no buffers for it. Never a silently growing
        `.grad`: an error at the backward that gave it one."""
        got = [n for n, p in self._unowned if p.grad is not None]
        if got:
            raise RuntimeError(f"parameter(s) {', '.join(got[:5])}{' and more' if len(got) > 5 else ''} had "
                               f"requires_grad=False when the engine was built and now have a gradient: the engine "
                               f"does not train them (torch's AdamW over the same parameters would). Unfreeze them "
                               f"before building the engine or optimizer, or freeze them again and set .grad = None")

    def _drop_grads(self) -> None:
        with self.backend.tracking():
            for s in self.slots:
                g = s.param.grad
                if g is not None:
                    if s.index in self._adopted:  # a gradient no launch took was never counted
                        self.backend.release_grads([g], read_on=(self.side_stream,))
                    s.param.grad = None
                    self._grad_gen[s.index] += 1
            self._adopted.clear()

    def _check_native(self, what: str) -> None:
        if self._plain is not None:
            raise RuntimeError(f"this engine is driven by {type(self.optimizer).__name__}: call loss.backward() and "
                               f"the optimizer's step() / zero_grad(), not engine.{what}")

    def synchronize(self) -> None:
        """Wait for every host task and transfer: parameters then hold this step's values everywhere."""
        with self.backend.tracking():
            self.worker.drain()
            for b in self.buckets:
                if b.gather is not None:
                    self.comm.wait(b.gather)
                    b.gather = None
            self.backend.synchronize()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        try:
            self.worker.drain(check=False)
            if self.flow is not None:
                self.flow.close()  # weights back on the device: the model is a plain module again
            self.backend.synchronize()
        finally:
            self.worker.close()

    # ============================================================================================
    # misuse and exceptions
    # ============================================================================================
    def _check_usable(self) -> None:
        self.worker.check()
        if self._broken:
            raise RuntimeError(self._broken)

    def _check_ready_for_backward(self) -> None:
        self._check_usable()
        if self.step_state.needs_zero_grad:
            raise RuntimeError("the last engine.backward() raised before it finished; call engine.zero_grad() "
                               "to discard that accumulation window, then continue training")
        if self.step_state.backward_done:
            raise RuntimeError(f"engine.backward() was called {self.config.grad_accum} time(s) since the last "
                               f"step (grad_accum: {self.config.grad_accum}) and once more now; call engine.step() "
                               f"after each accumulation window, or raise grad_accum to accumulate more "
                               f"micro-batches per step")

    def _abort_backward(self) -> None:
        """An exception escaped backward: discard this step's speculation exactly and leave a state
        from which zero_grad() continues as if the window had never been seen."""
        self.worker.drain(check=False)  # no task is left writing (speculation writes only scratch buffers)
        # reductions left in flight are not waited for: a rank that raised may never see its peers issue
        # theirs. With several ranks (the only case that leaves any) the engine refuses further use below
        self._in_flight.clear()
        self._reset_step()
        self.step_state.needs_zero_grad = True
        if self.flow is not None:
            self.flow.end_backward()
        if self.comm.active:
            self._broken = ("an exception in backward() left this rank's collectives out of step with the other "
                            "ranks; restart the job from a checkpoint")

    # ============================================================================================
    # weights changed behind the engine's back
    # ============================================================================================
    def pending_master(self, s: ParamSlot) -> torch.Tensor | None:
        """Parameter `s`'s whole fp32 master before its buckets exist (None once they do)."""
        return self._pending_master.get(s.index)

    def weights_written(self) -> None:
        """The engine itself wrote the weights (a load): they are not the user's changes to adopt."""
        self._versions = self._weight_versions()

    @property
    def window_micros(self) -> int:
        """backward() calls in the current accumulation window."""
        return self._window_micros

    def restore_progress(self, global_step: int, micro: int, window_micros: int) -> None:
        """The step counters of a checkpoint."""
        self.global_step, self.micro, self._window_micros = int(global_step), int(micro), int(window_micros)

    def _weight_versions(self) -> list[tuple[int, int]]:
        return [(s.param._version, s.param.data_ptr() if self._owned_view(s) else -1) for s in self.slots]

    def _owned_view(self, s: ParamSlot) -> bool:
        """The parameter is a view of its bucket's device buffer (the engine's to check by address)."""
        return bool(self.buckets) and not (self.flow is not None and self.flow.owns(s.param))

    def _adopt_user_weight_changes(self) -> None:
        """A parameter written in place (load_state_dict, torch.nn.init, an in-place op under no_grad) or
        given new data since the engine last wrote it: take its values into the fp32 master, as
        torch.optim would step from them, and redo any speculation that used the old master."""
        now = self._weight_versions()
        changed = [s for s, a, b in zip(self.slots, self._versions, now, strict=True) if a != b]
        if not changed:
            return
        self.worker.drain()  # pending returns must not overwrite what the user wrote after them
        with torch.no_grad():
            for s in changed:
                values = s.param.detach().reshape(-1)
                if s.index in self._pending_master:  # not in a bucket yet: the weights are all there is
                    self._pending_master[s.index] = values.to("cpu", torch.float32).clone()
                    continue
                home = self.builder.homes.get(s.index)
                if home is None:  # a flowed parameter: its values go to this rank's part of its host store
                    self._write_flow_store(s, values)
                elif s.param.data_ptr() != home.data_ptr():
                    home.copy_(values)
                    s.param.data = home.view(s.shape)
                self.write_master(s, values)
                for pc in s.pieces:
                    self._bucket_of[id(pc)].spec.queued = False  # its speculation read the old master: redo it
        log.info("adopted new values of %d parameter(s) written outside the engine", len(changed))
        self._versions = self._weight_versions()

    def all_buckets(self) -> list[Bucket]:
        """Every bucket: the laid-out ones, or before the layout is measured, weight flow's (built at
        initialize)."""
        return [*self.buckets, *(b for b in self._flow_buckets if b not in self.buckets)]

    def _write_flow_store(self, s: ParamSlot, values: torch.Tensor) -> None:
        if values.numel() != s.numel:  # sharded across ranks: outside its uses the parameter holds nothing
            return
        for pc in s.pieces:
            b = self._bucket_of[id(pc)]
            if (o := pc.overlap(b.lo, b.hi)) is not None:
                a, e, start = o
                b.before_home_write()
                b.home_shard()[a - b.lo: e - b.lo].copy_(values[start: start + e - a])

    def write_master(self, s: ParamSlot, values: torch.Tensor) -> None:
        """This rank's part of parameter `s`'s fp32 master from its flat `values` (in its pieces' buckets;
        before the layout is built, the whole pending master, which also sets the weights)."""
        if s.index in self._pending_master:  # not in a bucket yet
            self._pending_master[s.index] = values.reshape(-1).to("cpu", torch.float32).clone()
            with torch.no_grad():
                s.param.data.copy_(self._pending_master[s.index].view(s.shape))
            return
        for pc in s.pieces:
            b = self._bucket_of[id(pc)]
            if (o := pc.overlap(b.lo, b.hi)) is not None:
                a, e, start = o
                b.master[a - b.lo: e - b.lo].copy_(values[start: start + e - a])

    def _before_model_load(self, *args: Any, **kwargs: Any) -> None:
        # model.load_state_dict writes the parameters: pending returns must land first, not after
        self.synchronize()

    def _model_state_dict_hook(self, module: nn.Module, state: dict, prefix: str, local: Any) -> dict:
        """model.state_dict(): this step's weights (pending returns waited for); flowed weights from their
        host store as copies (their device storage is released outside forward)."""
        self.synchronize()
        if self.flow is not None:
            self.flow.state_dict_entries(module, state, prefix)
        return state

    # ============================================================================================
    # backward: hooks and the device side
    # ============================================================================================
    def _reset_step(self) -> None:
        """Forget the step in progress (the one place its flags and the buckets' launch state reset)."""
        for f in self._in_flight:  # their collectives still write staging and landing buffers
            self.comm.wait(f.work)
        self._in_flight.clear()
        self.step_state.reset()
        for b in self.buckets:
            b.spec = Speculation()
            b.launched = False
            b.ready = 0

    def _begin_boundary(self) -> None:
        self._reset_step()
        self.step_state.boundary = True
        self.step_state.speculating = self._speculation_allowed()

    def _speculation_allowed(self) -> bool:
        if not self.config.speculation:
            return False
        recent = self._recent_rollbacks
        return not recent or sum(recent) / len(recent) <= self.config.speculation_policy.max_rollback_rate

    def _on_grad(self, p: torch.Tensor) -> None:
        idx = self._slot_of[id(p)]
        if self._plain is not None:
            with self.backend.tracking():
                self._plain.on_grad(idx)
            return
        if not self.step_state.boundary:
            return
        if not self.layout_measured:
            self.step_state.arrival.append(idx)
            return
        self._param_ready(idx)

    def _param_ready(self, idx: int) -> None:
        """Parameter `idx` holds its last gradient of the step (so does each of its pieces, in one or
        several buckets): launch every bucket that is complete, in bucket order (identical on every rank
        whatever order gradients arrive in)."""
        for b in self._buckets_of[idx]:
            b.ready += 1
        while self.step_state.next_launch < len(self.buckets):
            nxt = self.buckets[self.step_state.next_launch]
            if nxt.ready < len(nxt.slots):
                break
            self._launch(nxt)
            self.step_state.next_launch += 1

    def _launch_remaining(self) -> None:
        """The buckets still waiting when backward ended (parameters without a gradient), in order; then
        every launch is completed (validation reads every bucket's norm)."""
        for b in self.buckets[self.step_state.next_launch:]:
            self._launch(b)
        self.step_state.next_launch = len(self.buckets)
        self._complete_launches()

    def _finish_backward(self) -> None:
        if not self.layout_measured:
            seen = set(self.step_state.arrival)
            with self.backend.allow_sync():  # once per run: the layout is built (and broadcast) here
                self.build_layout(self.step_state.arrival
                                   + [i for i in reversed(range(len(self.slots))) if i not in seen])
        self._launch_remaining()  # buckets with unused parameters, or the measuring step
        self.step_state.boundary = False
        self.step_state.backward_done = True

    def _current_hps(self) -> dict[int, HyperParams]:
        return {gi: HyperParams(lr=float(g["lr"]), beta1=float(g["betas"][0]), beta2=float(g["betas"][1]),
                                eps=float(g["eps"]), weight_decay=float(g["weight_decay"]))
                for gi, g in enumerate(self.optimizer.param_groups)}

    def _grad_target(self, b: Bucket) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """(where the flat gradient is written, where this rank's reduced shard lands, ring slot)."""
        comm, ring = self.comm, self.ring
        if b.tail is not None and not comm.active:
            return b.tail["grad"], b.tail["grad"], None
        if b.host is not None and self.backend.shares_host_memory and not comm.sharded:
            return b.host.landing, b.host.landing, None  # one rank, or replicated: reduced in place
        assert ring is not None
        i = ring.acquire()
        flat = ring.flat[i][: b.layout.padded]
        if b.tail is not None and b.tail["grad"].dtype == flat.dtype:
            shard = b.tail["grad"]
        elif b.tail is None and self.backend.shares_host_memory:
            shard = b.host.landing
        elif comm.sharded:  # a discrete device, or a tail bucket's low-precision reduction (cast after it)
            shard = ring.shard[i][: b.shard_numel]
        else:
            shard = flat
        return flat, shard, i

    def _launch(self, b: Bucket, carry: bool = False) -> None:
        """The bucket's gradients to the host (or its device tail). `carry`: the bucket was launched
        earlier in this step and its reduced shard (landing, or the tail's gradient) holds that part:
        the new gradients are added to it (superoffload.AdamW when a step has more backward passes than
        predicted, plain_loop.py).

        Issued here: the flatten into staging and the reduce-scatter. Where waiting for a collective
        blocks the host (`Device.host_waits_for_collectives`: the CPU-only backend) the rest, from the
        reduced shard on, is completed later, in bucket order (`_complete_launches`), so backward goes on
        while the ranks exchange the bucket; elsewhere the wait is a stream's and it completes at once."""
        dev, comm = self.backend, self.comm
        t0 = time.perf_counter()
        # its earlier launch's shard is read below (`carry`): that reduction must have landed
        nested = self._complete_launches(only_done=not carry)  # timed by the completions themselves
        if dev.enabled("launch: waits for the bucket's host tasks") and not b.idle.is_set():
            self.worker.wait_event(b.idle)  # last step's tasks still read this bucket's landing buffer
            self.counters.add(launch_wait_s=time.perf_counter() - t0)
            t0 = time.perf_counter()
        # the slots whose parameter holds a gradient now, and those gradients (per-slot facts read from
        # the bucket's lists: this runs once per bucket on the training thread)
        held = [i for i, f in enumerate(b.mark_present(keep=carry)) if f]
        b.launched = True
        index, grads = b.slot_index, [b.slot_params[i].grad for i in held]
        adopted = self._adopted  # a split parameter's gradient is taken once, by its first piece
        dev.adopt_grads([g for i, g in zip(held, grads, strict=True) if index[i] not in adopted])
        adopted.update([index[i] for i in held])
        # carried pieces of a split parameter whose gradient was kept (its later pieces had not launched):
        # the gradient still holds what landed then, plus the new passes', so it replaces the carried part
        resent = [pc for pc in b.slots if b.kept.get(pc.index) == self._grad_gen[pc.index]] if carry else []
        b.kept = {}
        side = self.side_stream
        dev.wait_stream(side, dev.current_stream(), "launch: side stream waits for the gradients")
        prev = self._carried_shard(b) if carry else None  # before the flatten or the reduction overwrite it
        flat, shard, slot = self._grad_target(b)
        if slot is not None:
            nested += self._complete_launches(slot=slot)  # a reduction still reading this staging slot
            dev.wait_event(side, self.ring.free_event[slot], "launch: staging slot free")
        with dev.stream(side):
            for pc in resent:
                if (o := pc.overlap(b.lo, b.hi)) is not None:
                    prev[o[0] - b.lo: o[1] - b.lo].zero_()
            # one foreach call each over cached views, not a copy (and two view ops) per parameter; a
            # whole parameter's gradient copies in its own shape
            views = b.flat_views(flat)
            if held:  # the copy into fp32 staging is the device cast
                src = [g if b.slot_whole[i] else b.slots[i].grad_view() for i, g in zip(held, grads, strict=True)]
                torch._foreach_copy_([views[i] for i in held], src)
            if len(held) < len(views):
                has = set(held)
                torch._foreach_zero_([v for i, v in enumerate(views) if i not in has])
            flat[b.layout.numel:].zero_()
            work = comm.reduce_scatter(shard, flat)
        # autograd's gradients are consumed: their memory returns once the side stream is done; a split
        # parameter's gradient is kept while its later pieces, in later buckets, still read it
        done = [k for k, i in enumerate(held) if b.slot_last[i]]
        if len(done) < len(held):
            b.kept = {index[i]: self._grad_gen[index[i]] for i in held if not b.slot_last[i]}
        dev.release_grads([grads[k] for k in done], read_on=(side,),
                          point="launch: gradients freed after the side stream")
        gen = self._grad_gen
        for k in done:
            i = held[k]
            b.slot_params[i].grad = None
            gen[index[i]] += 1
        adopted.difference_update([index[held[k]] for k in done])
        launch = InFlight(b, work, shard, slot, prev)
        self.counters.add(grad_launch_s=time.perf_counter() - t0 - nested)
        if work is not None and dev.host_waits_for_collectives:
            self._in_flight.append(launch)
            self.counters.add(launches_in_flight=1)
        else:
            self._complete(launch)

    def _complete_launches(self, only_done: bool = False, slot: int | None = None) -> float:
        """Complete launched buckets whose reduce-scatter was left in flight, oldest first (bucket order,
        the same on every rank, so the host worker's tasks and all-gathers keep one order): all of them;
        with `only_done`, those already reduced; with `slot`, until none still reads that staging slot.
        Returns the seconds it took."""
        q, t0 = self._in_flight, time.perf_counter()
        while q:
            if only_done and not q[0].work.is_completed():
                break
            if slot is not None and all(f.slot != slot for f in q):
                break
            self._complete(q.popleft())
        return time.perf_counter() - t0

    def _complete(self, f: InFlight) -> None:
        """A launch from the reduced shard on: the norm, the copy to the host, the speculative step."""
        dev, side, b, shard = self.backend, self.side_stream, f.bucket, f.shard
        t0 = time.perf_counter()
        with dev.stream(side):
            self.comm.wait(f.work)
            t1 = time.perf_counter()
            if b.tail is not None and shard is not b.tail["grad"]:
                b.tail["grad"].copy_(shard)  # reduced in the training precision; the tail steps in fp32
            reduced = shard
            if f.prev is not None:
                reduced = b.tail["grad"] if b.tail is not None else shard
                reduced.add_(f.prev)
                dev.hold_for(f.prev, (side,))  # freed when this returns: not reused before the add ran
            self.norms.compute(dev.kernels, b.index, b.layout, reduced)
            dev.record(b.flat_ready, side, "launch: gradient flattened")
        if b.host is not None:
            self._land(b, shard, f.slot)
        elif f.slot is not None:
            dev.record(self.ring.free_event[f.slot], side, "launch: staging slot read")
        self.counters.add(grad_launch_s=time.perf_counter() - t1, reduce_wait_s=t1 - t0)
        if b.host is not None and self.step_state.speculating:
            scale, hps = self._unscale(), self._current_hps()  # the clip factor assumed 1
            b.spec = Speculation(queued=True, scale=scale, hps=hps)
            steps = b.steps_snapshot(self.steps)
            b.submit(lambda: b.speculate(scale, hps, steps), "speculate")

    def _carried_shard(self, b: Bucket) -> torch.Tensor:
        """A copy of the bucket's reduced shard from its earlier launch this step, on the side stream
        (from the host landing buffer when the device is discrete)."""
        dev, side = self.backend, self.side_stream
        src = b.tail["grad"] if b.tail is not None else b.host.landing
        with dev.stream(side):
            if b.tail is None and not dev.shares_host_memory:
                dev.wait_event(side, b.d2h_event, "carry: the earlier shard landed")
                prev = dev.device_buffer_like(src, "staging")
                prev.copy_(src, non_blocking=True)
                return prev
            return src.clone()

    def _land(self, b: Bucket, shard: torch.Tensor, slot: int | None) -> None:
        """The gradient shard and its norm to the host (a copy stream; nothing to copy when the device
        is the host)."""
        dev = self.backend
        h = b.host
        if h.landing is shard:
            with dev.stream(self.side_stream):
                h.norm_host.copy_(self.norms.of_bucket(b.index))
                dev.record(b.d2h_event, self.side_stream, "launch: gradient landed")
            if slot is not None:
                dev.record(self.ring.free_event[slot], self.side_stream, "launch: staging slot read")
            return
        d2h = self.d2h_stream
        dev.wait_event(d2h, b.flat_ready, "launch: D2H waits for the flattened shard")
        with dev.stream(d2h):
            h.landing.copy_(shard, non_blocking=True)
            h.norm_host.copy_(self.norms.of_bucket(b.index), non_blocking=True)
        if slot is not None:
            dev.record(self.ring.free_event[slot], d2h, "launch: staging slot read")
        dev.record(b.d2h_event, d2h, "launch: gradient landed")
        self.counters.add(bytes_d2h=shard.numel() * shard.element_size(), d2h_copies=2)  # the shard and its norm

    def _unscale(self) -> float:
        """Factor from the reduced gradient to the true one: 1/loss_scale, and 1/world for a mean."""
        mean = self.comm.world if self.config.gradient_reduction == "mean" else 1
        return 1.0 / (self.loss_scale.scale * mean)

    # ============================================================================================
    # validation and the end of the step
    # ============================================================================================
    def _global_norm_sq(self) -> tuple[float, int]:
        """(Σ over buckets and ranks of the shards' squared norms, number of non-finite shards): one
        all-reduce in fp64 on the device, then the step's one host synchronization."""
        dev = self.backend
        self._complete_launches()  # already done at the end of backward; a norm is never read half-reduced
        dev.wait_stream(dev.current_stream(), self.side_stream, "validate: compute waits for the bucket norms")
        stats = self.norms.stats()
        if self.comm.sharded:  # replicated, every rank summed every rank's part (norms.py): nothing to reduce
            self.comm.all_reduce_sum(stats)
        with dev.allow_sync():
            total2, nonfinite = dev.to_host(stats).tolist()
        return total2, int(nonfinite)

    def _reduced_norm(self) -> tuple[float, int]:
        """This step's global (Σ norm², non-finite count), reduced once: asked early by
        `step_grad_norm` (a clip_grad_norm_ before step()), then used by validation."""
        if self.step_state.norm is None:
            self.step_state.norm = self._global_norm_sq()
        return self.step_state.norm

    def step_grad_norm(self, clip: float | None = None) -> float:
        """This step's global gradient norm (after unscaling; nan when not finite), before step() applies
        it; every bucket must have been launched. `clip` > 0 clips this step at that threshold too (the
        smaller of it and `grad_clip` holds), exactly as `grad_clip` does under speculation."""
        with self.backend.tracking():
            total2, nonfinite = self._reduced_norm()
        if clip is not None and clip > 0:
            asked = self.step_state.step_clip
            self.step_state.step_clip = clip if asked is None else min(asked, clip)
        return math.sqrt(total2) * self._unscale() if nonfinite == 0 else float("nan")

    def _validate_and_apply(self) -> bool:
        t0 = time.perf_counter()
        total2, nonfinite = self._reduced_norm()
        self.step_state.norm = None
        clip = self.config.grad_clip
        if self.step_state.step_clip is not None:
            clip = min(clip, self.step_state.step_clip) if clip > 0 else self.step_state.step_clip
            self.step_state.step_clip = None
        finite = nonfinite == 0
        unscale = self._unscale()
        self.last_grad_norm = math.sqrt(total2) * unscale if finite else float("nan")
        coef = 1.0
        if finite and clip > 0:
            coef = min(clip / (self.last_grad_norm + 1e-6), 1.0)  # torch.nn.utils.clip_grad_norm_'s epsilon
        self.last_clip_coef = coef
        scale = unscale * coef
        skip = not finite and self.config.skip_nonfinite
        hps = self._current_hps()
        self.counters.add(validate_wait_s=time.perf_counter() - t0)
        speculated = any(b.spec.queued for b in self.buckets)
        needs_rollback = skip or coef != 1.0
        # two phases on the worker: first every bucket's weights, in the order the next forward needs them
        # (the last-arriving buckets, i.e. the first layers, first); then the deferred commit passes in the
        # order the next backward needs their landing buffers back (the first-arriving bucket first)
        host = [b for b in self.buckets if b.host is not None]
        for b in reversed(host):
            kind = self._decide(b.spec, skip, finite, scale, hps)
            if kind is not Finalize.NOTHING:
                b.expect_upload()
            steps, spec = b.steps_snapshot(self.steps), b.spec.queued
            b.submit(lambda b=b, kind=kind, steps=steps, spec=spec: b.finalize(kind, scale, hps, steps, spec),
                     kind.value)
        for b in host:
            b.submit(b.commit_state, "commit pass")
        if not skip:
            self._step_device_buckets(scale, hps)
            for i in set().union(*(b.present_indices for b in self.buckets)):  # once per split parameter
                self.steps[i] += 1
        self._note_nonfinite(skip)
        self.loss_scale.update(found_nonfinite=not finite)
        self._recent_rollbacks.append(needs_rollback)
        self._count(speculated, skip, coef != 1.0, needs_rollback)
        return not skip

    def _note_nonfinite(self, skipped: bool) -> None:
        """Skipped steps are loud when they go on: NonFiniteError after `max_consecutive_skips` in a row, or at
        once for an fp16 overflow with the loss scale already at its minimum (raised by step() when done)."""
        self._skips_in_row = self._skips_in_row + 1 if skipped else 0
        cfg, ls = self.config, self.loss_scale
        limit = cfg.max_consecutive_skips
        if skipped and ls.enabled and cfg.loss_scale.raise_at_min_scale and ls.scale <= cfg.loss_scale.min_scale:
            self._nonfinite_error = (f"step {self.global_step + 1}: fp16 gradients overflow with the loss scale at "
                                     f"its minimum ({ls.scale:g}): the weights or the data hold NaN/Inf, or the "
                                     f"learning rate is too high (set loss_scale.raise_at_min_scale: false to keep "
                                     f"skipping)")
        elif limit and self._skips_in_row >= limit:
            self._nonfinite_error = (f"{self._skips_in_row} consecutive optimizer steps (to step "
                                     f"{self.global_step + 1}) had non-finite gradients (NaN/Inf) and were skipped: "
                                     f"the weights are unchanged since; the data or the weights hold NaN/Inf, or the "
                                     f"learning rate is too high (max_consecutive_skips: {limit}; 0 never raises)")

    @staticmethod
    def _decide(spec: Speculation, skip: bool, finite: bool, scale: float,
                hps: dict[int, HyperParams]) -> Finalize:
        """The one decision per bucket. A speculation stands only if it used the final inputs; a shard
        that was not finite was not speculated at all (so with skip_nonfinite off it is redone)."""
        if skip:
            return Finalize.NOTHING
        if spec.queued and finite and spec.scale == scale and spec.hps == hps:
            return Finalize.COMMIT
        return Finalize.REDO

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

    def _step_device_buckets(self, scale: float, hps: dict[int, HyperParams]) -> None:
        """Tail buckets step on the device (compute stream, after validation): Adam on the shards, one call per
        (parameter group, step count) over every tail bucket's slices, then each shard cast into the flat
        weights and all-gathered across ranks."""
        t0 = time.perf_counter()
        dev, o = self.backend, self.config.optimizer
        tails = [b for b in self.buckets if b.tail is not None]
        slices: dict[tuple[int, int], list[tuple[dict[str, torch.Tensor], slice]]] = {}
        for b in tails:
            present = b.present_indices
            for start, end, members in runs(b.slots, lambda s, present=present: (
                    (s.group, self.steps[s.index]) if s.index in present else None), b.lo, b.hi):
                key = (members[0].group, self.steps[members[0].index])
                slices.setdefault(key, []).append((b.tail, slice(start - b.lo, end - b.lo)))
        amsgrad = bool(tails) and "max_exp_avg_sq" in tails[0].tail
        for (group, step), parts in slices.items():
            hp = hps[group]
            dev.kernels.adam_steps(
                *([t[k][sl] for t, sl in parts] for k in ("master", "grad", "exp_avg", "exp_avg_sq")),
                [t["max_exp_avg_sq"][sl] for t, sl in parts] if amsgrad else None,
                step=step + 1, lr=hp.lr, beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps,
                weight_decay=hp.weight_decay, adamw=o.adamw, bias_correction=o.bias_correction, grad_scale=scale)
        for b in tails:
            with torch.no_grad():
                b.home[b.lo: b.hi].copy_(b.tail["master"])
            b.gather = self.comm.all_gather(b.home, b.home[b.lo: b.hi], worker=False)
        self.counters.add(device_step_s=time.perf_counter() - t0)

    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        self._check_usable()

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        buckets = self._module_buckets.get(module)
        if not buckets:
            return
        dev = self.backend
        cur = dev.current_stream()
        for b in buckets:
            if dev.enabled("forward: waits for the upload count") and not b.uploaded.is_set():
                self.worker.wait_event(b.uploaded)
            if b.gather is not None:
                self.comm.wait(b.gather)
                b.gather = None
            dev.wait_event(cur, b.upload_event, "forward: waits for its buckets' weights")

    # ============================================================================================
    # checkpoints and stats
    # ============================================================================================
    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (shards of fp32 master, moments), step counts, param-group
        hyper-parameters, the loss scale, the bucket layout and, mid-accumulation, the partial gradients:
        everything for a bit-exact resume (`superoffload.engine.checkpoint` reads it)."""
        self._check_usable()
        if not self.step_state.backward_done:
            self._adopt_user_weight_changes()
        return ckpt.engine_state_dict(self)

    def load_state_dict(self, sd: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from `state_dict()` output: one rank's dict at the same world size, or the list of every
        rank's dicts (any world size: the state is re-sharded). Older per-parameter dicts load too."""
        self._check_usable()
        ckpt.load_engine_state_dict(self, sd)

    def load_model_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load model weights (e.g. a pretrained checkpoint) into the engine: each trained parameter's
        fp32 master takes the given values exactly (not rounded through the device precision first), the
        device weights are their cast, Adam's moments and step counts are kept (as
        `model.load_state_dict` followed by torch.optim would). Buffers and frozen parameters are
        loaded as `model.load_state_dict` loads them. Call it on every rank."""
        self._check_usable()
        self.synchronize()
        trained = {s.name: s for s in self.slots}
        rest = {k: v for k, v in sd.items() if k not in trained}
        missing, unexpected = self.model.load_state_dict(rest, strict=False)
        missing = [k for k in missing if k not in trained]
        if strict and (missing or unexpected):
            raise KeyError(f"load_model_state_dict: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")
        with torch.no_grad():
            for name, s in trained.items():
                if name not in sd:
                    continue
                value = sd[name].detach().to("cpu", torch.float32).reshape(-1)
                if value.numel() != s.numel:
                    raise ValueError(f"{name}: {value.numel()} elements in the state_dict, {s.numel} in the model")
                self.write_master(s, value)
        if self.all_buckets():
            ckpt.publish_masters(self)
        self._versions = self._weight_versions()

    def save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict | None = None,
                        save_latest: bool = True) -> str:
        """This rank's `state_dict()`, the model's buffers and frozen parameters, and `client_state` into
        `save_dir/tag/rank{r}.pt` (tag default `global_step<N>`), and the tag into `save_dir/latest` (unless
        `save_latest=False`), written atomically. Call it on every rank."""
        return ckpt.save_checkpoint(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, *, weights_only: bool = False,
                        strict: bool = True) -> tuple[str, dict]:
        """Resume from `save_checkpoint`'s directory (the `latest` tag by default): this rank's file at
        the same world size, every rank's files at another. `weights_only`: the model's weights (the fp32
        masters) and buffers only; the optimizer's moments and steps stay. Returns (path, client_state)."""
        return ckpt.load_checkpoint(self, load_dir, tag, weights_only=weights_only, strict=strict)

    @property
    def stats(self) -> dict[str, Any]:
        c = self.counters.snapshot()
        host = [b for b in self.buckets if b.host is not None]
        dev = [b for b in self.buckets if b.tail is not None]
        extra = {"weight_flow": self.flow.stats()} if self.flow is not None else {}
        if self._plain is not None:  # superoffload.AdamW: what the engine learned of the loop
            extra["plain_loop"] = {"predicted_passes": self._plain.predicted(), "overruns": self._plain.overruns}
        tail_bytes = sum(t.numel() * t.element_size() for b in dev for t in b.tail.values())
        window = self._recent_rollbacks
        recent = sum(window) / len(window) if window else 0.0
        return {
            "buckets_host": len(host), "buckets_device": len(dev),
            "upload_slots": len(self.upload_ring) if self.upload_ring is not None else 0,
            # the upload ring's slot reuses, those that found the slot's previous H2D still running, and the
            # host time spent waiting for them (a starved ring: waits near uses, wait_s a share of the step)
            "upload_ring": {"uses": int(c.pop("upload_slot_uses", 0)), "waits": int(c.pop("upload_slot_waits", 0)),
                            "wait_s": c.pop("upload_slot_wait_s", 0.0)} if self.upload_ring is not None else None,
            "bucket_size": self.config.bucket_size, "params": sum(s.numel for s in self.slots),
            "world_size": self.comm.world, "rank": self.comm.rank,  # the record's system_stats keys
            "device_tail_params": sum(b.layout.numel for b in dev),
            "device_tail_bytes": tail_bytes,
            "host_state_bytes": sum(a.nbytes for a in self.builder.arenas if a.category == "optimizer_state"),
            "pinned_bytes": sum(a.nbytes for a in self.builder.arenas if a.pinned),
            "layout_measured": self.layout_measured,
            "bytes": {"d2h": int(c.pop("bytes_d2h", 0)), "h2d": int(c.pop("bytes_h2d", 0))},
            "time_s": {**c, "host_worker_busy_s": self.worker.busy_s},
            # with speculation off nothing is rolled back: the rate of recent steps that clipped or skipped
            # (what a speculation would have had to redo) is reported apart, and the rollback rate is None
            "speculation": {**dict(self.spec_counts), "enabled": self.config.speculation,
                            "mode": self.config.rollback_mode,
                            "recent_rollback_rate": recent if self.config.speculation else None,
                            "recent_clip_or_skip_rate": recent,
                            "rollback_time_s": c.get("rollback_s", 0.0)},
            "loss_scale": self.loss_scale.scale if self.loss_scale.enabled else None,
            "last_grad_norm": self.last_grad_norm,
            "memory": self.backend.memory_report(),
            "config": self.config.to_dict(),
            **extra,
        }
