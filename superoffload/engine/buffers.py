"""Host arenas: all of a kind of host buffer carved from one exact-size allocation.

Pinned memory is only for what crosses the link (landing gradients, the upload copy, norm scalars, the
host stores of flowed weights); fp32 masters and Adam moments are pageable. Each kind is requested once,
at its exact total size (every view starts on a `HOST_ALIGN`-byte boundary), so nothing is rounded up per
bucket and a re-layout never allocates a second set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from superoffload.device import Device
from superoffload.device.base import HOST_ALIGN


def _aligned(nbytes: int) -> int:
    return -(-nbytes // HOST_ALIGN) * HOST_ALIGN


def aligned_bytes(req: ArenaRequest) -> int:
    """The bytes a request takes in its arena (each view starts on a HOST_ALIGN boundary)."""
    return _aligned(req.nbytes)


@dataclass
class ArenaRequest:
    """One typed buffer wanted from an arena: `numel` elements of `dtype`; filled in by `carve`."""

    numel: int
    dtype: torch.dtype
    tensor: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class HostArena:
    device: Device
    pinned: bool
    category: str
    requests: list[ArenaRequest] = field(default_factory=list)
    buffer: torch.Tensor | None = None

    def request(self, numel: int, dtype: torch.dtype) -> ArenaRequest:
        if self.buffer is not None:
            raise RuntimeError("this arena is already allocated")
        r = ArenaRequest(numel, dtype)
        self.requests.append(r)
        return r

    def allocate(self) -> None:
        """One allocation of the exact total size, then a typed view per request."""
        total = sum(_aligned(r.nbytes) for r in self.requests)
        self.buffer = self.device.host_buffer(total, self.pinned, self.category)
        off = 0
        for r in self.requests:
            view = self.buffer[off: off + r.nbytes]
            r.tensor = view.view(r.dtype) if r.numel else torch.empty(0, dtype=r.dtype)
            off += _aligned(r.nbytes)

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel()

    def free(self) -> None:
        if self.buffer is not None:
            self.device.free_host_buffer(self.buffer, self.pinned, self.category)
            self.buffer = None
            for r in self.requests:
                r.tensor = None


class StagingRing:
    """Device slots a host bucket's flat gradient (and its reduced shard) passes through on its way to
    the host. A slot is reused once the D2H that read it has run (its `free` event); slots are handed
    out round robin, all on the side stream, so reuse order is the launch order."""

    def __init__(self, device: Device, slots: int, numel: int, shard_numel: int, dtype: torch.dtype,
                 separate_shard: bool) -> None:
        self.device = device
        self.flat = [device.zeros(numel, dtype, "staging") for _ in range(slots)] if numel else []
        self.shard = ([device.zeros(shard_numel, dtype, "staging") for _ in range(slots)]
                      if separate_shard and shard_numel else [])
        self.free_event = [device.new_event() for _ in range(slots)]
        self._next = 0

    def __len__(self) -> int:
        return len(self.flat)

    def acquire(self) -> int:
        i = self._next
        self._next = (i + 1) % len(self.flat)
        return i

    def close(self) -> None:
        for t in (*self.flat, *self.shard):
            self.device.free(t, "staging")
        self.flat, self.shard = [], []


class UploadRing:
    """Pinned host slots that host buckets' new weights pass through on their way to the device (config
    `upload_slots`), instead of one upload buffer per bucket. The bucket at publish position p (forward
    order) uses slot p mod k, so within a step a slot is reused only by a later publish; the host writes
    a slot only after the H2D that last read it ran (its `free` event, recorded on the upload stream)."""

    def __init__(self, device: Device, slots: int, numel: int, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.arena = HostArena(device, pinned=not device.shares_host_memory, category="transfer")
        reqs = [self.arena.request(numel, dtype) for _ in range(slots)]
        self.arena.allocate()
        self.slots = [r.tensor for r in reqs]
        for t in self.slots:
            t.zero_()
        self.free_event = [device.new_event() for _ in range(slots)]

    def __len__(self) -> int:
        return len(self.slots)
