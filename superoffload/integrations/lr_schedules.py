"""DeepSpeed's learning-rate schedules (a config's `scheduler` block) as torch LR schedulers.

The formulas are DeepSpeed's, as its documentation ("Learning Rate Schedulers",
https://deepspeed.readthedocs.io/en/latest/schedulers.html) and the docstrings of
`deepspeed/runtime/lr_schedules.py` define them, including what they do before the first step: a
DeepSpeed schedule sets the learning rate for batch iteration -1 at construction and moves one
iteration per `step()`. A torch scheduler takes its initial step at construction, so here DeepSpeed's
iteration is `last_epoch - 1`. The schedules are tested equal to DeepSpeed's own classes, step by step.

- WarmupLR: from `warmup_min_lr` to `warmup_max_lr` (default: the group's lr) over `warmup_num_steps`
  (at least 2), by `log(i + 1) / log(warmup_num_steps)` (`warmup_type: log`, the default) or
  `i / warmup_num_steps` (`linear`), then flat;
- WarmupDecayLR: the same warm-up, then linearly to 0 at `total_num_steps`;
- WarmupCosineLR: a ratio of the group's lr, from `warmup_min_ratio` to 1 over the warm-up, then a cosine
  to `cos_min_ratio` at `total_num_steps` (0 before the first step);
- OneCycle: the 1cycle policy (lr up from `cycle_min_lr` to `cycle_max_lr` over `cycle_first_step_size`,
  down over `cycle_second_step_size`, optional stairs, then decay every `decay_step_size`), with the
  momentum (`betas[0]`) cycled inversely between `cycle_max_mom` and `cycle_min_mom` and `betas[1]` set
  to 0.99, as DeepSpeed does;
- LRRangeTest: `lr_range_test_min_lr * (1 + rate * interval)`, continuous or staircase.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)

LOG, LINEAR = "log", "linear"


def _per_group(opt: torch.optim.Optimizer, value: Any, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != len(opt.param_groups):
            raise ValueError(f"{name}: expected {len(opt.param_groups)} values (one per param group), got {len(value)}")
        return [float(v) for v in value]
    return [float(value)] * len(opt.param_groups)


def _warmup_steps(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"warmup_num_steps must be a positive integer, got {n!r}")
    return max(2, n)


def _warmup_type(kind: str) -> str:
    if kind not in (LOG, LINEAR):
        log.warning("unknown warmup_type %r: using 'log' (as DeepSpeed does)", kind)
        return LOG
    return kind


class _DeepSpeedSchedule(LRScheduler):
    """A DeepSpeed schedule: `lr_at(i)` for DeepSpeed's batch iteration i (-1 before the first step)."""

    def lr_at(self, i: int) -> list[float]:
        raise NotImplementedError

    @property
    def last_batch_iteration(self) -> int:
        return self.last_epoch - 1

    def get_lr(self) -> list[float]:  # type: ignore[override]
        return self.lr_at(self.last_batch_iteration)


