"""SuperOffloadConfig: every engine knob, validated at `initialize` with messages that say what to change.

Accepted as a `SuperOffloadConfig`, a plain dict (nested dicts for `optimizer`, `loss_scale` and
`speculation_policy`), or a path to a JSON or YAML file holding such a dict.

Types are checked against the field annotations, so a wrong type names its key: `None` where a number
is needed, `speculation: "no"`, a list where a number is needed. Numbers written as strings are
converted when they parse exactly (PyYAML reads `lr: 1e-3` as the string "1e-3", a YAML 1.1 quirk);
every float must be finite. The knobs the planner also reasons about use the names and choices of
`superoffload.options`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from superoffload.options import CastSide, DeviceKind, HostOptimizer, Precision, RollbackMode

GradientReduction = Literal["mean", "sum"]


class ConfigError(ValueError):
    """A bad or contradictory configuration value."""


@dataclass(kw_only=True)
class OptimizerConfig:
    lr: float = 1e-3
    """learning rate (param groups may override it)"""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    adamw: bool = True
    """decoupled weight decay (AdamW) vs L2 added to the gradient (Adam)"""
    amsgrad: bool = False
    bias_correction: bool = True


@dataclass(kw_only=True)
class LossScaleConfig:
    """Dynamic loss scaling for fp16 (torch GradScaler semantics)."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    raise_at_min_scale: bool = True
    """a step that overflows with the scale already at min_scale raises NonFiniteError (DeepSpeed's
    raise_error_at_min_scale): the loss scale cannot rescue it"""


@dataclass(kw_only=True)
class SpeculationPolicy:
    """Speculate at a step only while at most `max_rollback_rate` of the last `window` validated steps
    needed a rollback or a skip. From scratch, clipping fires nearly every step and speculation would
    only cost time, so the engine validates first until the rate falls. Both paths give bit-identical
    results; the rule only picks the faster one. Every step's outcome counts, speculated or not."""

    window: int = 16
    max_rollback_rate: float = 0.25


