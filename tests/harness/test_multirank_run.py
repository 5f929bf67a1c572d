"""`bench run --nproc N`: N ranks under torchrun on this host (gloo over 127.0.0.1, a collective timeout so
a lost rank ends the job), one record written by rank 0 with every rank's numbers; `--nproc` errors are
one line before anything is launched; the launcher leaves an error record when the ranks leave none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from superoffload.cli import bench_run
from superoffload.cli.main import build_parser
from superoffload.harness import record
from tests import _watchdog as watchdog

ARGS = ["--model", "gpt-tiny", "--seq", "32", "--batch", "2", "--steps", "3", "--warmup", "1", "--threads", "1",
        "--no-progress"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo", SUPEROFFLOAD_DIST_TIMEOUT_S="60")
    return env


def _bench(*args: str) -> subprocess.CompletedProcess:
    """`bench run` with these arguments; killed only once it stops making progress (tests/_watchdog.py)."""
    return watchdog.run([sys.executable, "-m", "superoffload", "bench", "run", *args], env=_env())


def _two_cores() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two gloo ranks need two cores")


# the launch, the per-rank results and the record are the harness's whatever the system: CI runs the engine
# (17 s beside other jobs); torch as DDP (27 s) is the slow variant, and its two ranks against one are
# tests/baselines/test_baselines_dist.py's torch-ddp case
@pytest.mark.parametrize("system", [pytest.param("torch", marks=pytest.mark.slow), "superoffload"])
def test_nproc_2_writes_one_record_with_every_rank(system: str, tmp_path: Path) -> None:
    _two_cores()
    out = tmp_path / "rec.json"
    opts = ["-o", "bucket_size=65536"] if system == "superoffload" else []
    proc = _bench("--system", system, *ARGS, "--nproc", "2", "--bind-cores", "--grad-clip", "1.0", *opts,
                  "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = record.read_result(out, "run")
    assert rec["status"] == "ok" and rec["world_size"] == 2
    assert rec["run"]["global_batch"] == 2 * 2 and rec["run"]["rank"] == 0
    ranks = rec["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["status"] == "ok" for r in ranks)
    # --bind-cores: disjoint slices, one host thread each on a 2-core machine
    assert all(r["bound"] for r in ranks) and not set(ranks[0]["cores"]) & set(ranks[1]["cores"])
    assert rec["placement"]["cores"] == ranks[0]["cores"]
    tp = rec["throughput"]
    slowest = max(r["median_step_s"] for r in ranks)
    assert tp["tokens_per_s"] == pytest.approx(2 * 32 / slowest)  # per device: the slowest rank sets the step
    assert tp["aggregate_tokens_per_s"] == pytest.approx(2 * tp["tokens_per_s"])
    per_device = tp["model_flops_per_token"] * tp["aggregate_tokens_per_s"] / (2 * tp["peak_flops"])
    assert tp["mfu"] == pytest.approx(per_device)
    stats = rec["system_stats"]
    if system == "torch":
        assert stats["ddp"] is True and stats["world_size"] == 2 and stats["backend"] == "gloo"
        assert all(r["host_step_s"] is None for r in ranks)
    else:
        assert stats["world_size"] == 2 and rec["plan"]["chips"] == 2
        assert stats["config"]["host_threads"] == 1  # the one-core slice
        assert all(r["host_step_s"] > 0 and r["host_worker_busy_s"] > 0 for r in ranks)
    # each rank prints its own summary line
    assert proc.stdout.count("world=2") == 2


def test_a_rank_failure_leaves_an_error_record(tmp_path: Path, monkeypatch, capsys) -> None:
    """Ranks that die without a record: the launcher writes a schema-valid error record with their output."""
    out = tmp_path / "rec.json"
    out.write_text("{}")  # a stale file must not pass for this run's record
    monkeypatch.setattr(bench_run, "launch_command", lambda args, n: [
        sys.executable, "-c", "import sys; print('rank 1: boom'); sys.exit(3)"])
    monkeypatch.setattr(bench_run, "available_cores", lambda: 64)
    args = build_parser().parse_args(["bench", "run", "--system", "torch", *ARGS, "--nproc", "2", "--out", str(out)])
    assert args.func(args) == 1
    rec = record.read_result(out, "run")
    assert rec["status"] == "error" and rec["world_size"] == 2
    assert "exited with 3" in rec["error"] and "rank 1: boom" in rec["error"]


@pytest.mark.parametrize(("nproc", "message"), [("0", "--nproc must be >= 1"), ("100000", "need a core each")])
def test_bad_nproc_is_one_line_and_launches_nothing(nproc: str, message: str, tmp_path: Path) -> None:
    proc = _bench("--system", "torch", *ARGS, "--nproc", nproc, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_system_that_cannot_run_multi_rank_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    from superoffload.harness import systems

    monkeypatch.setattr(systems, "MULTI_RANK", frozenset(systems.SYSTEMS) - {"torch"})
    monkeypatch.setattr(bench_run, "available_cores", lambda: 64)
    monkeypatch.setattr(bench_run, "launch_ranks", lambda *a: pytest.fail("launched"))
    args = build_parser().parse_args(["bench", "run", "--system", "torch", *ARGS, "--nproc", "2",
                                      "--out", str(tmp_path / "r.json")])
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run on several ranks" in err[0]


def test_the_ranks_get_the_same_options() -> None:
    argv = ["bench", "run", "--system", "superoffload", "--model", "gpt-tiny", "--seq", "64", "--batch", "3",
            "--grad-accum", "2", "--steps", "4", "--warmup", "0", "--dtype", "bf16", "--lr", "0.002",
            "--grad-clip", "0.5", "--checkpointing", "--threads", "1", "--device", "host", "--bind-cores",
            "-o", "bucket_size=4096", "-o", "cast_policy=host", "--nproc", "2", "--out", "x.json"]
    args = build_parser().parse_args(argv)
    child = build_parser().parse_args(bench_run.child_argv(args))
    for key, value in vars(args).items():
        if key not in ("nproc", "func", "no_progress"):
            assert getattr(child, key) == value, key
    assert child.nproc is None and child.no_progress
    cmd = bench_run.launch_command(args, 2)
    assert cmd[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]


def test_nproc_1_runs_in_this_process(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    proc = _bench("--system", "torch", *ARGS, "--nproc", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["world_size"] == 1 and len(rec["ranks"]) == 1


def test_defaults_are_one_process_unbound() -> None:
    args = build_parser().parse_args(["bench", "run", "--system", "torch", "--model", "gpt-tiny", "--out", "x"])
    assert args.nproc is None and args.bind_cores is False
