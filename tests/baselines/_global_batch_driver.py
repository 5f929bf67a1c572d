"""Run one benchmark so that world size 1 and world size N see the same global batch.

The harness gives each rank its own data stream (seeded by rank), so a 2-rank run and a 1-rank run
normally train on different tokens. For the parity test, every rank instead draws the whole global
batch from rank 0's stream and keeps its own contiguous slice; world size 1 draws the same global
batch whole. Used in-process (world 1) and as a torchrun script (world N):

    torchrun --standalone --nproc_per_node 2 _global_batch_driver.py '<RunConfig JSON>' OUT_DIR

Each rank writes OUT_DIR/rank{R}.json with its status, per-step losses and system_stats.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from superoffload.harness import runner
from superoffload.harness.data import SyntheticData
from superoffload.harness.system import RunConfig


class GlobalBatchData(SyntheticData):
    def __init__(self, *, batch: int, rank: int = 0, **kw: Any) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        super().__init__(batch=batch * world, rank=0, **kw)
        self.rows = slice(rank * batch, (rank + 1) * batch)

    def micro_batch(self, step: int, micro: int):
        x, y = super().micro_batch(step, micro)
        return x[self.rows].contiguous(), y[self.rows].contiguous()


def run_global_batch(run: RunConfig) -> dict[str, Any]:
    saved = runner.SyntheticData
    runner.SyntheticData = GlobalBatchData
    try:
        return runner.run_benchmark(run)
    finally:
        runner.SyntheticData = saved


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    cfg["betas"] = tuple(cfg.get("betas", (0.9, 0.95)))
    rec = run_global_batch(RunConfig(**cfg))
    rank = int(os.environ.get("RANK", "0"))
    out = {"status": rec["status"], "error": rec["error"], "losses": rec["losses"],
           "world_size": rec["run"]["world_size"], "system_stats": rec["system_stats"]}
    Path(argv[1], f"rank{rank}.json").write_text(json.dumps(out))
    return 0 if rec["status"] == "ok" else 1


if __name__ == "__main__":  # guarded: DeepSpeed's SuperOffload worker is spawned and re-imports __main__
    sys.exit(main(sys.argv[1:]))
