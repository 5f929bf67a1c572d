"""`superoffload.AdamW`: the SuperOffload engine as a `torch.optim.Optimizer`, for the loops people
already have (a plain torch loop, Accelerate, the Hugging Face Trainer, TRL):

    opt = superoffload.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, max_grad_norm=1.0, model=model)
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()          # buckets leave for the host, and are stepped there, as gradients arrive
        opt.step()               # validation (the one synchronization), then the weights return
        opt.zero_grad()

What torch.optim.AdamW takes, this takes (tensors or named tensors that require grad, or param groups;
per-group lr, betas, eps, weight_decay, amsgrad, maximize; the implementation flags as torch accepts them,
optim/arguments.py), and what it does, this does: `param_groups` that any `torch.optim.lr_scheduler`
drives (read at every step, so a change mid-run takes effect), several `backward()` calls before `step()`
summed, a gradient assigned to `.grad` stepped like one from backward (optim/grads.py), parameters without
a gradient not stepped, `state` and `state_dict()` in torch's schema (optim/state.py, optim/schema.py),
torch's state-dict and step hooks, closures, `copy.deepcopy` and pickling. What it adds: the fp32 master
weights and both moments live on the host; the host step runs during backward (speculation, validated
exactly, docs/engine.md); `max_grad_norm` clips by the global norm under that overlap, and so does
`torch.nn.utils.clip_grad_norm_` over the parameters it trains (optim/clip.py).

The engine consumes gradients during backward, so `p.grad` is None after `backward()` for the
parameters it trains (as under DeepSpeed ZeRO); `opt.grad_norm()` gives the step's global norm.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from superoffload.engine.config import ConfigError, SuperOffloadConfig, load_config_file
from superoffload.engine.engine import SuperOffloadEngine
from superoffload.optim import arguments, schema
from superoffload.optim import clip as clip_hook
from superoffload.optim.grads import GradTracker, claim
from superoffload.optim.planning import LAYOUT_KEYS, LazyPlan
from superoffload.optim.state import TorchState, foreign_engine_sd, own_engine_sd

FORMAT = 2  # the "superoffload_adamw" version of state_dict(); 1: the engine's dict alone (still loaded)


class _ParamHolder(nn.Module):
    """The parameters alone, when no model is given: names for the engine's checkpoints
    ("group{g}_{i}", by position, so two optimizers over equal parameters name them alike), and nothing
    to hook. Plain tensors that require grad are held as they are (torch's optimizers take them;
    `register_parameter` would want an nn.Parameter)."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        super().__init__()
        for gi, g in enumerate(groups):
            for i, p in enumerate(g["params"]):
                self._parameters[f"group{gi}_{i}"] = p


def _dtype_of(params: list[torch.Tensor]) -> str:
    kinds = {p.dtype for p in params if p.requires_grad}
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    if len(kinds) > 1:
        raise ConfigError(f"the parameters have several dtypes ({', '.join(sorted(str(k) for k in kinds))}); give "
                          f"precision='bf16' or 'fp32' to train them all in one")
    kind = next(iter(kinds), torch.float32)
    if kind not in names:
        raise ConfigError(f"parameters of dtype {kind} cannot be trained; use fp32 or bf16 weights")
    return names[kind]


def _device_of(params: list[torch.Tensor]) -> str:
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise ConfigError(f"the parameters are on several devices ({', '.join(sorted(map(str, devices)))}); "
                          f"move the model to one device first")
    dev = next(iter(devices))
    if dev.type == "cuda":
        if dev.index is not None and dev.index != torch.cuda.current_device():
            raise ConfigError(f"the parameters are on {dev} but the current CUDA device is "
                              f"{torch.cuda.current_device()}: call torch.cuda.set_device({dev.index}) first")
        return "cuda"
    if dev.type != "cpu":
        raise ConfigError(f"parameters on {dev} are not supported (cuda or cpu)")
    return "host"


