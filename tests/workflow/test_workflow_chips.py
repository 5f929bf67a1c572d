"""Several chips in the workflow: the smoke sweep's W=2 point per system, the gh200 sweep's 4- and 16-chip
points measured only where the chips exist (predicted otherwise), the slurm profile's srun + torchrun
launch (dry runs), the launcher's command, and the report's multi-rank table and figure."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from wf_helpers import ROOT, _record, snakemake

from reports import data as D
from reports import figures as F
from reports import render as R

SYSTEMS = {"torch", "superoffload", "zero_offload", "zero_infinity", "ds_superoffload", "fsdp_offload"}


def _jobs(out: str, rule: str) -> int:
    m = re.search(rf"^{rule}\s+(\d+)$", out, re.M)
    return int(m.group(1)) if m else 0


def test_smoke_sweep_has_a_two_rank_point_per_system(results_dir):
    proc = snakemake("-n", "-p", "all", "--config", f"results_dir={results_dir}", "chips_available=2")
    out = proc.stdout
    assert _jobs(out, "bench_run_multi") == len(SYSTEMS)
    for system in SYSTEMS:
        assert f"{results_dir}/cpu_smoke/runs_w2/{system}/gpt-tiny_s128_b2.json" in out
    cmds = [ln for ln in out.splitlines() if "runs_w2" in ln and "guard.py" in ln]
    assert cmds and all("--nproc 2" in c and "--bind-cores" in c and "--world-size 2" in c for c in cmds)


def test_one_core_machine_predicts_the_two_rank_points(results_dir):
    proc = snakemake("-n", "all", "--config", f"results_dir={results_dir}", "chips_available=1")
    assert _jobs(proc.stdout, "bench_run_multi") == 0 and "runs_w2" not in proc.stdout
    assert _jobs(proc.stdout, "bench_run") > 0


def test_gh200_sweep_measures_only_the_chips_it_has(results_dir):
    base = ["-n", "-p", "all", "--workflow-profile", "profiles/gh200", "--config", f"results_dir={results_dir}"]
    none = snakemake(*base, "chips_available=1")  # one GH200: every 4- and 16-chip point predicted
    assert _jobs(none.stdout, "bench_run_multi") == 0 and _jobs(none.stdout, "bench_run") > 0
    four = snakemake(*base, "chips_available=4")  # a 4-GH200 node: the 4-chip points run, 16 predicted
    n4 = _jobs(four.stdout, "bench_run_multi")
    assert n4 > 0 and "runs_w16" not in four.stdout
    cmds = [ln for ln in four.stdout.splitlines() if "runs_w4" in ln and "guard.py" in ln and "_sp4.json" not in ln]
    assert len(cmds) == n4 and all("--nproc 4" in c and "--bind-cores" in c for c in cmds)
    assert all("numactl" not in c for c in cmds)  # each rank binds itself; the sweep launcher would pin all to node 0
    # the artifact's per-count settings: 4 chips seq 1024 micro-batch 4, 16 chips seq 2048 micro-batch 1
    assert "runs_w4/superoffload/gpt-13b_s1024_b4.json" in four.stdout
    sixteen = snakemake(*base, "chips_available=16")
    assert "runs_w16/superoffload/gpt-13b_s2048_b1.json" in sixteen.stdout


def test_slurm_profile_launches_multi_node_runs_with_srun(results_dir):
    args = ["-n", "-p", "all", "--workflow-profile", "profiles/slurm", "--config", f"results_dir={results_dir}"]
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        args += ["--executor", "local"]
    out = snakemake(*args).stdout
    cmds = [ln for ln in out.splitlines() if "runs_w16" in ln and "guard.py" in ln]
    assert cmds and all("launch_ranks.py --chips 16 --gpus-per-node 4" in c for c in cmds)
    over = yaml.safe_load((ROOT / "profiles/slurm/overrides.yaml").read_text())
    assert over["multinode"]["enabled"] is True and over["chips_available"] >= 16


def test_launch_ranks_command(monkeypatch):
    import importlib.util as iu

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    spec = iu.spec_from_file_location("launch_ranks", ROOT / "workflows/scripts/launch_ranks.py")
    lr = iu.module_from_spec(spec)
    spec.loader.exec_module(lr)
    bench = ["bench", "run", "--system", "superoffload", "--out", "r.json"]
    one = lr.command(4, 4, 29500, bench, env={}, python="py")
    assert one == ["py", "-m", "superoffload", *bench, "--nproc", "4"]
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4"}
    multi = lr.command(16, 4, 29500, bench, env=env, python="py", host="gh-001")
    assert multi[:4] == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1"]
    assert "--nnodes=4" in multi and "--nproc_per_node=4" in multi
    assert "--rdzv-endpoint=gh-001:29500" in multi and "--rdzv-id=77" in multi
    assert multi[-len(bench) - 2:] == ["-m", "superoffload", *bench]
    with pytest.raises(ValueError, match="Slurm allocation"):
        lr.command(16, 4, 29500, bench, env={})
    with pytest.raises(ValueError, match="has 2"):
        lr.command(16, 4, 29500, bench, env={"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2"})
    with pytest.raises(ValueError, match="evenly"):
        lr.command(6, 4, 29500, bench, env=env)
    assert lr.main(["--chips", "16", "--gpus-per-node", "4", "--dry-run", "--", *bench]) == 2  # no allocation


def test_schema_rejects_bad_chip_counts():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(ROOT / "workflows/schemas/config.schema.yaml")
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    good = copy.deepcopy(cfg)
    validate(good, schema)
    assert good["sweeps"]["cpu_smoke"]["matrices"][0]["chips"] == [1]  # default filled in
    assert good["multinode"]["port"] == 29500
    bad = copy.deepcopy(cfg)
    bad["sweeps"]["cpu_smoke"]["matrices"][0]["chips"] = [0]
    with pytest.raises(WorkflowError):
        validate(bad, schema)


def _multi_record(system: str, tps: float, world: int = 2) -> dict:
    rec = _record(system, tps=tps)
    rec["world_size"] = world
    rec["run"]["global_batch"] = rec["run"]["batch"] * world
    rec["throughput"]["aggregate_tokens_per_s"] = tps * world
    rec["ranks"] = [{"rank": r, "status": "ok", "median_step_s": 0.1, "tokens_per_s": tps, "cores": [r],
                     "host_threads": 1, "host_step_s": 0.01 * (r + 1), "host_worker_busy_s": 0.02}
                    for r in range(world)]
    return rec


def test_report_shows_the_multi_rank_runs(tmp_path: Path):
    res = tmp_path / "cpu_smoke"
    for path, rec in ((res / "runs/torch/gpt-tiny_s128_b2.json", _record("torch", tps=1000.0)),
                      (res / "runs_w2/torch/gpt-tiny_s128_b2.json", _multi_record("torch", 800.0)),
                      (res / "runs_w2/superoffload/gpt-tiny_s128_b2.json", _multi_record("superoffload", 600.0))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))
    (res / "runs_w2/fsdp_offload").mkdir(parents=True)
    (res / "runs_w2/fsdp_offload/gpt-tiny_s128_b2.json").write_text("{ broken")
    results = D.load_results(res)
    assert len(results["runs"]) == 1 and len(results["multi_runs"]) == 3
    rows = {r["system"]: r for r in D.multi_rank_rows(results["multi_runs"], results["runs"])}
    assert rows["torch"]["world"] == 2 and rows["torch"]["aggregate_tokens_per_s"] == 1600.0
    assert rows["torch"]["scaling"] == pytest.approx(0.8)  # 1600 / (2 x 1000)
    assert rows["superoffload"]["scaling"] is None  # no one-rank run of it in this sweep
    assert rows["fsdp_offload"]["status"] == "error" and rows["fsdp_offload"]["world"] == 2
    assert rows["superoffload"]["ranks"][1]["host_step_s"] == 0.02
    figs = F.render_all(results, tmp_path / "figures")
    assert b"No multi-rank records" not in figs["scaling"].read_bytes()
    out = R.render_html(res, tmp_path / "figures", tmp_path / "report.html")
    html = out.read_text()
    assert "Several ranks (2 ok, 0 oom, 1 error)" in html
    assert "1,600" in html and "0.800" in html  # aggregate tokens/s and scaling, to 3 significant digits
