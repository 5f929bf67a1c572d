"""SuperOffloadConfig: every engine knob, validated at `initialize` with messages that say what to change.

Accepted as a `SuperOffloadConfig`, a plain dict (nested dicts for `optimizer`, `loss_scale` and
`speculation_policy`), or a path to a JSON or YAML file holding such a dict.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")
ROLLBACK_MODES = ("deferred", "full_copy")
GRAD_CAST = ("device", "host")
PARAM_CAST = ("host", "device")
HOST_OPTIMIZERS = ("grace", "torch", "cpuadam")


class ConfigError(ValueError):
    """A bad or contradictory configuration value."""


@dataclass
class OptimizerConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    adamw: bool = True  # decoupled weight decay (AdamW) vs L2 added to the gradient (Adam)
    amsgrad: bool = False
    bias_correction: bool = True


@dataclass
class LossScaleConfig:
    """Dynamic loss scaling for fp16 (torch GradScaler semantics)."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0


@dataclass
class SpeculationPolicy:
    """Speculate at a step only while at most `max_rollback_rate` of the last `window` validated steps
    needed a rollback or a skip. From scratch, clipping fires nearly every step and speculation would
    only cost time, so the engine validates first until the rate falls. Both paths give bit-identical
    results; the rule only picks the faster one. Every step's outcome counts, speculated or not."""

    window: int = 16
    max_rollback_rate: float = 0.25


