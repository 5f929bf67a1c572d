"""The SuperOffload training engine."""

from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.engine import SuperOffloadEngine
from superoffload.engine.worker import HostWorkerError

__all__ = ["ConfigError", "HostWorkerError", "SuperOffloadConfig", "SuperOffloadEngine", "initialize"]


def initialize(model, config=None, param_groups=None, process_group=None) -> SuperOffloadEngine:
    """Wrap `model` for training with SuperOffload.

    `config`: a SuperOffloadConfig, a dict such as ``{"optimizer": {"lr": 1e-3, "weight_decay": 0.01},
    "bucket_size": 4096}``, or a JSON/YAML path. `param_groups`: torch-style groups or an iterable of
    parameters (default: the weight-decay split). `process_group`: the ranks to shard over (default:
    torch.distributed's default group when it is initialized, else this process alone). A bad or
    contradictory value raises ConfigError before any work.
    """
    return SuperOffloadEngine(model, config, param_groups, process_group)
