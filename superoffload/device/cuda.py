"""The CUDA backend: real streams and events, page-locked host transfer buffers, torch kernels.

Host transfer buffers are one exact-size allocation each, page-locked with `cudaHostRegister`: torch's
caching host allocator (`pin_memory=True`) rounds every block up to a power of two
(c10/core/CachingHostAllocator.h), which costs up to 2x on large buckets. Where registration is not
available the buffer falls back to `pin_memory=True` and the ledger records the rounded size.

A registered buffer is unregistered when it is freed, or when its tensor is collected (an engine dropped
without `close()`): memory returned to the C allocator while still registered made the next engine's
registration at the same address fail on an H200 (torch 2.11), and the failed call's error was then
raised by an unrelated kernel ("CUDA error: resource already mapped").
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from superoffload.device.base import Device, _pow2_ceil
from superoffload.device.kernels import TorchKernels


class CudaDevice(Device):
    kind = "cuda"
    shares_host_memory = False

    def __init__(self, index: int | None = None, hbm_budget_bytes: int | None = None) -> None:
        idx = torch.cuda.current_device() if index is None else index
        super().__init__(torch.device("cuda", idx), hbm_budget_bytes)
        self.kernels = TorchKernels()
        self._registered: dict[int, tuple[int, weakref.finalize]] = {}  # data_ptr -> (bytes, unregister)
        # SUPEROFFLOAD_CUDA_SYNC_DEBUG=warn|error: torch.cuda.set_sync_debug_mode inside the engine's hot
        # path (backward, step, forward hooks), except the one synchronization validation needs
        self.sync_debug = os.environ.get("SUPEROFFLOAD_CUDA_SYNC_DEBUG") or None
        self._hot = threading.local()

    def _default_hbm_budget(self) -> int:
        return int(torch.cuda.get_device_properties(self.torch_device).total_memory)

    def name(self) -> str:
        return torch.cuda.get_device_name(self.torch_device)

    # --- streams and events ------------------------------------------------------------------------
    def new_stream(self, name: str) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.torch_device)

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.torch_device)

    @contextlib.contextmanager
    def stream(self, stream: torch.cuda.Stream) -> Iterator[None]:
        with torch.cuda.stream(stream):
            yield

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record(self, event: torch.cuda.Event, stream: torch.cuda.Stream, point: str) -> None:
        event.record(stream)

    def wait_event(self, stream: torch.cuda.Stream, event: torch.cuda.Event, point: str) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: torch.cuda.Stream, other: torch.cuda.Stream, point: str) -> None:
        stream.wait_stream(other)

    def sync_event(self, event: torch.cuda.Event, point: str) -> None:
        event.synchronize()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    @contextlib.contextmanager
    def hot_path(self) -> Iterator[None]:
        if not self.sync_debug:
            yield
            return
        depth = getattr(self._hot, "depth", 0)
        self._hot.depth = depth + 1
        old = torch.cuda.get_sync_debug_mode()
        if depth == 0:
            torch.cuda.set_sync_debug_mode(self.sync_debug)
        try:
            yield
        finally:
            self._hot.depth = depth
            if depth == 0:
                torch.cuda.set_sync_debug_mode(old)

    @contextlib.contextmanager
    def allow_sync(self) -> Iterator[None]:
        if not self.sync_debug:
            yield
            return
        old = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(old)

    # --- memory ------------------------------------------------------------------------------------
    def host_buffer(self, nbytes: int, pinned: bool, category: str) -> torch.Tensor:
        if not pinned:
            return super().host_buffer(nbytes, pinned, category)
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        cudart = torch.cuda.cudart()
        try:
            ok = int(cudart.cudaHostRegister(buf.data_ptr(), buf.numel(), 0)) == 0
        except (AttributeError, RuntimeError):
            ok = False
        if ok:
            ptr, numel = buf.data_ptr(), buf.numel()
            # The returned tensor's storage holds `arr`, which holds `buf`'s: `arr` dies with the last view of
            # the buffer (not with the tensor object, which callers drop after taking a typed view), and its
            # finalizer unregisters before the memory can go back to the C allocator. It runs once: here, or
            # at free_host_buffer.
            arr = buf.numpy()
            self._registered[ptr] = (numel, weakref.finalize(arr, _unregister, self._registered, ptr))
            self.ledger.host_alloc("pinned", category, nbytes, numel)
            return torch.from_numpy(arr)
        _clear_cuda_error(cudart)
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        self.ledger.host_alloc("pinned", category, nbytes, _pow2_ceil(nbytes))  # the caching allocator's block
        return buf

    def free_host_buffer(self, buf: torch.Tensor, pinned: bool, category: str) -> None:
        if not pinned:
            return super().free_host_buffer(buf, pinned, category)
        entry = self._registered.get(buf.data_ptr())
        if entry is not None:
            entry[1]()   # unregisters and forgets the buffer
            self.ledger.host_free("pinned", category, buf.numel(), entry[0])
        else:
            self.ledger.host_free("pinned", category, buf.numel(), _pow2_ceil(buf.numel()))

    def _pin_transfers(self) -> bool:
        return True

    def hold_for(self, t: torch.Tensor, streams: Sequence[Any]) -> None:
        for s in streams:
            t.record_stream(s)

    # --- reporting ---------------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        super().reset_peak_memory()
        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def peak_memory_bytes(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.torch_device))

    def memory_report(self) -> dict[str, Any]:
        """The ledger's categories, with activations = the allocator's peak minus the categories the
        engine accounts for at that peak (CUDA's allocator sees everything; the ledger sees ours)."""
        rep = super().memory_report()
        peak = self.peak_memory_bytes() or 0
        ours = sum(v for k, v in rep["device_at_peak"].items() if k != "activations")
        rep["device_at_peak"]["activations"] = max(0, peak - ours)
        rep["device_peak_bytes"] = peak
        return rep


__all__ = ["CudaDevice"]


def _unregister(registered: dict, ptr: int) -> None:
    registered.pop(ptr, None)
    torch.cuda.cudart().cudaHostUnregister(ptr)


def _clear_cuda_error(cudart: Any) -> None:
    """A failed runtime call leaves its error as the thread's last error, which torch's next kernel-launch
    check would raise as its own; read it off where torch exposes the call."""
    get_last = getattr(cudart, "cudaGetLastError", None)
    if get_last is not None:
        get_last()
