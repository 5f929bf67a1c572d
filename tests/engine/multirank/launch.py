"""Run `worker.py` as W gloo ranks on 127.0.0.1 (subprocesses) and collect each rank's result file.

Every rank creates its process group with a short timeout, so a collective that never completes (a rank
that died, a mismatched sequence) ends the run with an error instead of hanging it; the launcher kills any
rank still running after `timeout` seconds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("worker.py")
REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(world: int, scenario: str, out: Path, timeout: float = 240.0, args: tuple[str, ...] = (),
              check: bool = True, pg_timeout_s: int = 60,
              wait_for: tuple[int, ...] | None = None) -> tuple[list[dict | None], list[int], list[float]]:
    """(per-rank results or None, exit codes, seconds until each rank ended). `wait_for`: the ranks whose
    end is awaited (default all); the others are killed once those have ended."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    procs = []
    t0 = time.monotonic()
    for rank in range(world):
        cmd = [sys.executable, str(WORKER), "--world", str(world), "--rank", str(rank), "--port", str(port),
               "--out", str(out), "--scenario", scenario, "--pg-timeout", str(pg_timeout_s), *args]
        log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log))
    deadline = t0 + timeout
    ended: list[float | None] = [None] * world
    try:
        awaited = range(world) if wait_for is None else wait_for
        while time.monotonic() < deadline and any(ended[r] is None for r in awaited):
            for r, (p, _) in enumerate(procs):
                if ended[r] is None and p.poll() is not None:
                    ended[r] = time.monotonic() - t0
            time.sleep(0.1)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    wall = [e if e is not None else time.monotonic() - t0 for e in ended]
    codes = [p.returncode for p, _ in procs]
    if check and any(codes):
        logs = "\n".join(f"--- rank {r} (exit {c}) ---\n" + (out / f"rank{r}.log").read_text()[-4000:]
                         for r, c in enumerate(codes))
        raise RuntimeError(f"W={world} scenario {scenario!r} failed:\n{logs}")
    results = []
    for r in range(world):
        f = out / f"rank{r}.pt"
        results.append(torch.load(f, weights_only=False) if f.exists() else None)
    return results, codes, wall
