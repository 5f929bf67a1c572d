"""Launch ``_worker.py`` as W gloo ranks on 127.0.0.1 and collect their JSON results.

Each rank is a subprocess with ``OMP_NUM_THREADS=1``; the process group is created with a 60 s timeout,
so a broken collective ends the run instead of hanging it, and the launcher kills the ranks after
``timeout`` seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, scenarios: list[str], out: Path, timeout: float = 240.0) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    procs = []
    for rank in range(world):
        cmd = [sys.executable, str(WORKER), "--world", str(world), "--rank", str(rank), "--port", str(port),
               "--out", str(out), "--scenarios", ",".join(scenarios)]
        log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log))
    deadline = time.monotonic() + timeout
    try:
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n" + (out / f"rank{r}.log").read_text()[-4000:]
                     for r, (p, _) in enumerate(procs))
    if any(p.returncode != 0 for p, _ in procs):
        raise RuntimeError(f"SP={world} ranks failed:\n{logs}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
