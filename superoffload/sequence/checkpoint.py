"""Activation checkpointing with the checkpoints held in host memory.

With non-reentrant activation checkpointing (``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``) the only tensors a checkpointed block keeps for its backward are its inputs
(the block input, [batch, seq, hidden]): everything inside the block is recomputed. checkpoint saves
those inputs through autograd's saved-tensor mechanism *outside* its own recompute hooks, so
``torch.autograd.graph.saved_tensors_hooks`` installed around the call see exactly them (a test checks
that nothing else is packed). ``ActivationOffloader`` installs such hooks:

- pack (forward): copy the input to a page-locked host buffer on a side stream, asynchronously (the
  device tensor is kept alive for the copy with ``Device.hold_for``, CUDA's ``record_stream``, then
  released with the caller's reference);
- prefetch (backward): when block i's backward starts -- its output's gradient is ready, the first
  saved tensor is unpacked, the recompute starts -- block i-1's input is copied back on the side stream
  into a device buffer allocated on the compute stream, so the copy overlaps block i's recompute and
  backward (one block ahead);
- unpack (recompute): the compute stream waits for that copy's event and the tensor goes to the recompute.

Streams, events, buffers and copies go through ``superoffload.device``: the engine binds its device
(``use_device``), so on ``sim`` this is the CUDA path with every ordering point checked (the recompute's
read of the prefetched input must be ordered after its copy, the buffer's reuse after the copy's end) and
every buffer in the memory ledger (host copies: pinned, ``activation_checkpoints``; prefetched inputs:
device ``activations``). Unbound, a CUDA tensor's device is a ``CudaDevice``. Where the device *is* the
host (``shares_host_memory``: the ``host`` backend, plain CPU tensors) the input is copied to a separate
host tensor and that copy goes straight back to the recompute: no streams, nothing to order.

The values are copied, never transformed, so loss and every gradient are bit-identical to plain
non-reentrant checkpointing (tested with ``torch.equal``). ``stats()`` reports the host bytes held.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from superoffload.device import Device


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
        self.device: Device | None = None   # None: the device is the host (no copies to order)
        self.d2h = None              # event: host copy complete
        self.h2d = None              # event: device copy complete
        self.fetched: torch.Tensor | None = None
        self.used = False            # unpacked at least once (its backward has run)
        self.prev: weakref.ref | None = None   # the input saved just before this one (the previous block)
        self.nbytes = 0


HOST_CATEGORY = "activation_checkpoints"   # the memory ledger's host category of the copies


class ActivationOffloader:
    """Saved-tensor hooks that keep checkpointed blocks' inputs in host memory; ``checkpoint`` uses them.

    One instance per model (its blocks form one prefetch chain, in forward order). One side stream per
    device carries both copy directions.
    """

    def __init__(self, device: Device | None = None) -> None:
        self._lock = threading.Lock()
        self._stats = OffloadStats()
        self._last: weakref.ref | None = None
        self._device = device
        self._cuda: dict[int, Device] = {}
        self._streams: dict[int, Any] = {}

    def __getstate__(self) -> dict:   # a copied model gets a fresh offloader (streams and locks do not copy)
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    # ---------------------------------------------------------------- public
    def use_device(self, device: Device) -> None:
        """Copy, order and account through `device` (the engine binds its own at ``initialize``)."""
        self._device = device

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
    def _device_for(self, t: torch.Tensor) -> Device | None:
        """The Device that holds `t`, or None when `t` is in host memory the device shares."""
        dev = self._device
        if dev is None and t.is_cuda:
            dev = self._cuda.get(t.device.index)
            if dev is None:
                from superoffload.device.cuda import CudaDevice

                dev = self._cuda[t.device.index] = CudaDevice(t.device.index)
        return None if dev is None or dev.shares_host_memory else dev

    def _stream(self, dev: Device) -> Any:
        s = self._streams.get(id(dev))
        if s is None:
            s = self._streams[id(dev)] = dev.new_stream("checkpoints")
        return s

    def _account(self, nbytes: int) -> None:
        with self._lock:
            st = self._stats
            st.host_bytes += nbytes
            st.peak_host_bytes = max(st.peak_host_bytes, st.host_bytes)
            if nbytes > 0:
                st.offloaded += 1

    def _pack(self, t: torch.Tensor) -> _Saved | torch.Tensor:
        if t.numel() == 0:
            # torch.utils.checkpoint (before 2.13) saves a zero-element placeholder beside the block's inputs:
            # nothing to move, and as a link of the prefetch chain it would make the previous block's input
            # wait for an unpack of its own instead of being fetched one block ahead
            return t
        saved = _Saved()
        saved.nbytes = t.numel() * t.element_size()
        src = t.detach()
        dev = saved.device = self._device_for(src)
        if dev is not None:
            saved.host = dev.host_copy_buffer(src, HOST_CATEGORY)
            stream = self._stream(dev)
            dev.wait_stream(stream, dev.current_stream(), "checkpoint: block input written")
            dev.copy_on(stream, saved.host, src, "checkpoint to host")
            saved.d2h = dev.new_event()
            dev.record(saved.d2h, stream, "checkpoint: copy to host")
            dev.hold_for(src, (stream,))   # the allocator may not reuse it before the copy is done
        else:
            # same strides (empty_like preserves dense layouts): a recompute on differently-strided input
            # could take another kernel path
            saved.host = torch.empty_like(src, device="cpu")
            saved.host.copy_(src)
        saved.prev, self._last = self._last, weakref.ref(saved)
        self._account(saved.nbytes)
        weakref.finalize(saved, self._account, -saved.nbytes)
        return saved

    def _prefetch(self, saved: _Saved) -> None:
        """Start the copy back to the device (no-op if started, or if the host copy is gone)."""
        if saved.fetched is not None or saved.host is None:
            return
        dev = saved.device
        if dev is None:
            saved.fetched = saved.host
            return
        out = dev.device_buffer_like(saved.host, "activations")   # allocated on the compute stream ...
        stream = self._stream(dev)
        dev.wait_stream(stream, dev.current_stream(), "checkpoint: prefetch buffer free")  # ... free to write
        dev.copy_on(stream, out, saved.host, "checkpoint to device")   # after the copy to host: same stream
        saved.h2d = dev.new_event()
        dev.record(saved.h2d, stream, "checkpoint: copy to device")
        dev.hold_for(out, (stream,))
        saved.fetched = out

    def _unpack(self, saved: _Saved | torch.Tensor) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        with self._lock:
            prefetched = saved.fetched is not None
            if prefetched:
                self._stats.prefetched += 1
            else:
                self._stats.fetched_on_demand += 1
        self._prefetch(saved)
        out = saved.fetched
        if saved.h2d is not None:
            saved.device.wait_event(saved.device.current_stream(), saved.h2d, "checkpoint: prefetched input landed")
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


def enable_offloaded_checkpointing(model: nn.Module,
                                   offloader: ActivationOffloader | None = None) -> ActivationOffloader:
    """Checkpoint every block of ``model`` with its input held in host memory; returns the offloader (also
    ``model.activation_offloader``, which ``superoffload.initialize`` binds to its device).

    A zoo model does it itself (``offload_checkpoints_to``); any other model is taken to be a transformers
    model, checkpointed through transformers' own per-layer hook with ``ActivationOffloader.checkpoint``
    as the checkpointing function.
    """
    offloader = offloader or ActivationOffloader()
    own = getattr(model, "offload_checkpoints_to", None)
    if callable(own):
        own(offloader)
        return offloader
    from superoffload.models.hf import checkpoint_transformers_with

    checkpoint_transformers_with(model, offloader.checkpoint)
    model.activation_offloader = offloader
    return offloader
