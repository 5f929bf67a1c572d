"""Start W processes as the ranks of one gloo job on 127.0.0.1 and wait for them, never forever.

The multi-rank tests (engine, sequence parallelism, finetune) share this: every rank is a subprocess with
one OpenMP thread and its output in ``out/rank{r}.log``. Each test gives its process group a timeout, so a
broken collective ends a rank with an error; the launcher kills every rank once the job has made no progress
for ``timeout`` seconds (tests/_watchdog.py: no rank wrote to its log or under ``out``, and the ranks used no
CPU), so a hang fails the test and a busy machine, which only slows the ranks down, does not.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests import warm
from tests._watchdog import Progress, kill_tree

REPO = Path(__file__).resolve().parents[1]
# variables a launcher (torchrun, an outer test) may have set that would confuse a rank
_INHERITED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a rank: the repository on PYTHONPATH, one thread, no inherited
    rank variables."""
    # PYTHONFAULTHANDLER: a rank that dies of a signal leaves its Python stack in its log (one rank ended by
    # SIGSEGV with an empty log once, under two test workers; not reproduced since)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for k in _INHERITED:
        env.pop(k, None)
    env.update(extra or {})
    return env


@dataclass
class Ended:
    codes: list[int | None]  # exit status per rank (None: killed by the launcher)
    wall_s: list[float]  # seconds from the start until each rank ended (or was killed)
    logs: list[str]  # each rank's stdout and stderr

    def failed(self) -> bool:
        return any(c != 0 for c in self.codes)

    def report(self, what: str) -> str:
        return f"{what} failed:\n" + "\n".join(f"--- rank {r} (exit {c}) ---\n{log[-4000:]}"
                                               for r, (c, log) in enumerate(zip(self.codes, self.logs, strict=True)))


def launch(world: int, command: Callable[[int], list[str]], out: Path, *, env: dict[str, str] | None = None,
           timeout: float = 240.0, wait_for: Iterable[int] | None = None,
           rank_vars: Callable[[int], dict[str, str]] | None = None, warm_start: bool = True) -> Ended:
    """Run ``command(rank)`` (argv after the Python interpreter) for every rank, from the repository root.
    ``timeout``: seconds without progress (module docstring) after which every rank still running is killed.
    ``wait_for``: the ranks whose end is awaited (default all); the others are killed once those have ended.
    ``rank_vars(rank)``: environment variables of that rank only (torchrun's RANK etc.). ``warm_start``: each
    rank forked from an interpreter with torch imported (tests/warm.py), else started cold."""
    out.mkdir(parents=True, exist_ok=True)
    env = env if env is not None else rank_env()
    procs = []
    envs = [{**env, **(rank_vars(rank) if rank_vars else {})} for rank in range(world)]
    if warm_start:
        warm.prestart(envs)
    t0 = time.monotonic()
    for rank, renv in enumerate(envs):
        log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        argv = [sys.executable, *command(rank)]
        procs.append((warm.popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=renv, slot=rank)
                      if warm_start else
                      subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=renv), log))
    awaited = list(range(world) if wait_for is None else wait_for)
    ended: list[float | None] = [None] * world
    killed = [False] * world
    progress = Progress([p.pid for p, _ in procs], [out])
    try:
        while any(ended[r] is None for r in awaited) and progress.idle_s() <= timeout:
            for r, (p, _) in enumerate(procs):
                if ended[r] is None and p.poll() is not None:
                    ended[r] = time.monotonic() - t0
            time.sleep(0.05)
    finally:
        for r, (p, log) in enumerate(procs):
            if p.poll() is None:
                killed[r] = True
                kill_tree(p.pid)
                p.wait()
            log.close()
    wall = [e if e is not None else time.monotonic() - t0 for e in ended]
    codes = [None if k else p.returncode for (p, _), k in zip(procs, killed, strict=True)]
    logs = [(out / f"rank{r}.log").read_text() for r in range(world)]
    return Ended(codes, wall, logs)
