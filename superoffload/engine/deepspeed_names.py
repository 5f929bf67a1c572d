"""DeepSpeed's engine names on SuperOffloadEngine, so a DeepSpeed training loop ports unchanged
(docs/engine.md and docs/integrations.md have the whole mapping): a mixin over the engine's own state."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn


class DeepSpeedNames:
    """Read-only aliases and the one DeepSpeed setter; the engine provides `model`, `global_step`,
    `optimizer`, `last_grad_norm`, `is_boundary`, `config`, `comm` and `_boundary_override`."""

    @property
    def module(self) -> nn.Module:
        return self.model

    @property
    def global_steps(self) -> int:
        return self.global_step

    def get_lr(self) -> list[float]:
        """The current learning rate of each param group."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float:
        """The last step's global gradient norm (after unscaling; nan before the first step or after a
        non-finite step)."""
        return self.last_grad_norm

    def is_gradient_accumulation_boundary(self) -> bool:
        return self.is_boundary

    def gradient_accumulation_steps(self) -> int:
        return self.config.grad_accum

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def global_rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:  # DeepSpeed's name
        return self.comm.world

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Say whether the next backward() ends an accumulation window, instead of counting to grad_accum
        (DeepSpeed's: set it before each forward/backward; the last one True, then step() once)."""
        self._boundary_override = bool(is_boundary)