@dataclass(kw_only=True)
class SuperOffloadConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    precision: Precision = "fp32"
    """dtype of the model's weights (and gradients) on the device"""
    bucket_size: int = 1 << 24
    """elements per bucket (16M fp32 = 64 MB, where a Superchip's C2C link saturates); a parameter never
    straddles buckets"""
    device_tail_buckets: int = 0
    """the last k buckets by gradient arrival keep grads + Adam state on the device and step there"""
    grad_clip: float = 0.0
    """global-norm clipping threshold; 0 = off"""
    grad_accum: int = 1
    """micro-batches per optimizer step"""
    gradient_reduction: GradientReduction = "mean"
    """across ranks: "mean" sums the ranks' gradients and multiplies by 1/world (DDP's average, for
    a loss that is a mean over the rank's batch); "sum" only sums (for a loss already divided by the
    global token count, as sequence parallelism uses)"""
    replicate: bool = False
    """with several ranks, every rank keeps the whole optimizer state and steps every bucket: each
    bucket's gradient is all-reduced and no weights are all-gathered (DDP's exchange, one collective per
    bucket instead of two) for world x the host memory and host Adam work per rank. False shards both
    over the ranks (ZeRO-style). Results are bit-identical either way; no effect on one rank"""
    speculation: bool = True
    """host steps run during backward, validated after (exact rollback)"""
    speculation_policy: SpeculationPolicy = field(default_factory=SpeculationPolicy)
    rollback_mode: RollbackMode = "deferred"
    """"deferred" (0 B/param extra, a commit pass after validation) or "full_copy" (12 B/param extra,
    out-of-place step, commit is a swap)"""
    grad_cast: CastSide = "device"
    """"device": cast to fp32 on the device, fp32 crosses the link; "host": bf16/fp16 crosses the link
    and the host kernel reads it (with several ranks they are also reduce-scattered in bf16/fp16; with
    "device" the reduction is in fp32)"""
    param_cast: CastSide = "host"
    """"host": the host kernel writes the bf16/fp16 copy, low precision crosses the link; "device":
    fp32 crosses the link and is cast on the device"""
    skip_nonfinite: bool = True
    """a NaN/Inf anywhere skips the whole step (all precisions)"""
    max_consecutive_skips: int = 16
    """this many steps in a row skipped for non-finite gradients make step() raise NonFiniteError (the run
    is not training); 0 never raises"""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    weight_decay_split: bool = True
    """default param groups: matrices decay; biases, norms and other 1-D params do not"""
    host_threads: int | None = None
    """host kernel threads; null: beside a discrete device (CUDA, sim) the CPUs of the affinity mask except
    the training thread's, GraceAdam's pool pinned to them (GRACE_ADAM_CPUS names them instead); on the
    CPU-only device GraceAdam's own default"""
    host_optimizer: HostOptimizer = "grace"
    """host Adam kernel: grace | torch (fused CPU AdamW) | cpuadam (DeepSpeed)"""
    overlap_param_return: bool = True
    """next forward waits per layer for its weights, not on a barrier in step()"""
    hbm_budget_bytes: int | None = None
    """budget the device tail state must fit (default: the device's memory; unlimited on the host)"""
    host_budget_bytes: int | None = None
    """budget the engine's host buffers (pinned transfer buffers, pageable optimizer state) must fit,
    checked before any work (default: this machine's physical memory)"""
    device: DeviceKind = "auto"
    """auto | cuda | host (CPU-only) | sim (the CUDA code path on a simulated device) | cpu (= host)"""
    staging_buffers: int = 2
    """device staging slots for host buckets' flat gradients (a ring; each the largest bucket's size)"""
    upload_slots: int = 0
    """how host buckets' new weights reach the device. 0: each host bucket has a pinned upload buffer of
    its shard's size (model-sized in all), which the speculative step fills during backward. k >= 1: a
    ring of k pinned slots, each the largest host shard: the first k buckets in forward order speculate
    into their slot during backward, the others step when step() publishes them (forward order,
    pipelined with the next forward). Results are bit-identical either way; the ring saves
    2-4 B/param of pinned host memory for host time at publish (the planner picks it when host memory
    binds)"""
    flow_layers: list[int] = field(default_factory=list)
    """indices into the model's list of blocks whose weights live in host memory, fetched before use"""
    flow_prefetch: int = 1
    """blocks fetched ahead of use, in forward and in backward order (0 = on demand)"""
    flow_module_list: str | None = None
    """dotted path of the nn.ModuleList of blocks; None = auto-detect"""

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_any(cls, cfg: SuperOffloadConfig | dict | str | os.PathLike | None) -> SuperOffloadConfig:
        if cfg is None:
            out = cls()
        elif isinstance(cfg, SuperOffloadConfig):
            out = cls.from_dict(cfg.to_dict())  # re-checked: fields may have been assigned since
        elif isinstance(cfg, dict):
            out = cls.from_dict(cfg)
        elif isinstance(cfg, (str, os.PathLike)):
            out = cls.from_dict(load_config_file(cfg))
        else:
            raise ConfigError(f"config must be a SuperOffloadConfig, a dict or a JSON/YAML path, "
                              f"got {type(cfg).__name__}")
        out.validate()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SuperOffloadConfig:
        return _build(cls, d, prefix="")

    def validate(self) -> None:
        """Value ranges and combinations (types were checked when the config was built)."""
        o = self.optimizer
        if not o.lr >= 0:  # torch.optim accepts 0 (a warm-up that starts from it)
            raise ConfigError(f"optimizer.lr must be >= 0, got {o.lr}")
        if not all(0.0 <= b < 1.0 for b in o.betas):
            raise ConfigError(f"optimizer.betas must be two numbers in [0, 1), got {list(o.betas)}")
        if not o.eps > 0:
            raise ConfigError(f"optimizer.eps must be > 0, got {o.eps}")
        if o.weight_decay < 0:
            raise ConfigError(f"optimizer.weight_decay must be >= 0, got {o.weight_decay}")
        if self.bucket_size < 1:
            raise ConfigError(f"bucket_size must be a positive integer (elements), got {self.bucket_size}")
        if self.device_tail_buckets < 0:
            raise ConfigError(f"device_tail_buckets must be an integer >= 0, got {self.device_tail_buckets}")
        if self.grad_clip < 0:
            raise ConfigError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if self.grad_accum < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {self.grad_accum}")
        if self.max_consecutive_skips < 0:
            raise ConfigError(f"max_consecutive_skips must be an integer >= 0 (0: never raise), got "
                              f"{self.max_consecutive_skips}")
        if self.staging_buffers < 1:
            raise ConfigError(f"staging_buffers must be an integer >= 1, got {self.staging_buffers}")
        if self.upload_slots < 0:
            raise ConfigError(f"upload_slots must be an integer >= 0 (0: one upload buffer per host bucket; "
                              f"k: a ring of k slots), got {self.upload_slots}")
        if self.host_optimizer != "grace" and o.amsgrad:
            raise ConfigError(f"amsgrad needs host_optimizer 'grace' (got {self.host_optimizer!r})")
        if self.host_optimizer == "torch" and not o.bias_correction:
            raise ConfigError("host_optimizer 'torch' always applies bias correction; use 'grace' or "
                              "set optimizer.bias_correction: true")
        if self.host_threads is not None and self.host_threads < 1:
            raise ConfigError(f"host_threads must be >= 1 or null, got {self.host_threads}")
        for key in ("hbm_budget_bytes", "host_budget_bytes"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be a positive byte count or null, got {value}")
        ls = self.loss_scale
        if self.precision != "fp16" and ls != LossScaleConfig():
            raise ConfigError(f"loss_scale only applies to precision 'fp16' (precision is "
                              f"{self.precision!r}); remove loss_scale or set precision: fp16")
        if not (ls.init_scale > 0 and ls.growth_factor > 1 and 0 < ls.backoff_factor < 1
                and ls.growth_interval >= 1 and ls.min_scale > 0):
            raise ConfigError("loss_scale needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                              "growth_interval >= 1, min_scale > 0")
        sp = self.speculation_policy
        if sp.window < 1 or not 0 <= sp.max_rollback_rate <= 1:
            raise ConfigError("speculation_policy needs window >= 1 and 0 <= max_rollback_rate <= 1")
        if any(i < 0 for i in self.flow_layers):
            raise ConfigError(f"flow_layers must be a list of block indices (integers >= 0), got {self.flow_layers}")
        if len(set(self.flow_layers)) != len(self.flow_layers):
            raise ConfigError(f"flow_layers lists a block more than once: {self.flow_layers}")
        if self.flow_prefetch < 0:
            raise ConfigError(f"flow_prefetch must be an integer >= 0 (blocks fetched ahead; 0 = on demand), "
                              f"got {self.flow_prefetch}")
        path = self.flow_module_list
        if path is not None and not all(path.split(".")):
            raise ConfigError(f"flow_module_list must be a dotted attribute path such as 'model.layers' (or "
                              f"null to auto-detect), got {path!r}")
        if self.precision == "fp32" and (self.grad_cast, self.param_cast) != ("device", "host"):
            # with fp32 weights there is nothing to cast; accept only the defaults to avoid a silent no-op
            raise ConfigError("grad_cast/param_cast choose where bf16/fp16 casts happen; with precision "
                              "'fp32' leave them at their defaults (grad_cast: device, param_cast: host)")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optimizer"]["betas"] = list(self.optimizer.betas)
        return d


# ------------------------------------------------------------------------------------------------
# typed construction
# ------------------------------------------------------------------------------------------------
def _build(cls: type, d: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the config"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
                          f"valid {prefix or 'top-level '}keys: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(prefix + name, value, hints[name]) for name, value in d.items()}
    return cls(**kwargs)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, prefix=key + ".")
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}; got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r} ({type(value).__name__})")
    if hint is int:
        return _int(key, value)
    if hint is float:
        return _float(key, value)
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    raise ConfigError(f"{key}: unsupported config type {hint!r}")  # a bug in this module


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{key} must be a number, got the string {value!r}") from None
    if not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return float(value)


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip()) if any(c in value for c in ".eE") else int(value.strip())
        except ValueError:
            raise ConfigError(f"{key} must be an integer, got the string {value!r}") from None
    if isinstance(value, float):
        if not (math.isfinite(value) and value == int(value)):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    return value


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a JSON or YAML config file (ConfigError when it is missing or does not parse)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config path {path} is a directory; pass the JSON or YAML file inside it")
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one clear line
        raise ConfigError(f"config file {path} could not be parsed: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data