def _refuse_wrapped(model: nn.Module | None) -> None:
    """DDP / FSDP reduce gradients themselves: under them the engine's own reduction would average twice
    (and they read the `.grad` the engine consumes)."""
    if model is None:
        return
    from torch.nn.parallel import DistributedDataParallel

    wrapped = isinstance(model, DistributedDataParallel) or type(model).__name__ in (
        "FullyShardedDataParallel", "FSDPModule") or any(type(m).__name__.startswith("FSDP") for m in model.modules())
    if wrapped:
        raise ConfigError(f"model= is wrapped in {type(model).__name__}: superoffload.AdamW reduces gradients across "
                          f"ranks and shards its state itself; pass the unwrapped model (and do not wrap it)")


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's interface over the SuperOffload engine.

    Beyond torch's arguments:
    - `max_grad_norm`: clip by the global gradient norm (0: off), exactly, under speculation;
    - `model`: the model the parameters belong to. With it, the next forward waits per layer for the
      weights a step returns (without it, `step()` waits for all of them), `model.state_dict()` waits
      for pending returns, the planner knows the model's shape, and weight flow can be used;
    - `config`: the engine config of `superoffload.initialize` (a dict, a JSON/YAML path or a
      SuperOffloadConfig) for everything but the optimizer's own hyper-parameters; `**options`
      override single keys (`precision="bf16"`, `speculation=True`, `device="sim"`, ...);
    - `plan`: fill the knobs not given from the planner for this machine and model, at the first step
      (optim/planning.py); `hardware`: the planner's profile (a preset name or a `superoffload calibrate`
      JSON; default: the preset of the device the parameters are on);
    - `process_group`: the ranks to shard over (default: torch.distributed's).

    Precision defaults to the parameters' dtype (bf16 weights train with fp32 masters on the host),
    the device to theirs. fp16 weights need loss scaling, which a plain `loss.backward()` cannot get:
    use bf16 (or `superoffload.initialize`, whose `engine.backward()` scales). With no parameter that
    requires grad there is no engine, and `step()` changes nothing (as torch's).
    """

    # torch's GradScaler calls step() of such an optimizer directly, after setting grad_scale/found_inf:
    # that is how a GradScaler is detected and refused instead of silently unscaling nothing
    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable[Any], lr: float | torch.Tensor = 1e-3,
                 betas: tuple[Any, Any] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False, foreach: bool | None = None,
                 capturable: bool = False, differentiable: bool = False, fused: bool | None = None,
                 max_grad_norm: float = 0.0, model: nn.Module | None = None,
                 config: SuperOffloadConfig | dict | str | os.PathLike | None = None, plan: bool = True,
                 hardware: str | None = None, process_group: Any = None, **options: Any) -> None:
        betas = arguments.check_hyperparameters(lr, betas, eps, weight_decay, foreach=foreach, capturable=capturable)
        if not (isinstance(max_grad_norm, (int, float)) and max_grad_norm >= 0):
            raise ValueError(f"max_grad_norm must be a number >= 0 (0 disables clipping), got {max_grad_norm!r}")
        # what a copy (deepcopy, pickle) is built with again; the groups carry the hyper-parameters
        self._init_kwargs = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                             "maximize": maximize, "foreach": foreach, "capturable": capturable,
                             "differentiable": differentiable, "fused": fused, "max_grad_norm": max_grad_norm,
                             "model": model, "config": config, "plan": plan, "hardware": hardware,
                             "process_group": process_group, **options}
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable, "fused": fused, "decoupled_weight_decay": True}
        self._engine: SuperOffloadEngine | None = None
        super().__init__(params, defaults)
        arguments.check_flags(fused, foreach, differentiable)
        arguments.check_no_duplicates(self.param_groups)
        all_amsgrad = arguments.check_groups(self.param_groups)
        self.state = TorchState(self)  # type: ignore[assignment]
        self.model = model
        self._superseded = ""
        self._loads = 0
        self._owned: frozenset[int] = frozenset()
        self._grads: GradTracker | None = None
        _refuse_wrapped(model)
        explicit = self._explicit_options(config, options, max_grad_norm)
        self._plan = LazyPlan(self, explicit, enabled=plan, hardware=hardware)
        trained = [p for p in dict.fromkeys(p for g in self.param_groups for p in g["params"]) if p.requires_grad]
        if trained:
            arguments.check_trainable(trained)
            cfg = self._config(explicit, trained, float(lr), betas, eps, weight_decay, all_amsgrad, model)
            self._build(cfg, model, process_group)
        self._built = True

    def _build(self, cfg: dict[str, Any], model: nn.Module | None, process_group: Any) -> None:
        """The engine over the trained parameters, and the facade's hooks on them."""
        e = SuperOffloadEngine(model if model is not None else _ParamHolder(self.param_groups), cfg,
                               process_group=process_group, optimizer=self, drive="plain")
        self._engine = e
        self._plan.attach(e)
        params = [s.param for s in e.slots]
        self._owned = frozenset(id(p) for p in params)
        group_of = {id(p): gi for gi, g in enumerate(self.param_groups) for p in g["params"]}
        self._grads = GradTracker(self, params, group_of)
        claim(self, params)
        clip_hook.install()
        clip_hook.register(self)

    # --- construction --------------------------------------------------------------------------------
    @staticmethod
    def _explicit_options(config: Any, options: dict[str, Any], max_grad_norm: float) -> dict[str, Any]:
        """The engine config keys the caller gave (a file, a dict or a SuperOffloadConfig, then keywords)."""
        if config is None:
            base: dict[str, Any] = {}
        elif isinstance(config, SuperOffloadConfig):
            base = config.to_dict()
        elif isinstance(config, dict):
            base = dict(config)
        elif isinstance(config, (str, os.PathLike)):
            base = load_config_file(config)
        else:
            raise ConfigError(f"config must be a dict, a JSON/YAML path or a SuperOffloadConfig, got "
                              f"{type(config).__name__}")
        out = {**base, **options}
        if "optimizer" in out:
            raise ConfigError("superoffload.AdamW takes lr, betas, eps, weight_decay and amsgrad as its own "
                              "arguments (per group in param groups, as torch.optim): remove the config's "
                              "'optimizer' block")
        if out.get("grad_accum", 1) != 1:
            raise ConfigError("grad_accum: with superoffload.AdamW the loop decides accumulation (several "
                              "backward() calls before step() sum, as in torch); remove grad_accum")
        out.pop("grad_accum", None)
        if max_grad_norm:
            if out.get("grad_clip", max_grad_norm) != max_grad_norm:
                raise ConfigError(f"max_grad_norm={max_grad_norm} and the config's grad_clip={out['grad_clip']} "
                                  f"disagree; give one of them")
            out["grad_clip"] = float(max_grad_norm)
        return out

    @staticmethod
    def _config(explicit: dict[str, Any], trained: list[torch.Tensor], lr: float, betas: Any, eps: float,
                weight_decay: float, amsgrad: bool, model: nn.Module | None) -> dict[str, Any]:
        device = _device_of(trained)
        if explicit.get("device") == "auto":
            explicit = {**explicit, "device": device}
        if explicit.get("device", "auto") not in ("auto", device) and not (
                explicit.get("device") == "sim" and device == "host") and not (
                explicit.get("device") == "cpu" and device == "host"):
            raise ConfigError(f"device={explicit['device']!r} but the parameters are on "
                              f"{'the GPU' if device == 'cuda' else 'the CPU'}: move the model first (the "
                              f"optimizer never moves parameters)")
        precision = explicit.get("precision") or _dtype_of(trained)
        if precision == "fp16":
            raise ConfigError("precision fp16 needs loss scaling, which a plain loss.backward() does not get: use "
                              "bf16, or superoffload.initialize (engine.backward() scales the loss)")
        if model is None:
            if explicit.get("overlap_param_return"):
                raise ConfigError("overlap_param_return needs model=: without the model there are no per-layer "
                                  "forward hooks to wait on, so step() waits for every returned weight")
            if explicit.get("flow_layers"):
                raise ConfigError("flow_layers needs model= (weight flow hooks the model's blocks)")
        defaults = {"device": explicit.get("device", device), "precision": precision,
                    "overlap_param_return": model is not None}
        return {**defaults, **explicit, "precision": precision,
                "optimizer": {"lr": lr, "betas": [float(b) for b in betas], "eps": eps,
                              "weight_decay": weight_decay, "adamw": True, "amsgrad": bool(amsgrad)}}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_built", False):
            raise RuntimeError("superoffload.AdamW: parameter groups are fixed at construction (the engine lays "
                               "out its buffers over them); give every group to the constructor")
        super().add_param_group(param_group)

    # --- the engine ---------------------------------------------------------------------------------
    @property
    def engine(self) -> SuperOffloadEngine:
        self._check_live()
        if self._engine is None:
            raise RuntimeError("superoffload.AdamW has no engine: none of its parameters required grad when it was "
                               "built")
        return self._engine

    @property
    def stats(self) -> dict[str, Any]:
        """The engine's stats: buckets, bytes moved, host time, speculation counters, memory, config."""
        return self.engine.stats

    @property
    def plan(self) -> Any:
        """The planner's Plan used for this optimizer's knobs (None before the first step, or when there
        was none to make); `plan_notes` says which knobs came from where."""
        return self._plan.plan

    @property
    def plan_notes(self) -> list[str]:
        return list(self._plan.notes)

    def owns(self, p: torch.Tensor) -> bool:
        """Whether `p` is one of the parameters this optimizer trains."""
        return id(p) in self._owned and not self._superseded

    def synchronize(self) -> None:
        """Wait for every pending weight return (needed before reading `param.data` directly after step()
        when a model was given)."""
        self.engine.synchronize()

    def close(self) -> None:
        """Stop the host worker and remove the engine's and the facade's hooks (the parameters keep their
        values)."""
        if self._grads is not None:
            self._grads.remove()
        self.engine.close()

    def supersede(self) -> None:
        """A later superoffload.AdamW took these parameters over (optim/grads.py `claim`)."""
        if self._superseded:
            return
        self.close()
        self._superseded = ("this superoffload.AdamW no longer trains its parameters: a superoffload.AdamW built later "
                            "over the same parameters took them over (one optimizer trains a parameter at a time: its "
                            "engine takes the gradients); use that one")
        clip_hook.unregister(id(self))

    def _check_live(self) -> None:
        if self._superseded:
            raise RuntimeError(self._superseded)

    # --- torch.optim.Optimizer -----------------------------------------------------------------------
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One optimizer step over the gradients since the last one: those of the backward passes and any
        assigned to `.grad` (a no-op when there were none, as in torch). With a closure: it is called
        (with grad enabled) first, and its loss returned."""
        clip_hook.wrap_accelerate()  # accelerate imported after this optimizer was built (optim/clip.py)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if hasattr(self, "found_inf") or getattr(self, "grad_scale", None) is not None:
            raise RuntimeError("superoffload.AdamW under a torch GradScaler: the engine takes gradients during "
                               "backward, so the scaler can neither unscale nor check them. Train in bf16 "
                               "(precision='bf16'; Accelerate mixed_precision='bf16') without a GradScaler")
        self._check_live()
        e = self._engine
        if e is None:
            self._check_untrained_grads()
            return loss
        arguments.check_groups(self.param_groups, e.config.optimizer.amsgrad)
        self._check_unfrozen()
        e.check_usable()
        if self.state.edited():
            self._push_state_edits()
        try:
            self._grads.replay([s.param for s in e.slots])
            with torch.no_grad():
                self._plan.before_first_step()
                e.plain.step()
        finally:
            self.state.invalidate()
            self._grads.after_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Discard the gradients since the last step (torch's zero_grad). set_to_none=False zeroes the
        gradients still held in `.grad` instead of dropping them."""
        self._check_live()
        for p in (p for g in self.param_groups for p in g["params"]):
            if p.grad is not None and not self.owns(p):  # not the engine's: as torch does
                if set_to_none:
                    p.grad = None
                    continue
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
        e = self._engine
        if e is None:
            return
        self._grads.forget()
        if set_to_none:
            e.plain.zero_grad()
        else:
            with torch.no_grad():
                held = [s.param.grad for s in e.slots if s.param.grad is not None]
                e.plain.zero_grad(keep_grads=True)
                for g in held:
                    g.zero_()
        if self.state.edited():  # the window is new: nothing has read the state yet
            self._push_state_edits()

    def grad_norm(self) -> float:
        """This step's global gradient norm, before step() applies it (nan when not finite, 0.0 when no
        gradient arrived): every bucket is launched now if it was not already."""
        return float(self._clip(None))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over every parameter this optimizer trains: this step is
        clipped at `max_norm` (with `max_grad_norm` also set, the smaller threshold holds) when step()
        applies it, exactly, and the pre-clip global norm is returned."""
        if float(norm_type) != 2.0:
            raise ValueError(f"superoffload.AdamW clips by the L2 norm; norm_type={norm_type} is not supported")
        norm = self._clip(float(max_norm))
        if error_if_nonfinite and not torch.isfinite(torch.tensor(norm)):
            raise RuntimeError("The total norm of order 2.0 for gradients from `parameters` is non-finite, so it "
                               "cannot be clipped. To disable this error and scale the gradients by the "
                               "non-finite norm anyway, set `error_if_nonfinite=False`")
        return torch.tensor(norm)

    def _clip(self, max_norm: float | None) -> float:
        e = self.engine
        e.check_usable()
        self._check_unfrozen()
        self._grads.replay([s.param for s in e.slots])  # assigned gradients count in the norm, as in torch
        if not e.plain.has_gradients:
            return 0.0
        with torch.no_grad():
            self._plan.before_first_step()
            e.plain.complete()
            return e.step_grad_norm(max_norm)

    # --- state dicts ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's schema (`state` by parameter index with `step`, `exp_avg`, `exp_avg_sq`[,
        `max_exp_avg_sq`]; `param_groups` with every hyper-parameter and the parameters' indices), torch's
        hooks run around it, and the engine's part beside it: this rank's fp32 masters and moments (the
        same tensors as the torch part's), the step counts, the loss scale, the bucket layout and the knobs
        it was built with. Before the first step the engine's part is None (no tensors, like torch's
        state: the weights are the masters). torch.optim.AdamW loads it (it ignores the extra keys)."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        sd = self._pack()
        for hook in self._optimizer_state_dict_post_hooks.values():
            result = hook(self, sd)
            if result is not None:
                sd = result
        return sd

    def _pack(self) -> dict[str, Any]:
        self._check_live()
        sd = schema.pack(self.param_groups, self.state)
        e = self._engine
        if e is None:
            return sd
        if e.global_step == 0 and not e.layout_measured and not self._loads:
            return {**sd, "engine": None, "superoffload_adamw": FORMAT}
        snap = self.state.snapshot(keep=False)
        knobs = {k: getattr(e.config, k) for k in LAYOUT_KEYS}  # a resume builds the same buckets with them
        return {**sd, "engine": snap.engine_sd, "engine_config": knobs, "superoffload_adamw": FORMAT}

    def load_state_dict(self, state_dict: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Load a state dict of this optimizer or of `torch.optim.AdamW` (torch's hooks run around it, the
        groups' hyper-parameters are the loaded ones; optim/state.py says where the masters come from), or
        the list of every rank's state dicts of a run at another world size (re-sharded; no hooks)."""
        self._check_live()
        if isinstance(state_dict, list):
            self._load_shards(state_dict)
            return
        self._load_state(state_dict, hooks=True)

    def _load_state(self, state_dict: dict[str, Any], hooks: bool) -> None:
        sd = state_dict.copy()  # shallow, as torch's: a pre-hook may edit it
        for hook in self._optimizer_load_state_dict_pre_hooks.values() if hooks else ():
            result = hook(self, sd)
            if result is not None:
                sd = result
        if sd.get("superoffload_adamw") == 1:
            self._load_format1(sd)
        else:
            groups, engine_state, rest = schema.unpack(self.param_groups, sd, self.owns)
            self._load_engine(sd, groups, engine_state)
            self.param_groups = groups
            self.state = TorchState(self, rest)  # type: ignore[assignment]
        self._loads += 1
        for hook in self._optimizer_load_state_dict_post_hooks.values() if hooks else ():
            hook(self)

    def _load_engine(self, sd: dict[str, Any], groups: list[dict[str, Any]],
                     engine_state: dict[torch.Tensor, dict[str, Any]]) -> None:
        e = self._engine
        if e is None:
            return
        arguments.check_groups(groups, e.config.optimizer.amsgrad)
        plain = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        with torch.no_grad():
            if sd.get("engine") is not None:
                self._plan.from_checkpoint(sd.get("engine_config", {}))
                self._engine_load(own_engine_sd(e, sd["engine"], plain, engine_state))
            else:
                loaded = foreign_engine_sd(e, plain, engine_state)
                if loaded is not None:
                    self._plan.from_checkpoint({})  # the layout is built now, in the usual arrival order
                    self._engine_load(loaded)
        self.state.invalidate()

    def _push_state_edits(self) -> None:
        """opt.state's tensors were edited in place: into the engine (the groups stay the very dicts)."""
        e, snap = self.engine, self.state.snapshot()
        plain = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        with torch.no_grad():
            self._engine_load(own_engine_sd(e, snap.engine_sd, plain, snap.by_param))
        self.state.invalidate()

    def _engine_load(self, sd: dict[str, Any] | list[dict[str, Any]]) -> None:
        """The engine's load, where torch's would be: the gradients in `.grad` stay (the engine's load
        drops them). Refused once this step's buckets may have left (the window's predicted last backward
        pass has begun, or the norm was taken): their speculative steps read the state this replaces."""
        e = self.engine
        if e.plain.boundary:
            raise RuntimeError("superoffload.AdamW: the optimizer state was loaded, or its opt.state tensors edited, "
                               "after this step's backward passes began: the engine steps speculatively during the "
                               "last one, from the state as it was then. Load or edit after step() or zero_grad(), "
                               "before the next backward()")
        held = [(s.param, s.param.grad) for s in e.slots if s.param.grad is not None]
        e.load_state_dict(sd)
        for p, g in held:
            p.grad = g

    def _load_shards(self, sds: list[dict[str, Any]]) -> None:
        """Every rank's state dicts (their engine parts, re-sharded to this engine's ranks and layout)."""
        parts = [d["engine"] for d in sds if isinstance(d, dict)]
        if len(parts) != len(sds) or any(p is None for p in parts):
            raise ValueError("load_state_dict of a list takes every rank's superoffload.AdamW state_dict, each taken "
                             "after the first step")
        first = sds[0]
        if first.get("superoffload_adamw") == FORMAT:
            groups, _, _ = schema.unpack(self.param_groups, first, self.owns)
            arguments.check_groups(groups, self.engine.config.optimizer.amsgrad)
            plain = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            parts = [{**p, "param_groups": plain} for p in parts]
            self.param_groups = groups
        self._plan.from_checkpoint(first.get("engine_config", {}))
        with torch.no_grad():
            self._engine_load(parts)
        self.state.invalidate()
        self._loads += 1

    def _load_format1(self, sd: dict[str, Any]) -> None:
        """A state dict of the first format (the engine's dict alone, or `fresh` before the first step)."""
        if sd["fresh"]:
            for g, saved in zip(self.param_groups, sd["param_groups"], strict=True):
                g.update(saved)
            return
        self._plan.from_checkpoint(sd.get("engine_config", {}))
        with torch.no_grad():
            self._engine_load(sd["engine"])
        self.state.invalidate()

    # --- copies --------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """What `copy.deepcopy` and pickle keep: the groups (with their tensors), the constructor's
        arguments (the model among them) and the packed state; a copy builds its own engine from them."""
        if self._init_kwargs.get("process_group") is not None or (self._engine is not None
                                                                  and self._engine.comm.active):
            raise TypeError("a superoffload.AdamW over several ranks cannot be copied or pickled (its engine holds a "
                            "process group): save its state_dict() instead")
        return {"param_groups": self.param_groups, "superoffload_init": self._init_kwargs,
                "superoffload_state": self._pack()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "superoffload_init" not in state:
            raise TypeError("superoffload.AdamW is restored from its own __getstate__ (copy.deepcopy, pickle); load a "
                            "state dict with load_state_dict()")
        AdamW.__init__(self, state["param_groups"], **state["superoffload_init"])
        self._load_state(state["superoffload_state"], hooks=False)

    def __repr__(self) -> str:
        return f"superoffload.{super().__repr__()}"

    # --- torch semantics the engine would otherwise break silently ----------------------------------
    def _check_untrained_grads(self) -> None:
        """No engine: a gradient on a parameter that did not require grad when the optimizer was built."""
        got = [i for i, p in enumerate(p for g in self.param_groups for p in g["params"]) if p.grad is not None]
        if got:
            raise RuntimeError(f"parameter(s) {got[:5]} had requires_grad=False when superoffload.AdamW was built "
                               f"and now have a gradient: the engine does not train them (torch's AdamW would). "
                               f"Build the optimizer after unfreezing them")

    def _check_unfrozen(self) -> None:
        e = self.engine
        flow = e.flow
        moved = [s for s in e.slots if s.param.device.type != e.device.type and not (flow and flow.owns(s.param))]
        if moved:
            raise RuntimeError(f"parameter(s) {', '.join(s.name for s in moved[:3])} moved to {moved[0].param.device} "
                               f"after superoffload.AdamW was built on {e.device}: build the optimizer after "
                               f"model.to(device)")
        e.check_unowned_grads()  # a parameter frozen at construction that got a gradient

    def take_clip_from_torch(self, params: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor,
                              norm_type: float, error_if_nonfinite: bool) -> None:
        """`torch.nn.utils.clip_grad_norm_(params, max_norm)` was called over parameters this optimizer
        trains (optim/clip.py): clip this step in the engine and make the returned norm the true one."""
        others = [p for p in params if id(p) not in self._owned and p.grad is not None]
        if others:
            raise RuntimeError(f"clip_grad_norm_ over {len(others)} parameter(s) with gradients that "
                               f"superoffload.AdamW does not train, together with ones it does: the norm would mix "
                               f"gradients it holds with ones it cannot see. Clip them separately")
        mine = {id(p) for p in params} & self._owned
        if len(mine) != len(self._owned):
            raise RuntimeError(f"clip_grad_norm_ over {len(mine)} of the {len(self._owned)} parameters "
                               f"superoffload.AdamW trains: it clips by the norm of all of them together; pass "
                               f"every one (e.g. model.parameters())")
        norm = self.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite)
        with torch.no_grad():
            total_norm.fill_(float(norm))
