"""Activation checkpointing with the checkpoints held in host memory.

With non-reentrant activation checkpointing (``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``) the only tensors a checkpointed block keeps for its backward are its inputs
(the block input, [batch, seq, hidden]): everything inside the block is recomputed. checkpoint saves
those inputs through autograd's saved-tensor mechanism *outside* its own recompute hooks, so
``torch.autograd.graph.saved_tensors_hooks`` installed around the call see exactly them (a test checks
that nothing else is packed). ``ActivationOffloader`` installs such hooks:

- pack (forward): copy the input to a host buffer -- pinned, on a side stream, asynchronously on CUDA
  (the device tensor is kept alive for the copy with ``record_stream``, then released with the
  caller's reference); a separate host buffer on CPU, so CPU tests run the same path;
- prefetch (backward): when block i's backward starts -- its output's gradient is ready, the first
  saved tensor is unpacked, the recompute starts -- block i-1's input is copied back on the side stream,
  so the copy overlaps block i's recompute and backward (one block ahead);
- unpack (recompute): wait for that copy (an event on CUDA) and hand the tensor to the recompute.

The values are copied, never transformed, so loss and every gradient are bit-identical to plain
non-reentrant checkpointing (tested with ``torch.equal``). ``stats()`` reports the host bytes held.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


@dataclass
class OffloadStats:
    host_bytes: int = 0          # bytes of host copies alive now
    peak_host_bytes: int = 0     # maximum of host_bytes since the last reset
    offloaded: int = 0           # tensors copied to the host
    prefetched: int = 0          # tensors copied back ahead of their recompute
    fetched_on_demand: int = 0   # tensors whose copy back was started by their own recompute


class _Saved:
    """One offloaded tensor: its host copy, the device copy once prefetched, and the events ordering them."""

    __slots__ = ("host", "device", "d2h", "h2d", "fetched", "used", "prev", "nbytes", "__weakref__")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.device: torch.device | None = None
        self.d2h = None              # CUDA event: host copy complete
        self.h2d = None              # CUDA event: device copy complete
        self.fetched: torch.Tensor | None = None
        self.used = False            # unpacked at least once (its backward has run)
        self.prev: weakref.ref | None = None   # the input saved just before this one (the previous block)
        self.nbytes = 0


def _empty_host_like(t: torch.Tensor, pin: bool) -> torch.Tensor:
    # same strides (empty_like preserves dense layouts): a recompute on differently-strided input could
    # take another kernel path
    return torch.empty_like(t, device="cpu", pin_memory=pin)


class ActivationOffloader:
    """Saved-tensor hooks that keep checkpointed blocks' inputs in host memory; ``checkpoint`` uses them.

    One instance per model (its blocks form one prefetch chain, in forward order). On CUDA one side
    stream per device carries both copy directions.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = OffloadStats()
        self._last: weakref.ref | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def __getstate__(self) -> dict:   # a copied model gets a fresh offloader (streams and locks do not copy)
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    # ---------------------------------------------------------------- public
    def checkpoint(self, fn: Callable, *args, **kwargs):
        """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, **kwargs)`` with the saved
        inputs in host memory. Callable as transformers' ``_gradient_checkpointing_func``."""
        kwargs.pop("use_reentrant", None)
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return checkpoint(fn, *args, use_reentrant=False, **kwargs)

    def stats(self) -> OffloadStats:
        with self._lock:
            return OffloadStats(**vars(self._stats))

    def reset_peak(self) -> None:
        with self._lock:
            self._stats.peak_host_bytes = self._stats.host_bytes

    # ---------------------------------------------------------------- hooks
    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        s = self._streams.get(device)
        if s is None:
            s = self._streams[device] = torch.cuda.Stream(device=device)
        return s

    def _account(self, nbytes: int) -> None:
        with self._lock:
            st = self._stats
            st.host_bytes += nbytes
            st.peak_host_bytes = max(st.peak_host_bytes, st.host_bytes)
            if nbytes > 0:
                st.offloaded += 1

    def _pack(self, t: torch.Tensor) -> _Saved:
        saved = _Saved()
        saved.device = t.device
        saved.nbytes = t.numel() * t.element_size()
        src = t.detach()
        if src.is_cuda:
            saved.host = _empty_host_like(src, pin=True)
            stream = self._stream(src.device)
            stream.wait_stream(torch.cuda.current_stream(src.device))
            with torch.cuda.stream(stream):
                saved.host.copy_(src, non_blocking=True)
                saved.d2h = torch.cuda.Event()
                saved.d2h.record(stream)
            src.record_stream(stream)   # the caching allocator may not reuse it before the copy is done
        else:
            saved.host = _empty_host_like(src, pin=False)
            saved.host.copy_(src)
        saved.prev, self._last = self._last, weakref.ref(saved)
        self._account(saved.nbytes)
        weakref.finalize(saved, self._account, -saved.nbytes)
        return saved

    def _prefetch(self, saved: _Saved) -> None:
        """Start the copy back to the device (no-op if started, or if the host copy is gone)."""
        if saved.fetched is not None or saved.host is None:
            return
        if saved.device.type == "cuda":
            dev = torch.empty_like(saved.host, device=saved.device)   # allocated on the compute stream
            stream = self._stream(saved.device)
            stream.wait_stream(torch.cuda.current_stream(saved.device))  # ... so its memory is free to write
            with torch.cuda.stream(stream):
                dev.copy_(saved.host, non_blocking=True)              # after the D2H: same stream
                saved.h2d = torch.cuda.Event()
                saved.h2d.record(stream)
            dev.record_stream(stream)
            saved.fetched = dev
        else:
            saved.fetched = saved.host if saved.device.type == "cpu" else saved.host.to(saved.device)

    def _unpack(self, saved: _Saved) -> torch.Tensor:
        with self._lock:
            prefetched = saved.fetched is not None
            if prefetched:
                self._stats.prefetched += 1
            else:
                self._stats.fetched_on_demand += 1
        self._prefetch(saved)
        out = saved.fetched
        if saved.h2d is not None:
            torch.cuda.current_stream(saved.device).wait_event(saved.h2d)
        # a second backward over a retained graph fetches again from the host copy, which lives as long
        # as the graph does
        saved.fetched, saved.h2d, saved.used = None, None, True
        prev = saved.prev() if saved.prev is not None else None
        if prev is not None and not prev.used:
            self._prefetch(prev)   # one block ahead: the previous block's input, during this block's backward
        return out


def offloaded_checkpoint(fn: Callable, *args, offloader: ActivationOffloader, **kwargs):
    """Functional form of ``ActivationOffloader.checkpoint``."""
    return offloader.checkpoint(fn, *args, **kwargs)
