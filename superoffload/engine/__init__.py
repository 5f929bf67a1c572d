"""The SuperOffload training engine."""

from typing import Any

from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.engine import SuperOffloadEngine
from superoffload.engine.worker import HostWorkerError, NonFiniteError

__all__ = ["ConfigError", "HostWorkerError", "NonFiniteError", "SuperOffloadConfig", "SuperOffloadEngine",
           "initialize"]


def initialize(model: Any, config: Any = None, param_groups: Any = None, process_group: Any = None, *,
               model_parameters: Any = None) -> SuperOffloadEngine:
    """Wrap `model` for training with SuperOffload; returns the engine.

    `config`: a SuperOffloadConfig, a dict such as ``{"optimizer": {"lr": 1e-3, "weight_decay": 0.01},
    "bucket_size": 4096}``, or a JSON/YAML path. `param_groups` (or DeepSpeed's name for it,
    `model_parameters`): torch-style groups or an iterable of parameters (default: the weight-decay split).
    `process_group`: the ranks to shard over, or with `replicate: true` to replicate over (default:
    torch.distributed's default group when it is initialized, else this process alone). A bad or
    contradictory value raises ConfigError before any work. DeepSpeed's call shape
    (`initialize(args=..., model=..., ...)`) is `superoffload.initialize`'s other form (superoffload/entry.py).
    """
    if model_parameters is not None:
        if param_groups is not None:
            raise TypeError("pass either param_groups= or DeepSpeed's model_parameters=, not both")
        param_groups = model_parameters
    return SuperOffloadEngine(model, config, param_groups, process_group)
