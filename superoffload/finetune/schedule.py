"""The learning-rate schedule: linear warm-up, then cosine decay (as ``transformers``'
``get_cosine_schedule_with_warmup``), as a ``torch.optim.lr_scheduler.LambdaLR`` on any optimizer,
``engine.optimizer`` included.

Multiplier of the base LR at optimizer step ``s`` (0-based) of ``total``, with ``warmup`` steps:

    s < warmup:   (s + 1) / warmup                       (never 0: the first step already learns)
    otherwise:    floor + (1 - floor) * 0.5 * (1 + cos(pi * p)),  p = (s - warmup) / max(1, total - warmup)

``floor`` (``--min-lr-ratio``) is the fraction of the base LR the decay ends at (0 by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WarmupCosine:
    total: int
    warmup: int
    floor: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        p = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def warmup_steps(total: int, warmup_ratio: float, warmup: int | None = None) -> int:
    """Warm-up length: ``warmup`` when given, else ``ceil(warmup_ratio * total)``."""
    return int(warmup) if warmup is not None else math.ceil(warmup_ratio * total)


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: WarmupCosine) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
