"""`superoffload finetune` under torchrun's environment on gloo (127.0.0.1): two ranks with --batch 1
train the rows one rank trains with --batch 2 (same losses up to the order gradients are summed in); a
two-rank checkpoint resumes bit-exactly on two ranks and re-shards onto one; the final model equals the
masters gathered from both ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from superoffload.harness import record
from tests import warm
from tests.ranks import REPO, free_port, launch, rank_env

COMMON = ["--max-length", "64", "--lr", "3e-3", "--warmup-steps", "2", "--threads", "1", "--no-progress",
          "--dtype", "fp32", "--save-dtype", "fp32", "--device", "cpu"]


def _finetune(world: int, argv: list[str], logs: Path, timeout: float = 240.0) -> list[str]:
    """Run `superoffload finetune` as ``world`` ranks with torchrun's variables; every collective times out
    after 60 s and the job after ``timeout``, so a broken rank fails the test. Returns each rank's output."""
    port = str(free_port())
    ended = launch(world, lambda rank: ["-m", "superoffload", "finetune", *COMMON, *argv], logs,
                   env=rank_env({"SUPEROFFLOAD_DIST_TIMEOUT_S": "60", "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": port, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}),
                   rank_vars=lambda rank: {"RANK": str(rank), "LOCAL_RANK": str(rank)}, timeout=timeout)
    if ended.failed():
        pytest.fail(ended.report(f"finetune with {world} ranks"))
    return ended.logs


def _losses(out: Path) -> list[float]:
    return record.read_result(out / "record.json", "run")["losses"]


@pytest.fixture(scope="module")
def two_rank_run(tiny, tmp_path_factory):
    model, data = tiny
    root = tmp_path_factory.mktemp("w2")
    # Adam's update barely depends on the gradients' scale (not at all when clipping is always active); a
    # large eps without clipping makes it depend on it, so summing over ranks (the loss is already divided
    # by every rank's tokens) is told apart from averaging
    cfg = root / "engine.json"
    cfg.write_text('{"optimizer": {"eps": 0.01}}')
    out = root / "run"
    COMMON.extend(["--grad-clip", "0", "--config", str(cfg)])
    _finetune(2, ["--model", str(model), "--data", str(data), "--steps", "6", "--batch", "1", "--grad-accum", "2",
                  "--save-every", "3", "--out", str(out)], root / "logs")
    yield model, data, out
    del COMMON[-4:]


def test_two_ranks_train_the_global_batch_of_one(two_rank_run, tmp_path):
    model, data, out = two_rank_run
    one = tmp_path / "w1"
    _finetune(1, ["--model", str(model), "--data", str(data), "--steps", "6", "--batch", "2", "--grad-accum", "2",
                  "--out", str(one)], tmp_path / "logs")
    two, single = _losses(out), _losses(one)
    assert len(two) == 6 and two[-1] < two[0]
    # the same rows, tokens and normalization; only the order of the gradient sums differs
    assert max(abs(a - b) / abs(b) for a, b in zip(two, single, strict=True)) < 1e-5, (two, single)
    rec = record.read_result(out / "record.json", "run")
    assert rec["run"]["world_size"] == 2
    assert sorted(p.name for p in (out / "checkpoints" / "step-0000006").glob("engine*.pt")) == [
        "engine-rank0.pt", "engine-rank1.pt"]
    w2, w1 = load_file(out / "final" / "model.safetensors"), load_file(one / "final" / "model.safetensors")
    assert w2.keys() == w1.keys()
    assert max(float((w2[k] - w1[k]).abs().max()) for k in w2) < 1e-4  # 6 Adam steps at lr 3e-3


def test_two_rank_checkpoint_resumes_exactly_and_reshards(two_rank_run, tmp_path):
    model, data, out = two_rank_run
    src = out / "checkpoints" / "step-0000003"
    for world, batch in ((2, 1), (1, 2)):
        split = tmp_path / f"resume-w{world}"
        (split / "checkpoints").mkdir(parents=True)
        subprocess.run(["cp", "-r", str(src), str(split / "checkpoints")], check=True)
        (split / "checkpoints" / "latest.json").write_text('{"step": 3, "dir": "step-0000003"}')
        logs = _finetune(world, ["--model", str(model), "--data", str(data), "--steps", "6", "--batch",
                                 str(batch), "--grad-accum", "2", "--out", str(split), "--resume"],
                         tmp_path / f"logs-w{world}")
        resumed, full = _losses(split), _losses(out)
        assert len(resumed) == 6 and resumed[:3] == full[:3]
        if world == 2:  # the same ranks: bit-exact
            assert resumed == full
            a, b = load_file(split / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
            assert all(torch.equal(a[k], b[k]) for k in a)
        else:  # re-sharded onto one rank: the same training, summed in another order
            assert "re-shards" in logs[0]
            assert max(abs(x - y) / abs(y) for x, y in zip(resumed, full, strict=True)) < 1e-5


def test_resume_with_another_global_batch_is_refused(two_rank_run, tmp_path):
    model, data, out = two_rank_run
    r = warm.run([sys.executable, "-m", "superoffload", "finetune", *COMMON, "--model", str(model), "--data",
                        str(data), "--steps", "6", "--batch", "1", "--grad-accum", "2", "--out", str(out),
                        "--resume"], capture_output=True, text=True, cwd=REPO, env=rank_env())
    assert r.returncode == 2
    assert "global_batch (--batch x ranks) is 1 but the checkpoint" in r.stderr
