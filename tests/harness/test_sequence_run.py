"""`bench run --nproc N --sp K`: Ulysses sequence parallelism in the harness (superoffload here; the
`ulysses` baseline in tests/baselines/test_ulysses.py).

A W=2 SP=2 run trains the same global batch as a W=1 run (the data is seeded by data-parallel rank, and
both ranks of the SP group are data-parallel rank 0), so their per-step losses must agree: the only
difference is the order of fp32 sums (attention over gathered heads, gradients summed over the ranks).
Asserted within 1e-5 relative; measured 7.6e-8. The errors of every bad combination are one line, exit 2,
before anything is launched."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from superoffload import ds_build
from superoffload.cli import bench_run
from superoffload.cli.main import build_parser
from superoffload.harness import record
from superoffload.harness.flops import model_flops_per_token
from superoffload.harness.system import RunConfig
from superoffload.shapes import get_shape
from tests import _watchdog as watchdog

SEQ, BATCH = 64, 2
ARGS = ["--model", "gpt-tiny", "--seq", str(SEQ), "--batch", str(BATCH), "--steps", "3", "--warmup", "1",
        "--threads", "1", "--grad-clip", "1.0", "--no-progress"]
REL_TOL = 1e-5


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo", SUPEROFFLOAD_DIST_TIMEOUT_S="60")
    env.setdefault(ds_build.EXTENSIONS_ENV, str(ds_build.default_extensions_dir()))
    return env


def bench(*args: str) -> subprocess.CompletedProcess:
    """`bench run` with these arguments; killed only once it stops making progress (tests/_watchdog.py)."""
    return watchdog.run([sys.executable, "-m", "superoffload", "bench", "run", *args], env=_env())


def sp_pair(system: str, tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    """(W=1 record, W=2 SP=2 record) of `system` on the same global batch."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two gloo ranks need two cores")
    one, two = tmp_path / "w1.json", tmp_path / "w2sp2.json"
    p1 = bench("--system", system, *ARGS, *extra, "--out", str(one))
    assert p1.returncode == 0, p1.stdout[-3000:] + p1.stderr[-3000:]
    p2 = bench("--system", system, *ARGS, *extra, "--nproc", "2", "--sp", "2", "--out", str(two))
    assert p2.returncode == 0, p2.stdout[-3000:] + p2.stderr[-3000:]
    return record.read_result(one, "run"), record.read_result(two, "run")


