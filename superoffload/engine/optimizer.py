"""A torch.optim.Optimizer facade over the engine, so LR schedulers and code that reads
`optimizer.param_groups` work unchanged. The engine reads the hyper-parameters from these groups
when it queues each host step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine


class OffloadOptimizer(torch.optim.Optimizer):
    """`groups`' dicts become this optimizer's param groups as they are (torch's add_param_group keeps the
    dict): the DeepSpeed way in passes the script's own optimizer's groups, so a scheduler built on that
    optimizer drives the engine. `engine` may be bound after construction."""

    def __init__(self, engine: SuperOffloadEngine | None, groups: list[dict[str, Any]]) -> None:
        self._engine = engine
        super().__init__(groups, defaults={})

    def step(self, closure: Any = None) -> bool:  # type: ignore[override]
        if closure is not None:
            raise ValueError("SuperOffload does not support optimizer closures")
        return self._engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._engine.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        return self._engine.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._engine.load_state_dict(state_dict)
