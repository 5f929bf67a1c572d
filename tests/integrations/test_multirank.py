"""Two ranks on gloo (127.0.0.1): superoffload.AdamW in a plain loop and SuperOffloadTrainer, each rank
half of every global batch, against one process on the whole batch (torch's AdamW, the Trainer with
adamw_torch). The ranks sum their gradients in another order than one process does, hence a tolerance."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from tests.integrations import scenarios  # noqa: E402
from tests.integrations.tiny import max_rel  # noqa: E402
from tests.ranks import free_port, launch, rank_env  # noqa: E402

WORKER = Path(__file__).with_name("ranks_worker.py")


def two_ranks(scenario: str, out: Path) -> list[dict]:
    port = str(free_port())
    ended = launch(2, lambda rank: [str(WORKER), scenario, str(out)], out,
                   env=rank_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                                 "LOCAL_WORLD_SIZE": "2", "PYTHONWARNINGS": "ignore"}),
                   rank_vars=lambda rank: {"RANK": str(rank), "LOCAL_RANK": str(rank)}, timeout=300)
    if ended.failed():
        pytest.fail(ended.report(f"two ranks, {scenario}"))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_adamw_on_two_ranks_trains_the_global_batch_as_torch_adamw(tmp_path):
    ranks = two_ranks("adamw", tmp_path)
    (ref, ref_norms), _ = scenarios.adamw_loop(0, 1, make=lambda m: torch.optim.AdamW(
        scenarios.decay_groups(m, 0.1, extra_lr=1e-3), lr=3e-3, betas=(0.9, 0.95)))
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    assert max_rel(ref, mean) < 1e-5
    # the norm sees the gradients' scale, which Adam's update hardly does: averaged once over the ranks
    assert ranks[0]["norms"] == ranks[1]["norms"] and max_rel(ref_norms, ranks[0]["norms"]) < 1e-5
    states = [r["state"]["engine"] for r in ranks]
    assert {s["world_size"] for s in states} == {2} and states[0]["rank"] == 0 and states[1]["rank"] == 1


def test_the_trainer_on_two_ranks_trains_as_one_process(tmp_path):
    ranks = two_ranks("trainer", tmp_path)
    ref = scenarios.trainer_run(tmp_path / "ref", cls=__import__("transformers").Trainer)
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    assert max_rel(ref.recorded, mean) < 1e-5
    ref_norms = [h["grad_norm"] for h in ref.state.log_history if "grad_norm" in h]
    assert max_rel(ref_norms, ranks[0]["norms"]) < 1e-5  # no DDP averaging on top of the engine's
    ckpt = tmp_path / "run" / "checkpoint-6"
    assert sorted(p.name for p in ckpt.glob("optimizer_rank*.pt")) == ["optimizer_rank0.pt", "optimizer_rank1.pt"]
    # a two-rank checkpoint resumes on one rank: every shard is read and re-sharded
    one = scenarios.trainer_run(tmp_path / "one", max_steps=7, resume=str(ckpt))
    assert len(one.recorded) == 2 and one.state.global_step == 7


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
