"""Device backends behind one interface: `cuda`, `host` (the CPU-only fast path) and `sim` (a simulated
discrete device on the CPU that runs the CUDA code path with checked stream ordering, synchronization
and memory). The rest of the code asks a `Device` for streams, events, memory and kernels, and never
which backend it is.
"""

from __future__ import annotations

import torch

from superoffload.device.base import Device, HostDevice, SyncOnHotPathError, storage_span
from superoffload.device.hb import HazardError
from superoffload.options import DEVICE_KINDS

__all__ = ["DEVICE_KINDS", "Device", "HazardError", "HostDevice", "SyncOnHotPathError", "get_device",
           "resolve_kind", "storage_span"]


def resolve_kind(kind: str) -> str:
    """`auto` -> cuda when available, else host; `cpu` -> host (its old name)."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device must be one of {', '.join(DEVICE_KINDS)}; got {kind!r}")
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "host"
    return "host" if kind == "cpu" else kind


def get_device(kind: str = "auto", hbm_budget_bytes: int | None = None, **options) -> Device:
    """The device for `kind` (see resolve_kind). `sim` takes `raise_on_hazard`."""
    k = resolve_kind(kind)
    if k == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False; use "
                             "--device host (the CPU) or --device sim (the CUDA code path simulated on the CPU)")
        from superoffload.device.cuda import CudaDevice

        return CudaDevice(hbm_budget_bytes=hbm_budget_bytes)
    if k == "sim":
        from superoffload.device.sim import SimDevice

        return SimDevice(hbm_budget_bytes=hbm_budget_bytes, **options)
    return HostDevice(hbm_budget_bytes)
