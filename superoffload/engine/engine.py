"""SuperOffloadEngine: the life of a bucket, one code path for CUDA, the simulated device and CPU-only.

Per optimizer step (docs/engine.md has the full account):
1. gradient ready: a post-accumulate-grad hook per parameter; buckets launch in bucket order as they
   complete (launch.py: one foreach copy into a flat buffer on the compute stream, then on a side stream
   the reduce-scatter across ranks, one norm per bucket (fp64-accumulated) and, for a host bucket, one D2H copy);
2. speculative host step: the worker waits for the D2H and steps the shard before the global norm is
   known, writing only buffers the model does not read (bucket.py);
3. device tail buckets keep their gradient shard, master and Adam state on the device (tail.py);
4. validation in `step()` (validate.py): the per-bucket norms' squares summed in fp64, one all-reduce,
   the step's one host synchronization, then the same decision on every rank for every bucket: commit,
   redo with the clip factor, or nothing (a skipped step);
5. parameter return: each host bucket's finalize task publishes its weights (H2D into the flat device
   buffer its parameters are views of, then an all-gather across ranks); the next forward waits once per
   module, on the last of its buckets to be published, never on a global barrier;
6. weight flow (`flow_layers`, weight_flow.py): flowed blocks' weights live in host stores that step 5
   writes, fetched before each use and released after. Weights written outside the engine: adopt.py.

What a training loop can observe follows torch: weights change only in step(); an exception in backward
leaves the engine where zero_grad() restores a clean state; misuse raises before any work.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from superoffload.device import get_device
from superoffload.engine import checkpoint as ckpt
from superoffload.engine import host_adam
from superoffload.engine.adopt import WeightWatch
from superoffload.engine.bucket import Bucket, HyperParams
from superoffload.engine.buffers import UploadRing
from superoffload.engine.build import BufferBuilder
from superoffload.engine.comm import Comm
from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.context import Counters, EngineContext
from superoffload.engine.deepspeed_names import DeepSpeedNames
from superoffload.engine.hooks import EngineHook
from superoffload.engine.launch import Launcher
from superoffload.engine.layout import ParamPiece, ParamSlot, plan_buckets
from superoffload.engine.loss_scale import DynamicLossScale
from superoffload.engine.norms import BucketNorms
from superoffload.engine.optimizer import OffloadOptimizer
from superoffload.engine.params import build_param_groups
from superoffload.engine.plain_loop import PlainLoop
from superoffload.engine.step_state import StepState
from superoffload.engine.tail import TailStep
from superoffload.engine.validate import Validator
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
    `engine.step()`) or "plain" (a plain `loss.backward()` and the optimizer's step(), plain_loop.py).

    Its parts, each in its own module: the device half of a bucket's life (`launch.Launcher`), the step's
    decision (`validate.Validator`) and the device tail's step (`tail.TailStep`), weights changed outside
    the engine (`adopt.WeightWatch`), the host half of a bucket's life (`bucket.Bucket`), buffers
    (`build.BufferBuilder`); the config and what they share live in one `context.EngineContext`."""

    def __init__(self, model: nn.Module, config: SuperOffloadConfig | dict | str | None = None,
                 param_groups: Any = None, process_group: Any = None, *,
                 optimizer: torch.optim.Optimizer | None = None, drive: str = "engine") -> None:
        if drive not in ("engine", "plain"):
            raise ValueError(f"drive must be 'engine' or 'plain', got {drive!r}")
        cfg = SuperOffloadConfig.from_any(config)
        device = get_device(cfg.device, cfg.hbm_budget_bytes)
        comm = Comm.create(process_group, replicate=cfg.replicate)
        worker = HostWorker(device)
        self.host_pool = host_adam.configure_pool(cfg.host_optimizer, not device.shares_host_memory, cfg.host_threads)
        self.ctx = EngineContext(config=cfg, device=device, comm=comm, worker=worker, counters=Counters(),
                                 dtype=torch_dtype(cfg.precision), upload_stream=device.new_stream("upload"),
                                 upload_staging=self._upload_staging)
        groups = self._collect_params(model, optimizer, param_groups)
        self.order = list(reversed(range(len(self.slots))))  # provisional: the usual arrival order
        # fp32 masters come from the weights as given, before the device copy is cast to `precision`;
        # each moves into its bucket's host state when the bucket is created (the builder takes them)
        self._pending_master: dict[int, torch.Tensor] = {}
        self.builder = BufferBuilder(self.ctx, pending_master=self._pending_master)
        self._flow_segment = flow_segments(model, cfg)  # a flowed parameter's block, by id (weight_flow.py)
        self._check_budgets()  # before anything is moved, cast or allocated
        self._pending_master.update({s.index: s.param.detach().to("cpu", torch.float32).reshape(-1).clone()
                                     for s in self.slots})
        self.model = place_in_precision(model, device.torch_device, self.dtype)
        offloader = getattr(model, "activation_offloader", None)  # checkpoints in host memory (sequence/)
        if offloader is not None and hasattr(offloader, "use_device"):
            offloader.use_device(device)
        self.optimizer: torch.optim.Optimizer = optimizer if optimizer is not None else OffloadOptimizer(self, groups)
        self._init_runtime()
        self.flow: WeightFlow | None = None
        self._flow_buckets: list[Bucket] = []
        if cfg.flow_layers:  # flowed blocks are laid out now: their weights flow from the first step
            self.flow = WeightFlow(self.model, cfg, device, comm, worker, self.slots)
            self.ctx.flow_sink = self.flow
            self.flow.check_tail_window(self.order, cfg.device_tail_buckets, cfg.bucket_size, measured=False)
            self._flow_buckets = self.builder.create(self.flow.layouts(comm.world))
            self.weights.add_buckets(self._flow_buckets)
            self.flow.start(self._flow_buckets)
            self.weights.flowed = {id(s.param) for s in self.slots if self.flow.owns(s.param)}
        self._install_hooks()
        self.plain: PlainLoop | None = PlainLoop(self) if drive == "plain" else None
        if self.plain is not None:
            self.launcher.plain = self._plain_grad
        # parameters the engine does not train that could still get a gradient: frozen when it was built
        # (those of the optimizer's groups when a plain loop drives it, else the model's)
        names = {id(p): n for n, p in model.named_parameters()}
        owned = {id(s.param) for s in self.slots}
        candidates = ([p for g in optimizer.param_groups for p in g["params"]] if drive == "plain" and optimizer
                      else list(model.parameters()))
        self._unowned = [(names.get(id(p), "?"), p) for p in dict.fromkeys(candidates) if id(p) not in owned]

    # --- what the parts share, read from the one context -----------------------------------------------
    @property
    def config(self) -> SuperOffloadConfig:
        return self.ctx.config

    @property
    def backend(self) -> Any:
        return self.ctx.device

    @property
    def comm(self) -> Comm:
        return self.ctx.comm

    @property
    def worker(self) -> HostWorker:
        return self.ctx.worker

    @property
    def dtype(self) -> torch.dtype:
        return self.ctx.dtype

    @property
    def counters(self) -> Counters:
        return self.ctx.counters

    @property
    def last_grad_norm(self) -> float:
        """The global gradient norm of the last step (after unscaling; nan when not finite)."""
        return self.validator.last_grad_norm

    last_clip_coef = property(lambda self: self.validator.last_clip_coef)

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
        """The launcher, the validator, the weight watch and the state of steps and buckets."""
        cfg = self.config
        self.steps = [0] * len(self.slots)
        self.loss_scale = DynamicLossScale(cfg.loss_scale, enabled=cfg.precision == "fp16")
        self.micro = 0  # backward() calls so far
        self._window_micros = 0  # backward() calls in the current accumulation window
        self._boundary_override: bool | None = None  # set_gradient_accumulation_boundary()
        self.step_state = StepState()
        self.global_step = 0
        self.last_step_applied: bool | None = None  # False: the last step was skipped (non-finite gradients)
        self.layout_measured = False
        self.buckets: list[Bucket] = []
        self._module_waits: dict[nn.Module, list[Bucket]] = {}
        self.upload_ring: UploadRing | None = None
        self._upload_stage: torch.Tensor | None = None
        self._broken = ""
        self.launcher = Launcher(self.ctx, self.slots, self.step_state, self.steps, self.spec_inputs)
        self.validator = Validator(self.ctx, self.launcher, self.step_state, self.loss_scale, self.hyper_params)
        self.weights = WeightWatch(self.slots, self._pending_master, self.builder.homes, self.worker.drain)

    def _install_hooks(self) -> None:
        """Gradient-ready hooks per parameter, a forward pre-hook per module that owns parameters (it
        waits for their buckets), and the model's own (usability, load_state_dict, state_dict)."""
        self._hooks = [s.param.register_post_accumulate_grad_hook(EngineHook(self.launcher.hook)) for s in self.slots]
        self._hooks += [m.register_forward_pre_hook(EngineHook(self._pre_forward)) for m in self.model.modules()
                        if any(id(p) in self._slot_of for p in m.parameters(recurse=False))]
        self._hooks.append(self.model.register_forward_pre_hook(EngineHook(self._root_pre_forward)))
        self._hooks.append(self.model.register_load_state_dict_pre_hook(EngineHook(self._before_model_load)))
        self._hooks.append(self.model._register_state_dict_hook(EngineHook(self._model_state_dict_hook)))
        self.weights.written()

    def _plain_grad(self, idx: int) -> None:
        with self.backend.tracking():
            self.plain.on_grad(idx)

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
        self.weights.add_buckets(new)
        created.update({id(b.layout): b for b in new})
        self.buckets = [created[id(lay)] for lay in layouts]
        self.order, self.layout_measured = order, True
        norms = BucketNorms(self.backend, len(self.buckets), self.comm.world if self.comm.replicate else 1)
        self.launcher.bind(self.buckets, self.builder.staging_ring(self.buckets), norms)
        self.validator.tail = TailStep(self.ctx, self.buckets)
        self.upload_ring = self.builder.upload_ring(self.buckets)
        if self.dtype != torch.float32 and cfg.param_cast == "device" and not self.backend.shares_host_memory:
            self._upload_stage = self.backend.empty(max(b.shard_numel for b in self.buckets), torch.float32,
                                                   "staging")
        self._module_waits = self._forward_waits()
        self.weights.laid_out = True
        self.weights.written()

    def _forward_waits(self) -> dict[nn.Module, list[Bucket]]:
        """Per module that owns parameters, the buckets its forward waits for: one, the last of its host
        buckets to be published (finalize publishes in reverse bucket order, on one stream) or, with no
        host bucket, its last tail bucket; sharded, every bucket (each has its own all-gather)."""
        out = {}
        for m in self.model.modules():
            ks = sorted({k for p in m.parameters(recurse=False) if id(p) in self._slot_of
                         for k in self.slots[self._slot_of[id(p)]].buckets})
            if not ks:
                continue
            bs = [self.buckets[k] for k in ks]
            if self.comm.sharded or any(b.flowed for b in bs):
                out[m] = bs
                continue
            host = [b for b in bs if b.host is not None]
            tail = [b for b in bs if b.tail is not None]
            out[m] = ([host[0]] if host else []) + ([tail[-1]] if tail else [])
        return out

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
        self.ctx.config = cfg  # the one copy: the builder, buckets, launcher and validator read it there
        self.validator.reconfigured()
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
            self.weights.adopt()
            boundary = self.is_boundary
            factor = self.loss_scale.scale / self.config.grad_accum
            try:
                if boundary:
                    self.begin_boundary()
                if self.flow is not None:
                    self.flow.begin_backward()
                (loss * factor if factor != 1.0 else loss).backward()
                self.check_unowned_grads()
                if self.flow is not None:  # before the remaining buckets launch
                    self.flow.end_backward()
                if boundary:
                    self.end_backward()
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
        self.check_usable()
        self._check_native("step()")
        if not self.step_state.backward_done:
            if self._window_micros:
                return False  # between accumulation micro-batches, as DeepSpeed's step()
            raise RuntimeError("engine.step() at an accumulation boundary needs engine.backward() first")
        return self.finish_step()

    def finish_step(self) -> bool:
        """Validation and the end of the step, once every bucket has been launched (the engine's step(),
        and the plain-loop driver's)."""
        dev = self.backend
        with dev.tracking(), dev.hot_path():
            self.weights.adopt()
            applied = self.validator.validate_and_apply(self.buckets, self.steps, self.global_step)
            self.optimizer._opt_called = True  # tell torch LR schedulers an optimizer step happened
            self.step_state.backward_done = False
            self.global_step += 1
            self.last_step_applied = applied
            if self.flow is not None:
                self.flow.end_step()
        if not self.config.overlap_param_return:
            self.synchronize()
        msg = self.validator.take_error()
        if msg:  # the skipped step is complete: the engine stays usable
            raise NonFiniteError(msg)
        return applied

    def zero_grad(self) -> None:
        """Drop accumulated gradients and start a new accumulation window (as torch's zero_grad).

        After an exception in backward() this is what makes the engine usable again: the interrupted
        window is discarded as if its micro-batches had never been seen."""
        self._check_native("zero_grad()")
        self.drop_grads()
        self.micro -= self._window_micros
        self._window_micros = 0
        self.step_state.needs_zero_grad = False

    def drop_grads(self) -> None:
        with self.backend.tracking():
            self.launcher.drop_grads()

    def check_unowned_grads(self) -> None:
        """A parameter frozen when the engine was built that now has a gradient: torch (an optimizer over
        the same parameters) would train it, the engine has no buffers for it. Never a silently growing
        `.grad`: an error at the backward that gave it one."""
        got = [n for n, p in self._unowned if p.grad is not None]
        if got:
            raise RuntimeError(f"parameter(s) {', '.join(got[:5])}{' and more' if len(got) > 5 else ''} had "
                               f"requires_grad=False when the engine was built and now have a gradient: the engine "
                               f"does not train them (torch's AdamW over the same parameters would). Unfreeze them "
                               f"before building the engine or optimizer, or freeze them again and set .grad = None")

    def _check_native(self, what: str) -> None:
        if self.plain is not None:
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
    def check_usable(self) -> None:
        """Raises when the engine cannot go on: its host worker failed, or a multi-rank backward raised."""
        self.worker.check()
        if self._broken:
            raise RuntimeError(self._broken)

    def _check_ready_for_backward(self) -> None:
        self.check_usable()
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
        self.launcher.abort()
        self.reset_step()
        self.step_state.needs_zero_grad = True
        if self.flow is not None:
            self.flow.end_backward()
        if self.comm.active:
            self._broken = ("an exception in backward() left this rank's collectives out of step with the other "
                            "ranks; restart the job from a checkpoint")

    # ============================================================================================
    # weights: the engine's masters and the values written outside it (adopt.py)
    # ============================================================================================
    def pending_master(self, s: ParamSlot) -> torch.Tensor | None:
        """Parameter `s`'s whole fp32 master before its buckets exist (None once they do)."""
        return self._pending_master.get(s.index)

    def weights_written(self) -> None:
        """The engine itself wrote the weights (a load): they are not the user's changes to adopt."""
        self.weights.written()

    def adopt_weight_changes(self) -> None:
        """Weights written outside the engine since it last wrote them go into the fp32 masters."""
        self.weights.adopt()

    def write_master(self, s: ParamSlot, values: torch.Tensor) -> None:
        """This rank's part of parameter `s`'s fp32 master from its flat `values`."""
        self.weights.write_master(s, values)

    window_micros = property(lambda self: self._window_micros, doc="backward() calls in the current window")

    def restore_progress(self, global_step: int, micro: int, window_micros: int) -> None:
        """The step counters of a checkpoint."""
        self.global_step, self.micro, self._window_micros = int(global_step), int(micro), int(window_micros)

    def all_buckets(self) -> list[Bucket]:
        """Every bucket: the laid-out ones, or before the layout is measured, weight flow's (built at
        initialize)."""
        return [*self.buckets, *(b for b in self._flow_buckets if b not in self.buckets)]

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
    # the step in progress (the engine's backward and the plain-loop driver)
    # ============================================================================================
    def reset_step(self) -> None:
        """Forget the step in progress (the one place its flags and the buckets' launch state reset)."""
        self.launcher.reset()
        self.step_state.reset()

    def begin_boundary(self, speculate: bool = True) -> None:
        """The backward that completes an accumulation window begins: buckets launch as they fill."""
        self.reset_step()
        self.step_state.boundary = True
        self.step_state.speculating = speculate and self.validator.speculation_allowed()

    def end_backward(self) -> None:
        """The window's last backward ended: build the layout on the measuring step, launch what is left."""
        if not self.layout_measured:
            seen = set(self.step_state.arrival)
            with self.backend.allow_sync():  # once per run: the layout is built (and broadcast) here
                self.build_layout(self.step_state.arrival
                                  + [i for i in reversed(range(len(self.slots))) if i not in seen])
        self.launcher.launch_remaining()  # buckets with unused parameters, or the measuring step
        self.step_state.boundary = False
        self.step_state.backward_done = True

    def hyper_params(self) -> dict[int, HyperParams]:
        """Each param group's Adam hyper-parameters now."""
        return {gi: HyperParams(float(g["lr"]), float(g["betas"][0]), float(g["betas"][1]), float(g["eps"]),
                                float(g["weight_decay"]), self.group_amsgrad(g))
                for gi, g in enumerate(self.optimizer.param_groups)}

    def group_amsgrad(self, group: dict[str, Any]) -> bool:  # the engine holds max_exp_avg_sq, the group uses it
        return self.config.optimizer.amsgrad and bool(group.get("amsgrad", True))

    def spec_inputs(self) -> tuple[float, dict[int, HyperParams]]:
        return self.validator.spec_inputs()

    def step_grad_norm(self, clip: float | None = None) -> float:
        """This step's global gradient norm (after unscaling; nan when not finite), before step() applies
        it; every bucket must have been launched. `clip` > 0 clips this step at that threshold too (the
        smaller of it and `grad_clip` holds), exactly as `grad_clip` does under speculation."""
        with self.backend.tracking():
            return self.validator.step_grad_norm(clip)

    # ============================================================================================
    # forward: each module waits for its buckets' weights
    # ============================================================================================
    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        self.check_usable()

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        buckets = self._module_waits.get(module)
        if not buckets or torch._C._current_graph_task_id() != -1:
            return  # nothing to wait for, or a checkpoint's recompute inside backward (waited for before)
        ctx = self.ctx  # attributes, not the engine's properties: this runs once per module per forward
        dev = ctx.device
        cur = dev.current_stream()
        for b in buckets:
            if dev.enabled("forward: waits for the upload count") and not b.uploaded.is_set():
                ctx.worker.wait_event(b.uploaded)
            if b.gather is not None:
                ctx.comm.wait(b.gather)
                b.gather = None
            dev.wait_event(cur, b.upload_event, "forward: waits for its buckets' weights")

    # ============================================================================================
    # checkpoints and stats
    # ============================================================================================
    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (shards of fp32 master, moments), step counts, param-group
        hyper-parameters, the loss scale, the bucket layout and, mid-accumulation, the partial gradients:
        everything for a bit-exact resume (`superoffload.engine.checkpoint` reads it)."""
        self.check_usable()
        if not self.step_state.backward_done:
            self.weights.adopt()
        return ckpt.engine_state_dict(self)

    def load_state_dict(self, sd: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Resume from `state_dict()` output: one rank's dict at the same world size, or the list of every
        rank's dicts (any world size: the state is re-sharded). Older per-parameter dicts load too."""
        self.check_usable()
        ckpt.load_engine_state_dict(self, sd)

    def load_model_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load model weights (e.g. a pretrained checkpoint) into the engine: each trained parameter's
        fp32 master takes the given values exactly (not rounded through the device precision first), the
        device weights are their cast, Adam's moments and step counts are kept (as
        `model.load_state_dict` followed by torch.optim would). Buffers and frozen parameters are
        loaded as `model.load_state_dict` loads them. Call it on every rank."""
        self.check_usable()
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
        self.weights.written()

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
        if self.plain is not None:  # superoffload.AdamW: what the engine learned of the loop
            extra["plain_loop"] = {"predicted_passes": self.plain.predicted(), "overruns": self.plain.overruns}
        tail_bytes = sum(t.numel() * t.element_size() for b in dev for t in b.tail.values())
        recent = self.validator.recent_rate()
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
            "time_s": {**c, "host_worker_busy_s": self.worker.busy_s}, "host_pool": self.host_pool,
            # with speculation off nothing is rolled back: the rate of recent steps that clipped or skipped
            # (what a speculation would have had to redo) is reported apart, and the rollback rate is None
            "speculation": {**dict(self.validator.spec_counts), "enabled": self.config.speculation,
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
