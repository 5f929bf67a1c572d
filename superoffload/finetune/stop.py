"""Pre-emption: a signal asks the run to stop, and it stops at the next step boundary, checkpointed.

SLURM pre-emption, `scancel` and torchrun send SIGTERM; SLURM can send SIGUSR1 ahead of a time limit
(`#SBATCH --signal=USR1@120`); Ctrl-C sends SIGINT. Killing the process there and then would lose every
step since the last `--save-every` checkpoint, and a signal during a save would leave a half-written
temporary. So the handler only sets a flag. At each step boundary the ranks agree on it (the flag is
summed over the ranks, so a signal to any one rank stops them all at the same step), write a checkpoint
of that step and a record with status "preempted", and the process exits with a documented code: 75
(EX_TEMPFAIL: "try again") for SIGTERM / SIGUSR1, which a requeue script tells apart from a failure (1) or
bad input (2), and 130 for SIGINT. A second SIGINT is Python's KeyboardInterrupt: a way out that does not
wait for the step.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention
SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None), signal.SIGINT) if s)


class StopRequest:
    """Installed for the life of a training loop (main thread only; elsewhere it never fires)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self.signum = self.signum or signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.signum == signal.SIGINT else EXIT_PREEMPTED
