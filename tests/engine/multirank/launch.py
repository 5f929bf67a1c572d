"""Run `worker.py` as W gloo ranks on 127.0.0.1 (subprocesses) and collect each rank's result file.

Every rank creates its process group with a short timeout, so a collective that never completes (a rank
that died, a mismatched sequence) ends the run with an error instead of hanging it; the launcher kills any
rank still running after `timeout` seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.ranks import free_port, launch, rank_env

WORKER = Path(__file__).with_name("worker.py")


def run_ranks(world: int, scenario: str, out: Path, timeout: float = 240.0, args: tuple[str, ...] = (),
              check: bool = True, pg_timeout_s: int = 60,
              wait_for: tuple[int, ...] | None = None) -> tuple[list[dict | None], list[int | None], list[float]]:
    """(per-rank results or None, exit codes (None: killed), seconds until each rank ended). `wait_for`: the
    ranks whose end is awaited (default all); the others are killed once those have ended."""
    port = free_port()
    ended = launch(world, lambda rank: [str(WORKER), "--world", str(world), "--rank", str(rank), "--port",
                                        str(port), "--out", str(out), "--scenario", scenario, "--pg-timeout",
                                        str(pg_timeout_s), *args],
                   out, env=rank_env({"PYTHONWARNINGS": "ignore"}), timeout=timeout, wait_for=wait_for)
    if check and ended.failed():
        raise RuntimeError(ended.report(f"W={world} scenario {scenario!r}"))
    codes, wall = ended.codes, ended.wall_s
    results = []
    for r in range(world):
        f = out / f"rank{r}.pt"
        results.append(torch.load(f, weights_only=False) if f.exists() else None)
    return results, codes, wall
