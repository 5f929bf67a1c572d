"""Happens-before tracking for the simulated device: vector clocks over streams and host threads.

The model is CUDA's, as PyTorch's CUDA sanitizer (torch/cuda/_sanitizer.py) describes it:

- *actors* are the device's streams and the host threads. Work an actor does is ordered with its own
  earlier work and with nothing else, unless an edge says so;
- edges: enqueueing work on a stream orders it after everything the enqueueing host thread did before
  (a launch cannot start before the host issued it); ``event.record(s)`` snapshots stream ``s``;
  ``s.wait_event(e)`` orders ``s``'s later work after that snapshot; ``event.synchronize()`` /
  ``stream.synchronize()`` order the *calling host thread* after it; a host-side event set -> wait
  (a bucket's "uploaded" count, a worker task's submission and completion) orders the waiter after the
  setter;
- *accesses* are reads and writes of byte ranges of tracked storages, each stamped with its actor's
  epoch. Two accesses to overlapping bytes, at least one a write, by different actors, neither ordered
  before the other, are a hazard;
- *frees*: a device buffer returned to the allocator on stream ``s`` may be reused by ``s`` at once, so
  every access to it by another stream must be ordered before ``s`` (or that stream declared with
  ``record_stream``).

Each actor's clock is a dict {actor: epoch}. An actor's accesses carry its current epoch; a release
(event record, host event set, task submission) snapshots the clock and then advances the actor's own
epoch, so later work is not covered by that snapshot. The check is deterministic: it does not depend
on timing, so a missing edge is reported even when the real interleaving happened to be benign.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

Clock = dict[Any, int]


class HazardError(RuntimeError):
    """Two accesses to the same memory that no stream wait, event or host synchronization orders."""


@dataclass
class Access:
    actor: Any
    epoch: int
    write: bool
    start: int
    end: int
    what: str  # the op, for the report


@dataclass
class Storage:
    """A tracked allocation (keyed by its base address)."""

    kind: str  # "device" | "host"
    nbytes: int
    label: str
    accesses: list[Access] = field(default_factory=list)


def _name(actor: Any) -> str:
    return actor if isinstance(actor, str) else getattr(actor, "name", repr(actor))


class HBTracker:
    """The clocks, the tracked storages and the hazard check (thread-safe)."""

    def __init__(self, raise_on_hazard: bool = True) -> None:
        self._lock = threading.RLock()
        self._clocks: dict[Any, Clock] = {}
        self.storages: dict[int, Storage] = {}
        self.hazards: list[str] = []
        self.raise_on_hazard = raise_on_hazard

    # --- clocks ------------------------------------------------------------------------------------
    @staticmethod
    def thread_actor() -> str:
        t = threading.current_thread()
        return f"thread:{t.name}"

    def clock(self, actor: Any) -> Clock:
        c = self._clocks.get(actor)
        if c is None:
            c = self._clocks[actor] = {actor: 1}
        return c

    def snapshot(self, actor: Any) -> Clock:
        """Release: a copy of the actor's clock; its later work is not covered by the copy."""
        with self._lock:
            c = self.clock(actor)
            snap = dict(c)
            c[actor] += 1
            return snap

    def join(self, actor: Any, other: Clock | None) -> None:
        """Acquire: the actor's later work is ordered after everything `other` covers."""
        if not other:
            return
        with self._lock:
            c = self.clock(actor)
            for k, v in other.items():
                if c.get(k, 0) < v:
                    c[k] = v

    def launch(self, stream: Any) -> None:
        """Work enqueued on `stream` by the calling thread starts after the thread's earlier work (a
        release by the thread: its later host work is not ordered before the launched work)."""
        with self._lock:
            self.join(stream, self.snapshot(self.thread_actor()))

    def ordered_before(self, a: Access, actor: Any) -> bool:
        return a.actor == actor or self.clock(actor).get(a.actor, 0) >= a.epoch

    # --- storages and accesses ---------------------------------------------------------------------
    def register(self, base: int, nbytes: int, kind: str, label: str) -> None:
        with self._lock:
            self.storages[base] = Storage(kind, nbytes, label)

    def unregister(self, base: int) -> Storage | None:
        with self._lock:
            return self.storages.pop(base, None)

    def kind_of(self, base: int) -> str | None:
        st = self.storages.get(base)
        return st.kind if st is not None else None

    def access(self, actor: Any, base: int, start: int, end: int, write: bool, what: str) -> None:
        """Check an access against the storage's earlier ones, then record it."""
        with self._lock:
            st = self.storages.get(base)
            if st is None or end <= start:
                return
            epoch = self.clock(actor)[actor]
            keep: list[Access] = []
            for a in st.accesses:
                overlap = a.start < end and start < a.end
                if overlap and (a.write or write) and not self.ordered_before(a, actor):
                    self._report(st, a, Access(actor, epoch, write, start, end, what))
                # a covered access ordered before this write is subsumed by it (transitivity); an
                # earlier access of the same kind by the same actor over the same bytes is superseded
                covered = a.start >= start and a.end <= end
                if covered and ((write and self.ordered_before(a, actor)) or
                                (a.actor == actor and a.write == write)):
                    continue
                keep.append(a)
            keep.append(Access(actor, epoch, write, start, end, what))
            st.accesses = keep

    def free(self, base: int, on: Any, safe_streams: tuple[Any, ...] = ()) -> None:
        """Device memory returned to the allocator on stream `on`: every other access must be ordered
        before `on`, except by streams declared with record_stream (the allocator waits for those)."""
        with self._lock:
            st = self.storages.pop(base, None)
            if st is None:
                return
            for a in st.accesses:
                if a.actor in safe_streams or self.ordered_before(a, on):
                    continue
                self._report(st, a, Access(on, self.clock(on)[on], True, a.start, a.end,
                                           f"free on {_name(on)} (memory reusable by {_name(on)})"))

    def _report(self, st: Storage, earlier: Access, later: Access) -> None:
        msg = (f"unordered {'write' if earlier.write else 'read'} / {'write' if later.write else 'read'} of "
               f"{st.label} bytes [{max(earlier.start, later.start)}, {min(earlier.end, later.end)}): "
               f"{earlier.what} on {_name(earlier.actor)} is not ordered before {later.what} on "
               f"{_name(later.actor)} (no stream wait, event or host synchronization between them)")
        self.hazards.append(msg)
        if self.raise_on_hazard:
            raise HazardError(msg + "\n" + "".join(traceback.format_stack(limit=12)[:-2]))
