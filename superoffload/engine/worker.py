"""The host worker: one native thread that runs bucket tasks (host Adam steps and uploads) in order.

The kernel releases the GIL (ctypes calls drop it), so the training thread keeps driving the device
while the host steps. Tasks run strictly in submission order, which is what makes per-bucket ordering
(speculate -> finalize -> next step's landing) safe without more locks. A task that raises poisons
the worker: the exception is kept, every waiter is released, and the training thread re-raises it
at its next engine call (`check()`), so a failure is never silent and never a hang.

Hand-offs between the threads are also happens-before edges for the simulated device: a task runs
after everything the submitting thread did before `submit`, and `drain` returns after everything the
tasks did.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from superoffload.device import Device

# seconds between checks of the worker's health while waiting for a task's event: a failure is seen
# within this (a judgment: short against a failure's cost, long against a step; the wait itself wakes
# at once when the event is set)
POLL_S = 0.05


class HostWorkerError(RuntimeError):
    """Raised in the training thread when a host task failed."""


class NonFiniteError(RuntimeError):
    """Steps keep failing on non-finite gradients (or fp16 overflows at the minimum loss scale): the run is
    not training. Raised by step() after the skipped step is complete, so the engine stays usable."""


# every worker still running when the interpreter exits; see _close_at_exit
_LIVE: weakref.WeakSet[HostWorker] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Let each live worker finish its queued tasks and stop before the interpreter finalizes. A script that
    ends right after its last optimizer step (the HF Trainer's train() returning, a plain loop's last
    opt.step()) leaves that step's weight returns running on the worker; a daemon thread still inside a torch
    call when finalization starts is killed by pthread_exit through torch's C++ frames, and the process
    aborts ("terminate called without an active exception"). atexit runs before finalization, so the
    thread can still end normally."""
    for w in list(_LIVE):
        w.close()


class HostWorker:
    def __init__(self, device: Device, name: str = "superoffload-host") -> None:
        self._device = device
        self._q: queue.SimpleQueue[tuple[Callable[[], None], str, Any] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._error_task = ""
        self._pending = 0
        self._done_token: Any = None
        self._cv = threading.Condition()
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _loop(self) -> None:
        dev = self._device
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, label, token = item
            if self._error is None:
                t0 = time.perf_counter()
                try:
                    dev.worker_acquire(token)
                    with dev.tracking(host_thread=True):
                        fn()
                except BaseException as e:  # noqa: BLE001 - surfaced in the training thread
                    self._error, self._error_task = e, label
                self.busy_s += time.perf_counter() - t0
            del item, fn, token  # the task's tensors are not kept alive while the worker waits
            with self._cv:
                self._done_token = dev.worker_release()
                self._pending -= 1
                self._cv.notify_all()

    def submit(self, fn: Callable[[], None], label: str = "") -> None:
        self.check()
        with self._cv:
            self._pending += 1
        self._q.put((fn, label, self._device.worker_release()))

    @property
    def failed(self) -> bool:
        return self._error is not None

    def check(self) -> None:
        if self._error is not None:
            raise HostWorkerError(f"host worker task {self._error_task!r} failed: "
                                  f"{type(self._error).__name__}: {self._error}") from self._error

    def drain(self, check: bool = True) -> None:
        """Block until every submitted task has run, then re-raise a failure if there was one."""
        with self._cv:
            self._cv.wait_for(lambda: self._pending == 0)
            token = self._done_token
        self._device.worker_acquire(token)
        if check:
            self.check()

    def wait_event(self, ev: threading.Event) -> None:
        """Wait for an event set by a task, without hanging if the worker died: a failed task never sets
        its event, so the wait polls the worker's health every POLL_S."""
        while not ev.wait(POLL_S):
            self.check()
            if not self._thread.is_alive():
                raise HostWorkerError("host worker thread is not running")
        self.check()

    def close(self) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=60)
