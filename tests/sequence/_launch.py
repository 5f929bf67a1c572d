"""Launch ``_worker.py`` as W gloo ranks on 127.0.0.1 and collect their JSON results.

Each rank is a subprocess with ``OMP_NUM_THREADS=1``; the process group is created with a 60 s timeout,
so a broken collective ends the run instead of hanging it, and the launcher kills the ranks after
``timeout`` seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.ranks import free_port, launch

WORKER = Path(__file__).with_name("_worker.py")


def run_ranks(world: int, scenarios: list[str], out: Path, timeout: float = 240.0) -> list[dict]:
    port = free_port()
    ended = launch(world, lambda rank: [str(WORKER), "--world", str(world), "--rank", str(rank), "--port",
                                        str(port), "--out", str(out), "--scenarios", ",".join(scenarios)],
                   out, timeout=timeout)
    if ended.failed():
        raise RuntimeError(ended.report(f"SP={world} ranks"))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
