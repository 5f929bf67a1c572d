"""One rank of a two-rank gloo job (127.0.0.1) for the drop-in tests; torchrun's variables come from the
launcher. Scenarios:

- `adamw`: a plain torch loop with superoffload.AdamW, each rank its half of every global batch,
  `clip_grad_norm_`, a cosine schedule, accumulation 2; writes its losses and its state_dict;
- `trainer`: SuperOffloadTrainer with `ddp_backend="gloo"`; writes its recorded losses, and saves a
  checkpoint at the end (one optimizer file per rank).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integrations import scenarios  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["adamw", "trainer"])
    p.add_argument("out", type=Path)
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if a.scenario == "adamw":
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        (losses, norms), opt = scenarios.adamw_loop(rank, world)
        torch.save({"losses": losses, "norms": norms, "state": opt.state_dict()}, a.out / f"rank{rank}.pt")
        dist.destroy_process_group()
    else:
        trainer = scenarios.trainer_run(a.out / "run", world=world, ddp_backend="gloo", ddp_timeout=60,
                                        save_strategy="steps", save_steps=6)
        norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
        torch.save({"losses": trainer.recorded, "norms": norms}, a.out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
