"""What the engine's parts share: the config (held here, once), the device, the ranks, the host worker,
the streams a host task uses, and the counters every part adds to.

The config lives only here: the engine, the buffer builder, the buckets and the launcher read it through
this object, so `reconfigure()` replaces it in one place and every reader sees the new one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from superoffload.device import Device
from superoffload.engine.comm import Comm
from superoffload.engine.config import OptimizerConfig, SuperOffloadConfig
from superoffload.engine.worker import HostWorker


class Counters:
    """Thread-safe accumulators (the worker and the training thread both add)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {}

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                self.values[k] = self.values.get(k, 0.0) + v

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.values)


@dataclass
class EngineContext:
    config: SuperOffloadConfig
    device: Device
    comm: Comm
    worker: HostWorker
    counters: Counters
    dtype: torch.dtype  # the model's precision on the device
    upload_stream: Any = None
    upload_staging: Callable[[int], torch.Tensor] | None = None  # fp32 device buffer for param_cast "device"
    flow_sink: Any = None  # weight flow: waits for fetches that read a flowed bucket's host store

    @property
    def optimizer(self) -> OptimizerConfig:
        return self.config.optimizer

    @property
    def host_optimizer(self) -> str:
        return self.config.host_optimizer

    @property
    def host_threads(self) -> int | None:
        return self.config.host_threads

    @property
    def full_copy(self) -> bool:
        return self.config.rollback_mode == "full_copy"