class WarmupLR(_DeepSpeedSchedule):
    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: Any = 0.0, warmup_max_lr: Any = None,
                 warmup_num_steps: int = 1000, warmup_type: str = LOG, last_batch_iteration: int = -1) -> None:
        if warmup_max_lr is None:
            warmup_max_lr = [g["lr"] for g in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = _warmup_steps(warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        super().__init__(optimizer, last_epoch=last_batch_iteration)

    def _warmup(self, i: int) -> float:
        if self.warmup_type == LOG:  # times the inverse, not divided: DeepSpeed's rounding
            return (1.0 / math.log(self.warmup_num_steps)) * math.log(i + 1)
        return i / self.warmup_num_steps

    def _gamma(self, i: int) -> float:
        return self._warmup(i) if i < self.warmup_num_steps else 1.0

    def lr_at(self, i: int) -> list[float]:
        if i < 0:
            return list(self.min_lrs)
        g = self._gamma(i)
        return [lo + (hi - lo) * g for lo, hi in zip(self.min_lrs, self.max_lrs, strict=True)]


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_lr: Any = 0.0,
                 warmup_max_lr: Any = 0.001, warmup_num_steps: int = 1000, warmup_type: str = LOG,
                 last_batch_iteration: int = -1) -> None:
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            log.warning("total_num_steps %d is less than warmup_num_steps %d", self.total_num_steps,
                        self.warmup_num_steps)

    def _gamma(self, i: int) -> float:
        if i < self.warmup_num_steps:
            return self._warmup(i)
        return max(0.0, float(self.total_num_steps - i) / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_DeepSpeedSchedule):
    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = LOG,
                 last_batch_iteration: int = -1) -> None:
        self.total_num_steps = int(total_num_steps)
        self.warmup_min_ratio, self.cos_min_ratio = float(warmup_min_ratio), float(cos_min_ratio)
        self.warmup_num_steps = _warmup_steps(warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        self.org_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        super().__init__(optimizer, last_epoch=last_batch_iteration)

    def ratio(self, i: int) -> float:
        if i < 0:
            return 0.0
        if i < self.warmup_num_steps:
            r = (1.0 / math.log(self.warmup_num_steps)) * math.log(i + 1) if self.warmup_type == LOG else \
                i / self.warmup_num_steps
            return self.warmup_min_ratio + r * (1.0 - self.warmup_min_ratio)
        progress = min(1.0, (i - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)

    def lr_at(self, i: int) -> list[float]:
        r = self.ratio(i)
        return [lr * r for lr in self.org_lrs]


class LRRangeTest(_DeepSpeedSchedule):
    def __init__(self, optimizer: torch.optim.Optimizer, lr_range_test_min_lr: Any = 1e-3,
                 lr_range_test_step_size: int = 2000, lr_range_test_step_rate: float = 1.0,
                 lr_range_test_staircase: bool = False, last_batch_iteration: int = -1) -> None:
        if not isinstance(lr_range_test_step_size, int) or lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size must be a positive integer, got {lr_range_test_step_size!r}")
        self.min_lrs = _per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size, self.step_rate = lr_range_test_step_size, float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        super().__init__(optimizer, last_epoch=last_batch_iteration)

    def lr_at(self, i: int) -> list[float]:
        interval = (i + 1) / self.step_size
        interval = math.floor(interval) if self.staircase else interval
        return [lr * (1 + self.step_rate * interval) for lr in self.min_lrs]


class OneCycle(_DeepSpeedSchedule):
    def __init__(self, optimizer: torch.optim.Optimizer, cycle_min_lr: Any, cycle_max_lr: Any,
                 decay_lr_rate: float = 0.0, cycle_first_step_size: int = 2000,
                 cycle_second_step_size: int | None = None, cycle_first_stair_count: int = 0,
                 cycle_second_stair_count: int | None = None, decay_step_size: int = 0,
                 cycle_momentum: bool = True, cycle_min_mom: Any = 0.8, cycle_max_mom: Any = 0.9,
                 decay_mom_rate: float = 0.0, last_batch_iteration: int = -1) -> None:
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        if first <= 0:
            raise ValueError(f"cycle_first_step_size must be positive, got {cycle_first_step_size}")
        if second < 0:
            raise ValueError(f"cycle_second_step_size must be non-negative, got {cycle_second_step_size}")
        self.first, self.second, self.total = first, second, first + second
        self.step_ratio = first / self.total
        self.first_stairs = cycle_first_stair_count
        self.second_stairs = cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = float(decay_lr_rate)
        self.decay_lr = not (math.isclose(decay_step_size, 0) or math.isclose(self.decay_lr_rate, 0))
        self.cycle_momentum = cycle_momentum and "betas" in optimizer.defaults
        if cycle_momentum and not self.cycle_momentum:
            log.warning("cycle_momentum is off: the optimizer has no betas")
        self.min_moms = _per_group(optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(optimizer, cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = float(decay_mom_rate)
        self.decay_mom = not (math.isclose(decay_step_size, 0) or math.isclose(self.decay_mom_rate, 0))
        super().__init__(optimizer, last_epoch=last_batch_iteration)

    def _scale(self, i: int) -> float:
        it = i + 1
        cycle = math.floor(1 + it / self.total)
        x = 1.0 + it / self.total - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stairs
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stairs
        if stairs > 0:  # flat for each stair, from the integer position in the cycle
            pos = it % self.total
            pos = pos * stairs / self.first if pos <= self.first else (self.total - pos) * stairs / self.second
            scale = math.floor(pos) / stairs
        return scale

    def lr_at(self, i: int) -> list[float]:
        if i < self.total:
            s = self._scale(i)
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs, strict=True)]
        if not self.decay_lr:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * ((i - self.total + 1) / self.decay_step_size)
        return [lo / factor for lo in self.min_lrs]

    def momentum_at(self, i: int) -> list[float]:
        if i < 0:
            return list(self.min_moms)  # DeepSpeed starts the momentum at its minimum
        if i < self.total:
            s = self._scale(i)
            return [hi - (hi - lo) * s for lo, hi in zip(self.min_moms, self.max_moms, strict=True)]
        if not self.decay_mom:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * ((i - self.total + 1) / self.decay_step_size)
        return [hi * factor for hi in self.max_moms]

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        super().step(epoch)
        if self.cycle_momentum:
            for g, m in zip(self.optimizer.param_groups, self.momentum_at(self.last_batch_iteration), strict=True):
                g["betas"] = (m, 0.99)


SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
             "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}


def from_config(block: dict[str, Any], optimizer: torch.optim.Optimizer) -> LRScheduler:
    """The scheduler a DeepSpeed config's `scheduler` block ({"type": ..., "params": {...}}) describes."""
    from superoffload.engine.config import ConfigError

    kind = block.get("type")
    if kind not in SCHEDULES:
        raise ConfigError(f"DeepSpeed scheduler type {kind!r}: one of {', '.join(SCHEDULES)}")
    params = dict(block.get("params", {}))
    auto = sorted(k for k, v in params.items() if v == "auto")
    if auto:
        raise ConfigError(f"scheduler.params {auto} are 'auto' (the Hugging Face Trainer fills them): give numbers")
    try:
        return SCHEDULES[kind](optimizer, **params)
    except TypeError as e:
        raise ConfigError(f"DeepSpeed scheduler {kind}: {e}") from None
