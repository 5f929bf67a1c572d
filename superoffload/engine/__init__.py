"""The SuperOffload training engine."""

from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.engine import SuperOffloadEngine
from superoffload.engine.worker import HostWorkerError

__all__ = ["ConfigError", "HostWorkerError", "SuperOffloadConfig", "SuperOffloadEngine", "initialize"]


def initialize(model, config=None, param_groups=None) -> SuperOffloadEngine:
    """Wrap `model` for training with SuperOffload.

    `config`: a SuperOffloadConfig, a dict such as ``{"optimizer": {"lr": 1e-3, "weight_decay": 0.01},
    "bucket_size": 4096}``, or a JSON/YAML path. `param_groups`: optional torch-style groups (default:
    the weight-decay split). A bad or contradictory key raises ConfigError before any work.
    """
    return SuperOffloadEngine(model, config, param_groups)
