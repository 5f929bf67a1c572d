"""`sim`: a simulated discrete device on the CPU that runs the engine's CUDA code path and checks it.

What makes it a *discrete* device: `shares_host_memory` is False, so the engine takes exactly the
branches it takes on CUDA: separate device buffers, real D2H copies into landing buffers, real H2D
copies of the updated weights, host transfer buffers allocated as pinned (in the ledger). Tensors are
CPU tensors and ops run synchronously, so results are bit-identical to the `host` backend's.

What it checks:
- ordering (hb.py): every op that touches a tracked buffer (device buffers from `empty`, held
  gradients, the model's weights, host transfer buffers, weight-flow storage) is logged as reads and
  writes of byte ranges by the op's actor: the calling thread's current stream for device work and
  copies, the host thread itself for host-only work. A `TorchDispatchMode` sees torch's ops; kernels
  called through ctypes (GraceAdam) are annotated by the engine (`access`). A read or a reuse not
  ordered after the write it depends on raises `HazardError`, as does freeing memory another stream
  may still use;
- synchronization: inside `hot_path()` the training thread may not synchronize (event, stream, device
  synchronize, a blocking copy between host and device, `.item()` on device memory) except inside
  `allow_sync()`: `SyncOnHotPathError`;
- memory: a ledger of device bytes by category, including activations (every storage a device op
  allocates, until its last tensor dies), and host bytes pinned vs pageable.

Ordering points can be switched off by name (`disabled_points`): the mutation tests prove each one is
needed by showing the hazard the simulator reports without it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from superoffload.device.base import Device, SyncOnHotPathError, _nbytes, _storage_nbytes, storage_span
from superoffload.device.hb import HBTracker
from superoffload.device.kernels import TorchKernels


class SimStream:
    def __init__(self, name: str) -> None:
        self.name = f"stream:{name}"

    def __repr__(self) -> str:
        return self.name


class SimEvent:
    def __init__(self) -> None:
        self.clock: dict[Any, int] | None = None

    def query(self) -> bool:
        return True


class SimHostEvent(threading.Event):
    """threading.Event with a happens-before edge from set() to a wait() or is_set() that sees it."""

    def __init__(self, hb: HBTracker, name: str) -> None:
        super().__init__()
        self._hb, self.name = hb, name
        self._clock: dict[Any, int] | None = None

    def set(self) -> None:
        self._clock = self._hb.snapshot(self._hb.thread_actor())
        super().set()

    def is_set(self) -> bool:
        ok = super().is_set()
        if ok:
            self._hb.join(self._hb.thread_actor(), self._clock)
        return ok

    def wait(self, timeout: float | None = None) -> bool:
        ok = super().wait(timeout)
        if ok:
            self._hb.join(self._hb.thread_actor(), self._clock)
        return ok


class _Local(threading.local):
    def __init__(self) -> None:
        self.stream: SimStream | None = None
        self.tracking = 0
        self.untracked = 0
        self.hot = 0
        self.allowed = 0
        self.mode: _SimMode | None = None
        self.host_thread = False  # a host worker thread (its untracked allocations are host memory)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


_SYNC_OPS = {"aten::_local_scalar_dense", "aten::item"}


class _SimMode(TorchDispatchMode):
    def __init__(self, dev: SimDevice) -> None:
        super().__init__()
        self.dev = dev

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        dev = self.dev
        if dev._local.untracked:
            return func(*args, **kwargs)
        reads, writes = dev._classify(func, args, kwargs)
        actor, kinds = dev._actor_for(reads + writes)
        name = func._schema.name
        what = f"{name.removeprefix('aten::')}"
        out = func(*args, **kwargs)
        hb = dev.hb
        if actor is not None:
            if isinstance(actor, SimStream):
                hb.launch(actor)
            for t in reads:
                base, s, e = storage_span(t)
                hb.access(actor, base, s, e, False, what)
            for t in writes:
                base, s, e = storage_span(t)
                hb.access(actor, base, s, e, True, what)
            blocking_copy = (name == "aten::copy_" and "host" in kinds and "device" in kinds
                             and not kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
            if blocking_copy and isinstance(actor, SimStream):
                dev._host_waits(actor, f"blocking copy ({what}) between host and device memory")
        if name in _SYNC_OPS and args and isinstance(args[0], torch.Tensor) \
                and dev.hb.kind_of(args[0].untyped_storage().data_ptr()) != "host":
            dev._host_waits(dev._current(), f"{what} (reads a device value on the host)")
        dev._note_outputs(out, args, kwargs, actor)
        return out


class SimDevice(Device):
    kind = "sim"
    shares_host_memory = False

    def __init__(self, hbm_budget_bytes: int | None = None, raise_on_hazard: bool = True) -> None:
        super().__init__(torch.device("cpu"), hbm_budget_bytes)
        self.kernels = TorchKernels()  # exactly what the CUDA backend launches
        self.hb = HBTracker(raise_on_hazard)
        self.compute = SimStream("compute")
        self.disabled_points: set[str] = set()
        self.points_seen: set[str] = set()
        self.sync_calls: list[str] = []
        self._local = _Local()
        self._allocs: dict[int, list[Any]] = {}  # storage base -> [nbytes, live tensors, category]
        self._alloc_lock = threading.Lock()
        self._host_kind: dict[int, tuple[bool, str]] = {}
        self._held: dict[int, tuple[Any, ...]] = {}  # storage base -> streams declared by hold_for

    def name(self) -> str:
        return "sim (simulated discrete device on the CPU)"

    # --- helpers for the dispatch mode -------------------------------------------------------------
    def _current(self) -> SimStream:
        return self._local.stream or self.compute

    def _classify(self, func: Any, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        reads: list[torch.Tensor] = []
        writes: list[torch.Tensor] = []
        for i, a in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(a.name)
            ts = list(_tensors(value))
            if not ts:
                continue
            info = a.alias_info
            if info is not None and not info.is_write:
                continue  # a view of the input: no data is touched
            (writes if info is not None and info.is_write else reads).extend(ts)
        return reads, writes

    def _actor_for(self, tensors: list[torch.Tensor]) -> tuple[Any, set[str]]:
        kinds = {self.hb.kind_of(t.untyped_storage().data_ptr()) for t in tensors}
        kinds.discard(None)
        if not kinds:
            return None, kinds
        if "device" in kinds:
            return self._current(), kinds
        # host memory only: the host thread does it (a device op that merely writes a host tensor it
        # created is not possible: device ops read device memory)
        return self.hb.thread_actor(), kinds

    def _host_waits(self, stream: SimStream, why: str) -> None:
        """The calling host thread blocks until `stream` is done (a synchronizing call)."""
        self.hb.join(self.hb.thread_actor(), self.hb.snapshot(stream))
        self._check_sync(why)

    def _check_sync(self, why: str) -> None:
        self.sync_calls.append(why)
        if self._local.hot and not self._local.allowed:
            raise SyncOnHotPathError(f"synchronizing call on the training thread's hot path: {why}")

    def _note_outputs(self, out: Any, args: tuple, kwargs: dict, actor: Any) -> None:
        """Ledger: storages a device op allocates count as activations until their last tensor dies."""
        # an op on untracked memory only (the model's activations, a factory) allocates device memory
        # when the training thread runs it; host threads (the worker) allocate host temporaries
        device_op = isinstance(actor, SimStream) or (actor is None and not self._local.host_thread)
        outs = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
        if not outs:
            return
        inputs = {t.untyped_storage().data_ptr() for v in (*args, *kwargs.values()) for t in _tensors(v)}
        with self._alloc_lock:
            for t in outs:
                if t.numel() == 0:
                    continue
                base = t.untyped_storage().data_ptr()
                entry = self._allocs.get(base)
                if entry is None:
                    if not device_op or base in inputs or self.hb.kind_of(base) is not None:
                        continue
                    nbytes = t.untyped_storage().nbytes()
                    entry = self._allocs[base] = [nbytes, 0, "activations"]
                    self.ledger.alloc("activations", nbytes)
                entry[1] += 1
                weakref.finalize(t, self._tensor_died, base)

    def _tensor_died(self, base: int) -> None:
        with self._alloc_lock:
            entry = self._allocs.get(base)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._allocs[base]
            self.ledger.free(entry[2], entry[0])
            tracked = len(entry) > 3  # a device_buffer_like buffer: its reuse is checked too
            safe = self._held.pop(base, ()) if tracked else ()
        if tracked:  # returned to the allocator on the compute stream, where the training thread drops it
            self.hb.free(base, on=self.compute, safe_streams=safe)

    # --- streams and events ------------------------------------------------------------------------
    def new_stream(self, name: str) -> SimStream:
        return SimStream(name)

    def current_stream(self) -> SimStream:
        return self._current()

    @contextlib.contextmanager
    def stream(self, stream: SimStream) -> Iterator[None]:
        prev = self._local.stream
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = prev

    def new_event(self) -> SimEvent:
        return SimEvent()

    def _enabled(self, point: str) -> bool:
        self.points_seen.add(point)
        return point not in self.disabled_points

    def enabled(self, point: str) -> bool:
        return self._enabled(point)

    def record(self, event: SimEvent, stream: SimStream, point: str) -> None:
        if self._enabled(point):
            self.hb.launch(stream)
            event.clock = self.hb.snapshot(stream)

    def wait_event(self, stream: SimStream, event: SimEvent, point: str) -> None:
        if self._enabled(point):
            self.hb.launch(stream)
            self.hb.join(stream, event.clock)

    def wait_stream(self, stream: SimStream, other: SimStream, point: str) -> None:
        if self._enabled(point) and stream is not other:
            self.hb.launch(stream)
            self.hb.join(stream, self.hb.snapshot(other))

    def sync_event(self, event: SimEvent, point: str) -> None:
        if self._enabled(point):
            self.hb.join(self.hb.thread_actor(), event.clock)
            self._check_sync(f"event synchronize ({point})")

    def synchronize(self) -> None:
        for s in self._streams_seen():
            self.hb.join(self.hb.thread_actor(), self.hb.snapshot(s))
        self._check_sync("device synchronize")

    def _streams_seen(self) -> list[Any]:
        with self.hb._lock:
            return [a for a in self.hb._clocks if isinstance(a, SimStream)]

    def host_event(self, name: str) -> threading.Event:
        return SimHostEvent(self.hb, name)

    def worker_release(self) -> Any:
        return self.hb.snapshot(self.hb.thread_actor())

    def worker_acquire(self, token: Any) -> None:
        self.hb.join(self.hb.thread_actor(), token)

    # --- memory ------------------------------------------------------------------------------------
    def empty(self, numel: int, dtype: torch.dtype, category: str) -> torch.Tensor:
        with self._untracked():
            t = torch.empty(numel, dtype=dtype)
        self.ledger.alloc(category, _nbytes(t))
        self._register(t, "device", category)
        return t

    def _register(self, t: torch.Tensor, kind: str, label: str) -> None:
        base = t.untyped_storage().data_ptr()
        if t.numel():
            self.hb.register(base, t.untyped_storage().nbytes(), kind, label)
            if kind == "device":
                # the caching allocator hands memory to the allocating stream: it may still be in use
                # by that stream's earlier work on the previous tenant, so the new tenant is "written"
                # by the allocating stream now (another stream writing it must wait for that stream)
                self.hb.access(self._current(), base, 0, t.untyped_storage().nbytes(), True, "allocation")

    def free(self, t: torch.Tensor, category: str) -> None:
        super().free(t, category)
        if t.numel():
            self.hb.free(t.untyped_storage().data_ptr(), on=self._current())

    def adopt_grads(self, grads: Sequence[torch.Tensor]) -> None:
        for grad in grads:
            base = grad.untyped_storage().data_ptr()
            with self._alloc_lock:
                entry = self._allocs.get(base)
                if entry is not None and entry[2] != "grads":
                    self.ledger.move(entry[2], "grads", entry[0])
                    entry[2] = "grads"
            if self.hb.kind_of(base) is None and grad.numel():
                self.hb.register(base, grad.untyped_storage().nbytes(), "device", "gradient")
                # autograd accumulated it on the current (compute) stream before the hook ran
                s, e = storage_span(grad)[1:]
                self.hb.launch(self._current())
                self.hb.access(self._current(), base, s, e, True, "gradient accumulation")

    def release_grads(self, grads: Sequence[torch.Tensor]) -> None:
        # the ledger entry ends when the storage's last tensor dies (the finalizer), not here; every
        # access to the gradient must be ordered before its free on the current stream
        for grad in grads:
            if grad.numel():
                self.hb.free(grad.untyped_storage().data_ptr(), on=self._current())

    def storage_alloc(self, t: torch.Tensor, category: str) -> None:
        self.ledger.alloc(category, _nbytes(t))
        self._register(t, "device", category)

    def storage_free(self, t: torch.Tensor, category: str, point: str) -> None:
        self.ledger.free(category, _nbytes(t))
        if t.numel():
            self.hb.free(t.untyped_storage().data_ptr(), on=self._current())

    def host_buffer(self, nbytes: int, pinned: bool, category: str) -> torch.Tensor:
        with self._untracked():
            buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        self.ledger.host_alloc("pinned" if pinned else "pageable", category, nbytes, nbytes)
        self._register(buf, "host", category)
        self._host_kind[buf.data_ptr()] = (pinned, category)
        return buf

    def free_host_buffer(self, buf: torch.Tensor, pinned: bool, category: str) -> None:
        self.ledger.host_free("pinned" if pinned else "pageable", category, buf.numel(), buf.numel())
        self.hb.unregister(buf.data_ptr())

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        self._host_waits(self._current(), "read of a device value on the host")
        with self._untracked():
            return t.clone()

    # --- copies of tensors the engine does not own (activation checkpoints) ------------------------
    def _pin_transfers(self) -> bool:
        return True

    def host_copy_buffer(self, like: torch.Tensor, category: str) -> torch.Tensor:
        with self._untracked():
            buf = torch.empty_like(like, device="cpu")
        nbytes = _storage_nbytes(buf)
        self.ledger.host_alloc("pinned", category, nbytes, nbytes)
        self._register(buf, "host", category)
        weakref.finalize(buf, self._host_copy_died, buf.untyped_storage().data_ptr(), category, nbytes)
        return buf

    def _host_copy_died(self, base: int, category: str, nbytes: int) -> None:
        self.ledger.host_free("pinned", category, nbytes, nbytes)
        self.hb.unregister(base)

    def device_buffer_like(self, like: torch.Tensor, category: str) -> torch.Tensor:
        with self._untracked():
            t = torch.empty_like(like, device="cpu")
        nbytes = _storage_nbytes(t)
        base = t.untyped_storage().data_ptr()
        self.ledger.alloc(category, nbytes)
        self._register(t, "device", category)  # written by the allocating (current) stream
        # alive while any tensor on its storage is: views made by tracked ops (checkpoint's detach) count
        # themselves in (_note_outputs)
        with self._alloc_lock:
            self._allocs[base] = [nbytes, 1, category, "device_buffer_like"]
        weakref.finalize(t, self._tensor_died, base)
        return t

    def copy_on(self, stream: SimStream, dst: torch.Tensor, src: torch.Tensor, point: str) -> None:
        self.hb.launch(stream)
        for t, write in ((src, False), (dst, True)):
            base, s, e = storage_span(t)
            self.hb.access(stream, base, s, e, write, f"copy ({point})")
        with self._untracked():
            dst.copy_(src)

    def hold_for(self, t: torch.Tensor, streams: Sequence[Any]) -> None:
        base = t.untyped_storage().data_ptr()
        if self.hb.kind_of(base) is None:  # untracked (the model's activations): nothing checks its free
            return
        with self._alloc_lock:
            self._held[base] = (*self._held.get(base, ()), *streams)

    # --- annotations -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def access(self, reads: Sequence[torch.Tensor] = (), writes: Sequence[torch.Tensor] = ()) -> Iterator[None]:
        actor, _ = self._actor_for([*reads, *writes])
        if actor is not None:
            if isinstance(actor, SimStream):
                self.hb.launch(actor)
            for t in reads:
                base, s, e = storage_span(t)
                self.hb.access(actor, base, s, e, False, "kernel read")
            for t in writes:
                base, s, e = storage_span(t)
                self.hb.access(actor, base, s, e, True, "kernel write")
        with self._untracked():
            yield

    @contextlib.contextmanager
    def _untracked(self) -> Iterator[None]:
        self._local.untracked += 1
        try:
            yield
        finally:
            self._local.untracked -= 1

    @contextlib.contextmanager
    def tracking(self, host_thread: bool = False) -> Iterator[None]:
        loc = self._local
        loc.host_thread = host_thread or loc.host_thread
        if loc.tracking == 0:
            loc.mode = _SimMode(self)
            loc.mode.__enter__()
        loc.tracking += 1
        try:
            yield
        finally:
            loc.tracking -= 1
            if loc.tracking == 0 and loc.mode is not None:
                mode, loc.mode = loc.mode, None
                mode.__exit__(None, None, None)

    @contextlib.contextmanager
    def hot_path(self) -> Iterator[None]:
        self._local.hot += 1
        try:
            yield
        finally:
            self._local.hot -= 1

    @contextlib.contextmanager
    def allow_sync(self) -> Iterator[None]:
        self._local.allowed += 1
        try:
            yield
        finally:
            self._local.allowed -= 1

    def reset_peak_memory(self) -> None:
        self.ledger.reset_peak()

    def peak_memory_bytes(self) -> int | None:
        return self.ledger.peak_total