@dataclass
class SuperOffloadConfig:
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    precision: str = "fp32"  # dtype of the model's weights on the device
    bucket_size: int = 1 << 24  # elements per bucket (16M fp32 = 64 MB, where a C2C link saturates)
    device_tail_buckets: int = 0  # last k buckets by gradient arrival keep grads + Adam state on the device
    grad_clip: float = 0.0  # global-norm clipping threshold; 0 = off
    grad_accum: int = 1  # micro-batches per optimizer step
    speculation: bool = True  # host steps during backward, validated after (exact rollback)
    speculation_policy: SpeculationPolicy = field(default_factory=SpeculationPolicy)
    rollback_mode: str = "deferred"  # "deferred" (0 B/param extra, 2 passes) or "full_copy" (12 B, double-buffered)
    grad_cast: str = "device"  # "device": cast on device, fp32 D2H; "host": low-precision D2H, kernel casts
    param_cast: str = "host"  # "host": kernel writes bf16/fp16, low-precision H2D; "device": fp32 H2D + cast
    skip_nonfinite: bool = True  # a NaN/Inf anywhere skips the whole step (all precisions)
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    weight_decay_split: bool = True  # matrices decay; biases, norms and other 1-D params do not
    host_threads: int | None = None  # GraceAdam threads (default: its own default)
    host_optimizer: str = "grace"  # host Adam kernel: grace | torch (fused CPU AdamW) | cpuadam (DeepSpeed)
    overlap_param_return: bool = True  # next forward waits per layer, not on a barrier in step()
    hbm_budget_bytes: int | None = None  # budget for device tail state (CPU-only: the stand-in for HBM)
    device: str = "auto"  # auto | cuda | cpu
    # weight flow (docs/weight_flow.md): these blocks keep their weights in host memory, fetched before use
    flow_layers: list[int] = field(default_factory=list)  # indices into the model's list of blocks
    flow_prefetch: int = 1  # blocks fetched ahead of use, in forward and in backward order (0 = on demand)
    flow_module_list: str | None = None  # dotted path of the nn.ModuleList of blocks; None = auto-detect

    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_any(cls, cfg: SuperOffloadConfig | dict | str | os.PathLike | None) -> SuperOffloadConfig:
        if cfg is None:
            out = cls()
        elif isinstance(cfg, SuperOffloadConfig):
            out = dataclasses.replace(cfg)
        elif isinstance(cfg, dict):
            out = cls.from_dict(cfg)
        elif isinstance(cfg, (str, os.PathLike)):
            out = cls.from_dict(_load_file(Path(cfg)))
        else:
            raise ConfigError(f"config must be a SuperOffloadConfig, a dict or a JSON/YAML path, "
                              f"got {type(cfg).__name__}")
        out.validate()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SuperOffloadConfig:
        d = dict(d)
        nested = {"optimizer": OptimizerConfig, "loss_scale": LossScaleConfig,
                  "speculation_policy": SpeculationPolicy}
        kwargs: dict[str, Any] = {}
        for key, sub in nested.items():
            if key in d:
                val = d.pop(key)
                if not isinstance(val, dict):
                    raise ConfigError(f"'{key}' must be a mapping, got {type(val).__name__}")
                _check_keys(val, sub, prefix=f"{key}.")
                if key == "optimizer" and "betas" in val:
                    val = {**val, "betas": tuple(val["betas"])}
                kwargs[key] = sub(**val)
        _check_keys(d, cls)
        return cls(**kwargs, **d)

    def validate(self) -> None:
        o = self.optimizer
        if not o.lr > 0:
            raise ConfigError(f"optimizer.lr must be > 0, got {o.lr}")
        if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
            raise ConfigError(f"optimizer.betas must be two numbers in [0, 1), got {o.betas}")
        if not o.eps > 0:
            raise ConfigError(f"optimizer.eps must be > 0, got {o.eps}")
        if o.weight_decay < 0:
            raise ConfigError(f"optimizer.weight_decay must be >= 0, got {o.weight_decay}")
        _choice("precision", self.precision, PRECISIONS)
        _choice("rollback_mode", self.rollback_mode, ROLLBACK_MODES)
        _choice("grad_cast", self.grad_cast, GRAD_CAST)
        _choice("param_cast", self.param_cast, PARAM_CAST)
        _choice("device", self.device, ("auto", "cuda", "cpu"))
        if not isinstance(self.bucket_size, int) or self.bucket_size < 1:
            raise ConfigError(f"bucket_size must be a positive integer (elements), got {self.bucket_size!r}")
        if not isinstance(self.device_tail_buckets, int) or self.device_tail_buckets < 0:
            raise ConfigError(f"device_tail_buckets must be an integer >= 0, got {self.device_tail_buckets!r}")
        if self.grad_clip < 0:
            raise ConfigError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {self.grad_accum!r}")
        _choice("host_optimizer", self.host_optimizer, HOST_OPTIMIZERS)
        if self.host_optimizer != "grace" and self.optimizer.amsgrad:
            raise ConfigError(f"amsgrad needs host_optimizer 'grace' (got {self.host_optimizer!r})")
        if self.host_optimizer == "torch" and not self.optimizer.bias_correction:
            raise ConfigError("host_optimizer 'torch' always applies bias correction; use 'grace' or "
                              "set optimizer.bias_correction: true")
        if self.host_threads is not None and self.host_threads < 1:
            raise ConfigError(f"host_threads must be >= 1, got {self.host_threads}")
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
        self._validate_flow()
        if self.precision == "fp32" and (self.grad_cast, self.param_cast) != ("device", "host"):
            # with fp32 weights there is nothing to cast; accept only the defaults to avoid a silent no-op
            raise ConfigError("grad_cast/param_cast choose where bf16/fp16 casts happen; with precision "
                              "'fp32' leave them at their defaults")

    def _validate_flow(self) -> None:
        # the model-dependent checks (the list exists, indices in range) run when the engine sees the model
        layers = self.flow_layers
        if not isinstance(layers, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise ConfigError(f"flow_layers must be a list of block indices (integers >= 0), got {layers!r}")
        if len(set(layers)) != len(layers):
            raise ConfigError(f"flow_layers lists a block more than once: {list(layers)}")
        self.flow_layers = list(layers)
        pf = self.flow_prefetch
        if not isinstance(pf, int) or isinstance(pf, bool) or pf < 0:
            raise ConfigError(f"flow_prefetch must be an integer >= 0 (blocks fetched ahead; 0 = on demand), "
                              f"got {self.flow_prefetch!r}")
        path = self.flow_module_list
        if path is not None and (not isinstance(path, str) or not all(path.split("."))):
            raise ConfigError(f"flow_module_list must be a dotted attribute path such as 'model.layers' (or "
                              f"null to auto-detect), got {path!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optimizer"]["betas"] = list(self.optimizer.betas)
        return d


def _check_keys(d: dict[str, Any], cls: type, prefix: str = "") -> None:
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - valid)
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
                          f"valid {prefix or 'top-level '}keys: {', '.join(sorted(valid))}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _load_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data
