"""The Device interface, and the CPU-only backend (`host`).

Everything the engine does that depends on what the device is goes through a `Device`: streams,
events and their ordering points, device and host allocations (with their ledger), the two device
kernels, and the annotations the simulated device checks. The engine never asks which backend it has;
it asks capabilities (`shares_host_memory`, `kernels`).

Ordering points carry a name (`point=`): on the simulated device a test can switch one off and check
that the simulator then reports the hazard it prevents. CUDA and the host backend ignore the names.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from superoffload.device.kernels import HostKernels, TorchKernels
from superoffload.device.ledger import MemoryLedger

HOST_ALIGN = 64  # bytes: carved host buffers start on a cache line (GraceAdam's streaming stores want it)


class SyncOnHotPathError(RuntimeError):
    """A synchronizing call (event/stream/device synchronize, a blocking copy, .item()) on the training
    thread where the engine promises none."""


class NullStream:
    name = "null"


class NullEvent:
    def query(self) -> bool:
        return True


class Device:
    """Compute device plus its host. Construct with `superoffload.device.get_device`."""

    kind = "abstract"
    shares_host_memory = False
    # waiting for a collective blocks the calling host thread (no stream to hand the wait to): the engine
    # then leaves a bucket's reduce-scatter in flight while backward goes on, instead of waiting at launch
    host_waits_for_collectives = False

    def __init__(self, torch_device: torch.device, hbm_budget_bytes: int | None) -> None:
        self.torch_device = torch_device
        self.hbm_budget_bytes = int(hbm_budget_bytes) if hbm_budget_bytes else self._default_hbm_budget()
        self.ledger = MemoryLedger()
        self.kernels: HostKernels | TorchKernels = HostKernels(self.access)

    def _default_hbm_budget(self) -> int:
        return 1 << 62

    # --- identity ----------------------------------------------------------------------------------
    @property
    def type(self) -> str:
        """torch's device type of the device tensors ("cuda" or "cpu")."""
        return self.torch_device.type

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def name(self) -> str:
        return "cpu"

    # --- streams and events --------------------------------------------------------------------------
    def new_stream(self, name: str) -> Any:
        return NullStream()

    def current_stream(self) -> Any:
        return NullStream()

    @contextlib.contextmanager
    def stream(self, stream: Any) -> Iterator[None]:
        yield

    def new_event(self) -> Any:
        return NullEvent()

    def enabled(self, point: str) -> bool:
        """Whether a host-side ordering point runs (the simulator's mutation tests switch points off)."""
        return True

    def record(self, event: Any, stream: Any, point: str) -> None:
        """`event` captures the work enqueued on `stream` so far."""

    def wait_event(self, stream: Any, event: Any, point: str) -> None:
        """`stream`'s later work waits for `event` (a never-recorded event is waited on as a no-op)."""

    def wait_stream(self, stream: Any, other: Any, point: str) -> None:
        """`stream`'s later work waits for the work enqueued on `other` so far."""

    def sync_event(self, event: Any, point: str) -> None:
        """The calling host thread waits for `event`."""

    def synchronize(self) -> None:
        """The calling host thread waits for all work on the device."""

    def host_event(self, name: str) -> threading.Event:
        """An event between host threads (a set -> wait edge on the simulated device)."""
        return threading.Event()

    def worker_release(self) -> Any:
        """Token taken by a host thread handing work to another (task submission, task completion)."""
        return None

    def worker_acquire(self, token: Any) -> None:
        """The calling thread continues after the work `token` was taken from."""

    # --- device memory -----------------------------------------------------------------------------
    def empty(self, numel: int, dtype: torch.dtype, category: str) -> torch.Tensor:
        t = torch.empty(numel, dtype=dtype, device=self.torch_device)
        self.ledger.alloc(category, _nbytes(t))
        return t

    def zeros(self, numel: int, dtype: torch.dtype, category: str) -> torch.Tensor:
        t = self.empty(numel, dtype, category)
        t.zero_()
        return t

    def free(self, t: torch.Tensor, category: str) -> None:
        """The engine drops its reference to a buffer from `empty`."""
        self.ledger.free(category, _nbytes(t))

    def adopt_grads(self, grads: Sequence[torch.Tensor]) -> None:
        """Gradients autograd produced (on the current stream) are now held by the engine's parameters.
        A list per bucket launch, not a call per gradient: the launch runs once per bucket on the training
        thread, and per-gradient calls were a measurable part of it."""
        if grads:
            self.ledger.alloc("grads", sum(_nbytes(g) for g in grads))

    def release_grads(self, grads: Sequence[torch.Tensor]) -> None:
        """The engine drops gradients it read only on the current stream (the one autograd made them on):
        their memory is reusable in that stream's order, so nothing else is waited for or recorded."""
        if grads:
            self.ledger.free("grads", sum(_nbytes(g) for g in grads))

    def storage_alloc(self, t: torch.Tensor, category: str) -> None:
        """`t`'s storage was (re)allocated on the current stream (weight flow's resize_)."""
        self.ledger.alloc(category, _nbytes(t))

    def storage_free(self, t: torch.Tensor, category: str, point: str) -> None:
        """`t`'s storage is about to be freed on the current stream (weight flow's resize_(0))."""
        self.ledger.free(category, _nbytes(t))

    # --- host memory -------------------------------------------------------------------------------
    def host_buffer(self, nbytes: int, pinned: bool, category: str) -> torch.Tensor:
        """One exact-size host allocation (uint8), pinned when `pinned` and the device can DMA."""
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self.ledger.host_alloc("pageable", category, nbytes, nbytes)
        return buf

    def free_host_buffer(self, buf: torch.Tensor, pinned: bool, category: str) -> None:
        self.ledger.host_free("pageable", category, buf.numel(), buf.numel())

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor's values on the host (the calling thread waits for the current stream)."""
        return t.to("cpu")

    def empty_host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A host transfer buffer outside the engine (benchmarks): pinned with CUDA, else pageable."""
        return torch.empty(numel, dtype=dtype, pin_memory=self.is_cuda)

    # --- copies of tensors the engine does not own (activation checkpoints in host memory) ---------------
    def host_copy_buffer(self, like: torch.Tensor, category: str) -> torch.Tensor:
        """A host tensor with `like`'s shape, strides and dtype, to receive an asynchronous copy of it:
        page-locked where the device can DMA. Its ledger entry ends when its last reference dies."""
        buf = torch.empty_like(like, device="cpu", pin_memory=self._pin_transfers())
        nbytes = _storage_nbytes(buf)
        kind = "pinned" if self._pin_transfers() else "pageable"
        allocated = _pow2_ceil(nbytes) if kind == "pinned" else nbytes  # torch's caching host allocator
        self.ledger.host_alloc(kind, category, nbytes, allocated)
        weakref.finalize(buf, self.ledger.host_free, kind, category, nbytes, allocated)
        return buf

    def _pin_transfers(self) -> bool:
        return False

    def device_buffer_like(self, like: torch.Tensor, category: str) -> torch.Tensor:
        """A device tensor with `like`'s shape, strides and dtype, allocated on the current stream. Its
        ledger entry ends when its last reference dies."""
        t = torch.empty_like(like, device=self.torch_device)
        nbytes = _storage_nbytes(t)
        self.ledger.alloc(category, nbytes)
        weakref.finalize(t, self.ledger.free, category, nbytes)
        return t

    def copy_on(self, stream: Any, dst: torch.Tensor, src: torch.Tensor, point: str) -> None:
        """`dst.copy_(src)` enqueued on `stream` (asynchronous between page-locked host and device memory).
        For a source or target the engine does not track (the model's activations), so the simulated
        device attributes the copy to the stream, not to the host thread."""
        with self.stream(stream):
            dst.copy_(src, non_blocking=True)

    def hold_for(self, t: torch.Tensor, streams: Sequence[Any]) -> None:
        """`t`'s memory is not handed to new work before `streams`' work enqueued so far is done, whoever
        drops the last reference (CUDA: record_stream)."""

    # --- what the simulated device checks ----------------------------------------------------------
    @contextlib.contextmanager
    def access(self, reads: Sequence[torch.Tensor] = (), writes: Sequence[torch.Tensor] = ()) -> Iterator[None]:
        """Reads and writes a kernel torch cannot see (GraceAdam via ctypes) does right here."""
        yield

    @contextlib.contextmanager
    def tracking(self, host_thread: bool = False) -> Iterator[None]:
        """Engine code and the model's ops run under the simulator's checks inside this block
        (`host_thread`: the calling thread is a host worker, not the training thread)."""
        yield

    @contextlib.contextmanager
    def hot_path(self) -> Iterator[None]:
        """No synchronizing call is allowed on this thread inside the block (except in allow_sync)."""
        yield

    @contextlib.contextmanager
    def allow_sync(self) -> Iterator[None]:
        """The one place on the hot path that must synchronize (validation reads the global norm)."""
        yield

    # --- reporting ---------------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        self.ledger.reset_peak()

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory since the last reset (None when the device is the host)."""
        return None

    def memory_report(self) -> dict[str, Any]:
        return self.ledger.report()

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class HostDevice(Device):
    """CPU-only: the device is the host. Streams and events are no-ops (work is already ordered on one
    host thread), no memory is pinned, and the engine may alias host and device buffers."""

    kind = "host"
    shares_host_memory = True
    host_waits_for_collectives = True

    def __init__(self, hbm_budget_bytes: int | None = None) -> None:
        super().__init__(torch.device("cpu"), hbm_budget_bytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def storage_span(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage base address, first byte, end byte) of the bytes a tensor view can touch."""
    st = t.untyped_storage()
    size = t.element_size()
    if t.numel() == 0:
        return st.data_ptr(), 0, 0
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    start = t.storage_offset() * size
    return st.data_ptr(), start, start + span * size
