"""World size 2 (gloo) against world size 1 on the same global batch, for every system (torch as DDP, the
engine sharded over the ranks); the CLI end to end.

torch's DDP runs under torchrun itself; the others under tests/ranks.py's launcher with the variables
torchrun gives a rank (RANK, WORLD_SIZE, MASTER_ADDR ...), so their ranks start warm (tests/warm.py): what
they test is the system on two ranks, and a torchrun start costs a cold interpreter per rank plus its own.

Each rank's loss is the mean over its half of the global batch, so the mean of the two ranks' losses is
the world-1 loss of the whole batch. Gradients are averaged across ranks in fp32, which only changes
the summation order: TOL is the same 1e-3 as the single-process parity tests (measured differences
are ~1e-5). FSDP runs with clipping on, so the all-reduced global norm is checked as well.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _global_batch_driver import run_global_batch

from superoffload.harness.system import RunConfig
from tests import _watchdog as watchdog
from tests.ranks import free_port, launch, rank_env

HERE = Path(__file__).parent
TOL = 1e-3
CFG = {"model": "gpt-tiny", "seq": 32, "batch": 2, "steps": 6, "warmup": 2, "lr": 1e-2, "seed": 99}
# both launches: 127.0.0.1 only, and a lost rank fails the test instead of hanging it
DIST_VARS = {"GLOO_SOCKET_IFNAME": "lo", "SUPEROFFLOAD_DIST_TIMEOUT_S": "60"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # set by this pytest process for its own world-1 group; torchrun sets its own
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env.update(DIST_VARS)
    return env


def _torchrun(cfg: dict, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "_global_batch_driver.py"), json.dumps(cfg), str(out)]
    proc = watchdog.run(cmd, env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _launched(cfg: dict, out: Path) -> list[dict]:
    """The job of _torchrun, its two ranks started by tests/ranks.py with torchrun's variables."""
    # (no PYTHONWARNINGS, which _env sets: a start-up variable, it would give these ranks zygotes of their own)
    env = rank_env({**DIST_VARS, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "2"})
    ended = launch(2, lambda rank: [str(HERE / "_global_batch_driver.py"), json.dumps(cfg), str(out)], out / "logs",
                   env=env, rank_vars=lambda rank: {"RANK": str(rank), "LOCAL_RANK": str(rank)})
    assert not ended.failed(), ended.report(f"{cfg['system']} on two ranks")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(("system", "grad_clip"), [
    ("zero_offload", 0.0),
    ("fsdp_offload", 1.0),
    pytest.param("torch", 1.0, id="torch-ddp"),
    ("superoffload", 1.0),
    ("zero_infinity", 1.0),
    pytest.param("ds_superoffload", 0.0, marks=pytest.mark.slow),
])
def test_world_size_2_matches_world_size_1(system: str, grad_clip: float, tmp_path: Path) -> None:
    if system in ("zero_offload", "zero_infinity", "ds_superoffload"):
        pytest.importorskip("deepspeed")
    cfg = {**CFG, "system": system, "grad_clip": grad_clip}
    if system == "superoffload":
        cfg["system_options"] = {"bucket_size": 65536}
    ranks = (_torchrun if system == "torch" else _launched)({**cfg, "batch": 2}, tmp_path)
    one = run_global_batch(RunConfig(**{**cfg, "batch": 4, "threads": 2}))
    assert one["status"] == "ok", one["error"]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["losses"] != ranks[1]["losses"]  # the ranks really saw different halves
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    diffs = [abs(a - b) for a, b in zip(mean, one["losses"], strict=True)]
    assert max(diffs) <= TOL, f"world 2 vs world 1 |Δloss| per step: {diffs}"
    if system == "torch":
        assert all(r["system_stats"]["ddp"] for r in ranks) and not one["system_stats"]["ddp"]
    if system == "superoffload":  # the engine sharded over the two ranks
        assert [r["system_stats"]["world_size"] for r in ranks] == [2, 2]
    if grad_clip and "grad_norms" in one["system_stats"]:
        n1 = one["system_stats"]["grad_norms"]
        assert max(n1) > grad_clip  # clipping fired
        for r in ranks:  # every rank clipped with the global norm, the same as world 1's
            assert r["system_stats"]["grad_norms"] == pytest.approx(n1, rel=1e-3)


@pytest.mark.usefixtures("needs_deepspeed")
def test_ds_superoffload_from_the_cli(tmp_path: Path) -> None:
    """The CPU-Adam worker is spawned and re-imports __main__: `python -m superoffload` must survive it
    (and so must this pytest process, which runs the adapter in-process in the parity tests)."""
    out = tmp_path / "rec.json"
    cmd = [sys.executable, "-m", "superoffload", "bench", "run", "--system", "ds_superoffload",
           "--model", "gpt-tiny", "--seq", "32", "--batch", "2", "--steps", "3", "--warmup", "1",
           "--threads", "2", "--no-progress", "-o", "ratio=1.0", "-o", "cpuadam_cores_perc=0.5",
           "--out", str(out)]
    proc = watchdog.run(cmd, env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok"
    stats = rec["system_stats"]
    assert stats["optimizer"] == "SuperOffloadOptimizer_Stage3"
    assert stats["cpu_shims"] is True
    assert stats["deepspeed_config"]["zero_optimization"]["offload_optimizer"]["cpuadam_cores_perc"] == 0.5


def test_cli_rejects_bad_option_with_exit_code_2(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "superoffload", "bench", "run", "--system", "ds_superoffload",
           "--model", "gpt-tiny", "-o", "ratio=2", "--out", str(tmp_path / "r.json")]
    proc = watchdog.run(cmd, env=_env())
    assert proc.returncode == 2 and "ratio" in proc.stderr
    assert not (tmp_path / "r.json").exists()
