"""Wait for a subprocess as long as it makes progress; kill it, and everything it started, once it stalls.

A fixed wall-clock limit on a long subprocess (snakemake, torchrun, a gloo job) fails the test on a busy
machine: a shared CI runner or a laptop running something else makes the same run two or three times slower.
Here a run is stopped only when it has made no progress for ``stall_s`` seconds, where progress is any of:
- it wrote output (stdout or stderr),
- a watched file, or any file under a watched folder, changed (size or modification time),
- ``cpu=True``: its process tree used at least ``MIN_CPU_SHARE`` of one core over a poll.
A hang does none of these: a deadlock, a rank waiting in a collective for a peer that died, a lock nobody
releases all sit blocked at no CPU. A slow machine does all of them, only more slowly. A process that spins
forever is left to pytest-timeout's per-test limit (pyproject.toml), the backstop of the whole suite.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

from tests import warm

# A blocked process tree (gloo waiting on a socket, an idle OpenMP pool, DeepSpeed's worker on its queue) uses
# well under 1 % of a core; a working one, even sharing two cores with two busy loops, a third of one or more
MIN_CPU_SHARE = 0.05
POLL_S = 0.5
# The tests' shared "no progress for this long is a hang". Long enough for the quietest honest stretch of a
# test's subprocess on a loaded machine: a collective waiting for its own timeout (SUPEROFFLOAD_DIST_TIMEOUT_S=60
# in the multi-rank tests), which then ends the run by itself. A rank waiting on another process's DeepSpeed op
# build (minutes under load; the builder's compiler is not in the waiter's tree) writes a line every
# superoffload.ds_build.HEARTBEAT_S seconds while it waits, which is progress.
HANG_S = 300.0


class Stalled(subprocess.TimeoutExpired):
    """The process made no progress for ``timeout`` seconds and was killed with its children."""

    def __str__(self) -> str:
        return (f"Command {self.cmd!r} made no progress for {self.timeout:g} s (no output, no file written, no CPU "
                "time): killed as hung")


def _files(paths: Iterable[Path]) -> frozenset[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every file at or under ``paths``: changes when any of them is written."""
    out = set()
    for p in paths:
        walk = os.walk(p) if p.is_dir() else [(str(p.parent), [], [p.name])]
        for root, _, names in walk:
            for name in names:
                with contextlib.suppress(OSError):  # gone between the listing and the stat
                    st = os.stat(os.path.join(root, name))
                    out.add((os.path.join(root, name), st.st_size, st.st_mtime_ns))
    return frozenset(out)


def tree_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds used by these processes, their descendants and the children they have reaped."""
    total, seen = 0.0, set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
    return total


class Progress:
    """Watches processes and paths; ``idle_s()`` is how long since any of them last made progress."""

    def __init__(self, pids: Sequence[int], watch: Iterable[Path] = (), cpu: bool = True) -> None:
        self.pids, self.watch, self.cpu = list(pids), [Path(p) for p in watch], cpu
        self.files = _files(self.watch)
        self.cpu_s = tree_cpu_s(self.pids) if cpu else 0.0
        self.polled = self.last = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last progress; looks again at most every POLL_S (a caller may loop faster)."""
        now = time.monotonic()
        if now - self.polled < POLL_S:
            return now - self.last
        files = _files(self.watch)
        moved = files != self.files
        if self.cpu:
            cpu_s = tree_cpu_s(self.pids)
            moved |= cpu_s - self.cpu_s >= MIN_CPU_SHARE * (now - self.polled)
            self.cpu_s = max(self.cpu_s, cpu_s)  # a descendant that ended takes its time with it
        self.files, self.polled = files, now
        if moved:
            self.last = now
        return now - self.last


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (found before the kill: orphans are re-parented)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def _ended(proc: subprocess.Popen) -> bool:
    """Wait up to POLL_S for ``proc`` to end (returning as soon as it does, so a short command costs no
    polling delay); whether it has."""
    try:
        proc.wait(timeout=POLL_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def run(cmd: Sequence[str], *, stall_s: float = HANG_S, watch: Iterable[Path] = (), cpu: bool = True,
        cwd: str | Path | None = None, env: dict[str, str] | None = None,
        check: bool = False, warm_start: bool = True) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, check=check)`` that raises Stalled (a
    TimeoutExpired) after ``stall_s`` seconds without progress instead of after a fixed time. The output goes
    through files, so it counts as progress and a chatty process never blocks on a full pipe. ``warm_start``:
    a Python command starts from an interpreter with torch imported (tests/warm.py)."""
    with tempfile.TemporaryDirectory(prefix="watchdog-") as d:
        out, err = Path(d, "stdout"), Path(d, "stderr")
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = (warm.popen(cmd, stdout=fo, stderr=fe, cwd=cwd, env=env) if warm_start else
                    subprocess.Popen(list(cmd), stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=cwd, env=env))
            try:
                progress = Progress([proc.pid], [out, err, *watch], cpu)
                while not _ended(proc):
                    if progress.idle_s() > stall_s:
                        kill_tree(proc.pid)
                        raise Stalled(list(cmd), stall_s, output=out.read_text(errors="replace"),
                                      stderr=err.read_text(errors="replace"))
            finally:  # a test interrupted (Ctrl-C, pytest-timeout) leaves nothing running
                if proc.poll() is None:
                    kill_tree(proc.pid)
        done = subprocess.CompletedProcess(list(cmd), proc.returncode, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
    if check:
        done.check_returncode()
    return done