def check_sp_record(rec: dict) -> None:
    """What a W=2 SP=2 record of gpt-tiny says about the run and its throughput."""
    assert rec["status"] == "ok", rec["error"]
    assert rec["world_size"] == 2 and [r["rank"] for r in rec["ranks"]] == [0, 1]
    run = rec["run"]
    assert (run["sp"], run["global_seq"], run["local_seq"], run["dp"]) == (2, SEQ, SEQ // 2, 1)
    assert run["global_batch"] == BATCH and run["tokens_per_step"] == BATCH * SEQ  # one SP group, one batch
    tp = rec["throughput"]
    slowest = max(r["median_step_s"] for r in rec["ranks"])
    assert tp["tokens_per_s"] == pytest.approx(BATCH * SEQ / 2 / slowest)  # per device: its half of each sequence
    assert tp["aggregate_tokens_per_s"] == pytest.approx(BATCH * SEQ / slowest)  # the global tokens
    # model FLOPs per token over the global sequence (6N + causal attention over all SEQ tokens)
    assert tp["model_flops_per_token"] == pytest.approx(model_flops_per_token(get_shape("gpt-tiny"), SEQ))
    assert tp["mfu"] == pytest.approx(tp["model_flops_per_token"] * tp["tokens_per_s"] / tp["peak_flops"])
    assert rec["system_stats"]["sequence"]["sp"] == 2


def check_same_losses(one: dict, two: dict) -> float:
    a, b = one["losses"], two["losses"]
    assert len(a) == len(b) == 4 and a[0] != a[-1]
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    assert worst <= REL_TOL, f"W=2 SP=2 vs W=1 losses: {a} vs {b} (worst relative {worst:.2e})"
    return worst


def test_superoffload_sp2_matches_one_rank(tmp_path: Path) -> None:
    one, two = sp_pair("superoffload", tmp_path)
    check_sp_record(two)
    check_same_losses(one, two)
    seq = two["system_stats"]["sequence"]
    assert seq["attention"] == "superoffload.sequence.UlyssesAttention" and seq["sp_group_ranks"] == [0, 1]
    assert seq["loss_divisor_tokens"] == BATCH * SEQ  # every rank's loss is its share of the global mean
    assert two["system_stats"]["config"]["gradient_reduction"] == "sum"
    assert two["plan"]["sp"] == 2 and two["plan"]["chips"] == 2
    assert "sp" not in one["system_stats"].get("sequence", {})  # W=1: the engine's plain path
    assert one["run"]["sp"] == 1 and one["system_stats"]["config"]["gradient_reduction"] == "mean"


@pytest.mark.slow
def test_superoffload_sp2_with_tiled_loss_and_offloaded_checkpoints(tmp_path: Path) -> None:
    one, two = sp_pair("superoffload", tmp_path, "--loss-tile", "24", "--offload-checkpoints")
    check_sp_record(two)
    check_same_losses(one, two)
    seq = two["system_stats"]["sequence"]
    assert seq["loss_tile"] == 24 and seq["offloaded_checkpoints"]["offloaded"] > 0
    assert two["run"]["activation_checkpointing"] is True and two["throughput"]["hfu"] > two["throughput"]["mfu"]


# --- errors: one line, exit 2, nothing launched ------------------------------------------------------------
@pytest.mark.parametrize(("argv", "message"), [
    (["--system", "superoffload", "--sp", "2"], "add --nproc N with N a multiple of 2"),
    (["--system", "superoffload", "--sp", "3", "--nproc", "4"], "--sp 3 must divide the number of ranks (4 ranks)"),
    (["--system", "ulysses", "--sp", "8", "--nproc", "8"], "heads divisible by the SP degree: heads=4"),
    (["--system", "superoffload", "--sp", "2", "--nproc", "4", "--seq", "63"], "--seq 63 must be divisible by --sp 2"),
    (["--system", "torch", "--sp", "2", "--nproc", "2"],
     "system 'torch' does not run the sequence package; systems that do: superoffload, ulysses"),
    (["--system", "zero_infinity", "--loss-tile", "16"], "--loss-tile: system 'zero_infinity'"),
    (["--system", "fsdp_offload", "--offload-checkpoints"], "--offload-checkpoints: system 'fsdp_offload'"),
    (["--system", "superoffload", "--sp", "2", "--nproc", "2", "-o", "gradient_reduction=mean"],
     "gradients must be summed"),
])
def test_bad_sequence_settings_are_one_line_before_launching(argv: list[str], message: str, tmp_path: Path,
                                                             monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench_run, "available_cores", lambda: 64)
    monkeypatch.setattr(bench_run, "launch_ranks", lambda *a: pytest.fail("launched"))
    for key in ("LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "r.json"
    args = build_parser().parse_args(["bench", "run", "--model", "gpt-tiny", *argv, "--out", str(out)])
    assert args.func(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_ranks_get_the_sequence_options() -> None:
    argv = ["bench", "run", "--system", "ulysses", "--model", "gpt-tiny", "--seq", "64", "--sp", "2",
            "--loss-tile", "16", "--offload-checkpoints", "--nproc", "4", "--out", "x.json"]
    args = build_parser().parse_args(argv)
    child = build_parser().parse_args(bench_run.child_argv(args))
    assert (child.sp, child.loss_tile, child.offload_checkpoints, child.nproc) == (2, 16, True, None)


def test_run_config_counts_tokens_per_data_parallel_group() -> None:
    run = RunConfig(seq=1024, batch=3, grad_accum=2, world=8, sp=4)
    assert (run.dp, run.local_seq, run.global_batch) == (2, 256, 3 * 2 * 2)
    assert run.tokens_per_step == 12 * 1024 and run.tokens_per_rank == 3 * 2 * 256
    assert run.tokens_per_rank * run.world == run.tokens_per_step
    assert RunConfig(offload_checkpoints=True).checkpointing_mode == "offload"


def _record(sp: int | None, tps: float) -> dict:
    rec = {"schema_version": 1, "status": "ok", "system": "superoffload", "model": {"name": "gpt-tiny"},
           "run": {"seq": 64, "global_batch": 2, "dtype": "fp32"}, "world_size": 2,
           "throughput": {"tokens_per_s": tps}}
    if sp is not None:
        rec["run"]["sp"] = sp
    return rec


def test_bench_compare_keys_on_sp() -> None:
    from superoffload.cli.bench_compare import compare_rows, config_key, format_table

    old, dp, sp = _record(None, 100.0), _record(1, 100.0), _record(2, 50.0)
    assert config_key(old) == config_key(dp) != config_key(sp)  # a record without run.sp ran with SP 1
    base = {**_record(2, 25.0), "system": "torch"}
    rows = compare_rows([old, sp, base], "torch")
    assert [r["sp"] for r in rows] == [1, 2, 2]
    assert rows[0]["ratio"] is None and rows[1]["ratio"] == pytest.approx(2.0)  # only the SP=2 baseline counts
    assert " sp " in format_table(rows, "torch").splitlines()[0]


def test_schema_sp_fields(tmp_path: Path) -> None:
    from superoffload.harness.record import error_record

    rec = error_record(RunConfig(system="ulysses", seq=64, world=4, sp=2), "no record")
    record.validate(rec)
    assert (rec["run"]["sp"], rec["run"]["global_seq"], rec["run"]["local_seq"], rec["run"]["dp"]) == (2, 64, 32, 2)
    old = copy.deepcopy(rec)
    for key in ("sp", "global_seq", "local_seq", "dp", "loss_tile", "offload_checkpoints"):
        del old["run"][key]
    record.validate(old)  # records written before these fields stay valid
    for key, value in (("sp", 0), ("local_seq", "32"), ("loss_tile", 0), ("offload_checkpoints", "yes")):
        bad = copy.deepcopy(rec)
        bad["run"][key] = value
        with pytest.raises(jsonschema.ValidationError):
            record.validate(bad)


@pytest.mark.slow
@pytest.mark.parametrize("system", ["superoffload", "ulysses"])
def test_dp2_sp2_matches_dp2(system: str, tmp_path: Path) -> None:
    """Four ranks, two data-parallel groups of SP 2 (an enclosing torchrun: four gloo ranks on this 2-core
    machine, past --nproc's core check) against two data-parallel ranks of SP 1 on the same global batch (the
    data is seeded by data-parallel rank in both). A loss tile larger than the tokens makes both runs use the
    token-normalized loss and report the global mean, with one tile (the plain loss's arithmetic)."""
    if system == "ulysses":
        pytest.importorskip("deepspeed")
    args = ["--system", system, *ARGS, "--batch", "1", "--loss-tile", "4096"]
    dp2 = tmp_path / "dp2.json"
    p = bench(*args, "--nproc", "2", "--out", str(dp2))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    dp2sp2 = tmp_path / "dp2sp2.json"
    p = watchdog.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                        "-m", "superoffload", "bench", "run", *args, "--sp", "2", "--out", str(dp2sp2)],
                       env={**_env(), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    one, two = record.read_result(dp2, "run"), record.read_result(dp2sp2, "run")
    assert (two["run"]["dp"], two["run"]["global_batch"], two["world_size"]) == (2, 2, 4)
    assert one["run"]["global_batch"] == 2
    check_same_losses(one, two)
