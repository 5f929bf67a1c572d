"""Long sequences in the workflow (`snakemake seqlen`, part of `all`): the smoke sweep's W=2 SP=2 point per
system that runs the sequence package, the gh200 sweep's Fig 12 points (gpt-13b, 8K..1M tokens, 4 and 8 chips,
SP = chips) measured only where the chips exist and predicted otherwise, the config schema's `sp`, and the
report's table and figure (measured, predicted, OOM, the paper's 55% reference)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from wf_helpers import ROOT, _record, snakemake

from reports import data as D
from reports import figures as F
from reports import render as R

SP_SYSTEMS = ("superoffload", "ulysses")
FIG12_SEQS = [8192 * 2**i for i in range(8)]


def _jobs(out: str, rule: str) -> int:
    m = re.search(rf"^{rule}\s+(\d+)$", out, re.M)
    return int(m.group(1)) if m else 0


def _sp_cmds(out: str, chips: int) -> list[str]:
    return [ln for ln in out.splitlines() if "guard.py" in ln and f"_sp{chips}.json" in ln]


def test_smoke_sweep_has_one_sp_point_per_sp_system(results_dir):
    out = snakemake("-n", "-p", "seqlen", "--config", f"results_dir={results_dir}", "chips_available=2").stdout
    assert _jobs(out, "bench_run_sp") == len(SP_SYSTEMS) and _jobs(out, "seqlen_figure") == 1
    cmds = _sp_cmds(out, 2)
    assert len(cmds) == len(SP_SYSTEMS)
    for system in SP_SYSTEMS:
        (cmd,) = [c for c in cmds if f"--system {system} " in c]
        assert f"runs_w2/{system}/gpt-tiny_s256_b1_sp2.json" in cmd
        assert all(f in cmd for f in ("--nproc 2", "--sp 2", "--offload-checkpoints", "--bind-cores", "--seq 256"))
        assert ("--loss-tile 64" in cmd) == (system == "superoffload")
        assert "--world-size 2 --sp 2 --" in cmd  # the guard's error record carries sp too
        assert "--timeout 3600 " in cmd  # no matrix run_timeout_s: the config's
    every = snakemake("-n", "all", "--config", f"results_dir={results_dir}", "chips_available=2").stdout
    assert _jobs(every, "bench_run_sp") == len(SP_SYSTEMS) and _jobs(every, "seqlen_figure") == 1


def test_one_core_machine_predicts_the_sp_points(results_dir):
    out = snakemake("-n", "seqlen", "--config", f"results_dir={results_dir}", "chips_available=1").stdout
    assert _jobs(out, "bench_run_sp") == 0 and _jobs(out, "seqlen_figure") == 1


@pytest.mark.parametrize(("chips_available", "measured"), [(1, ()), (4, (4,)), (8, (4, 8))])
def test_gh200_fig12_points_run_only_where_the_chips_exist(results_dir, chips_available, measured):
    out = snakemake("-n", "-p", "seqlen", "--workflow-profile", "profiles/gh200", "--config",
                    f"results_dir={results_dir}", f"chips_available={chips_available}").stdout
    assert _jobs(out, "bench_run_sp") == len(measured) * len(SP_SYSTEMS) * len(FIG12_SEQS)
    for chips in (4, 8):
        cmds = _sp_cmds(out, chips)
        if chips not in measured:
            assert not cmds
            continue
        assert len(cmds) == len(SP_SYSTEMS) * len(FIG12_SEQS)
        assert all(f"--nproc {chips}" in c and f"--sp {chips}" in c and "--model gpt-13b" in c and "--batch 1" in c
                   and "--offload-checkpoints" in c and "--steps 3 --warmup 1" in c for c in cmds)
        assert all("--timeout 14400 " in c for c in cmds)  # the matrix's own limit: a 1M step takes ~15 min
        assert all("numactl" not in c for c in cmds)
        assert [c for c in cmds if "--loss-tile 32768" in c] == [c for c in cmds if "--system superoffload" in c]
        assert f"runs_w{chips}/ulysses/gpt-13b_s1048576_b1_sp{chips}.json" in out


def test_schema_checks_sp():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(ROOT / "workflows/schemas/config.schema.yaml")
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    good = copy.deepcopy(cfg)
    validate(good, schema)
    smoke = {m["name"]: m for m in good["sweeps"]["cpu_smoke"]["matrices"]}
    assert smoke["throughput"]["sp"] == [1] and smoke["seqlen_sp"]["sp"] == "chips"
    assert smoke["seqlen_sp"]["systems"] == list(SP_SYSTEMS)
    for key, value in (("sp", "two"), ("sp", [0]), ("loss_tile", {"nope": 64}), ("loss_tile", {"superoffload": 0}),
                       ("offload_checkpoints", "yes")):
        bad = copy.deepcopy(cfg)
        bad["sweeps"]["cpu_smoke"]["matrices"][-1][key] = value
        with pytest.raises(WorkflowError):
            validate(bad, schema)


def _sp_record(system: str, seq: int, chips: int, status: str = "ok", mfu: float = 0.02) -> dict:
    rec = _record(system, model="gpt-tiny", seq=seq, batch=1, status=status, tps=500.0)
    rec["world_size"] = chips
    rec["run"].update(sp=chips, local_seq=seq // chips, global_seq=seq, dp=1, world_size=chips)
    if status == "ok":
        rec["throughput"].update(mfu=mfu, aggregate_tokens_per_s=500.0 * chips)
    return rec


def _fig12_row(system: str, seq: int, chips: int, mfu: float | None, paper: float | None = None) -> dict:
    return {"figure": "fig12", "point": f"gpt-13b seq {seq} {system}", "metric": "mfu", "predicted": mfu,
            "paper": paper, "paper_status": "V" if paper else "missing", "rel_error": None, "chips": chips,
            "note": "OOM" if mfu is None else "sp 8, 2/node"}


@pytest.fixture
def seqlen_results(tmp_path: Path) -> Path:
    res = tmp_path / "cpu_smoke"
    files = {
        "runs_w2/superoffload/gpt-tiny_s256_b1_sp2.json": _sp_record("superoffload", 256, 2, mfu=0.035),
        "runs_w2/ulysses/gpt-tiny_s256_b1_sp2.json": _sp_record("ulysses", 256, 2, status="oom"),
        "runs_w2/ulysses/gpt-tiny_s512_b1_sp2.json": "{ broken",
        "runs_w2/torch/gpt-tiny_s128_b2.json": {**_record("torch"), "world_size": 2},  # data parallel: not SP
        "sweep.json": {"sweep": "cpu_smoke", "reason": "synthetic", "hardware": {"cuda": False},
                       "predicted_runs": [
                           {"system": s, "model": "gpt-13b", "seq": q, "batch": 1, "chips": 8, "sp": 8}
                           for s in SP_SYSTEMS for q in (8192, 1048576)] + [
                           {"system": "superoffload", "model": "gpt-1b", "seq": 4096, "batch": 1, "chips": 8,
                            "sp": 8},
                           {"system": "torch", "model": "gpt-13b", "seq": 1024, "batch": 4, "chips": 16}]},
        "predictions/paper_comparison.json": {"status": "ok", "rows": [
            _fig12_row("superoffload", 8192, 8, 0.026), _fig12_row("ulysses", 8192, 8, 0.027),
            _fig12_row("superoffload", 1048576, 8, 0.252), _fig12_row("ulysses", 1048576, 8, None),
            _fig12_row("superoffload", 1048576, 8, 0.252, paper=0.55),  # the paper's labelled row
            _fig12_row("superoffload", 8192, 4, 0.056)]},
    }
    for rel, obj in files.items():
        path = res / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return res


def test_seqlen_rows_measured_predicted_oom(seqlen_results: Path):
    rows = D.seqlen_rows(D.load_results(seqlen_results))
    measured = [r for r in rows if r["kind"] == "measured"]
    assert {(r["system"], r["seq"], r["status"]) for r in measured} == {
        ("superoffload", 256, "ok"), ("ulysses", 256, "oom"), ("ulysses", 512, "error")}  # broken: from its name
    assert all(r["sp"] == 2 and r["chips"] == 2 for r in measured)
    ok = next(r for r in measured if r["status"] == "ok")
    assert ok["mfu"] == 0.035 and ok["local_seq"] == 128 and ok["aggregate_tokens_per_s"] == 1000.0
    pred = {(r["system"], r["model"], r["seq"]): r for r in rows if r["kind"] == "predicted"}
    assert len(pred) == 5  # the four Fig 12 points and gpt-1b; the 16-chip torch point has no sp
    assert pred[("superoffload", "gpt-13b", 1048576)]["mfu"] == 0.252
    assert pred[("ulysses", "gpt-13b", 1048576)]["status"] == "oom"
    assert pred[("ulysses", "gpt-13b", 8192)]["status"] == "predicted"
    assert pred[("superoffload", "gpt-1b", 4096)]["status"] == "missing"


def test_seqlen_figure_and_report(seqlen_results: Path, tmp_path: Path):
    results = D.load_results(seqlen_results)
    figs = F.render_all(results, tmp_path / "figs")
    svg = figs["seqlen"].read_text()
    assert "could not draw" not in svg and "No sequence-parallel records" not in svg
    for text in ("superoffload, 2 chips (measured)", "superoffload, 8 chips (predicted)", "OOM 8", "OOM 2", "ERROR 2",
                 "paper: 55% MFU", "1M tokens, 8 GH200 [V]"):
        assert text in svg, text
    again = F.render_one(results, "seqlen", tmp_path / "again.svg")
    assert again.read_bytes() == figs["seqlen"].read_bytes()  # deterministic
    html = R.render_html(seqlen_results, tmp_path / "figs", tmp_path / "report.html").read_text()
    assert "Long sequences: Ulysses sequence parallelism (1 ok, 1 oom, 1 error)" in html
    assert "no prediction: not a Fig 12 point" in html and "OOM (predicted)" in html
    assert '<span class="badge nab">does not fit</span>' in html  # infeasible by design: neutral, not an oom run
    ctx = R.build_context(results, {})
    (row,) = [r for r in ctx["paper_comparison"]["rows"] if r["point"] == "gpt-13b seq 1048576 superoffload"
              and r["paper"] == 0.55]
    assert row["measured"] is None  # no 8-chip record of that point here
    assert all(r["sp"] == 1 for r in ctx["multi"]["rows"] if r["system"] == "torch")


def test_empty_seqlen_figure(tmp_path: Path):
    results = D.load_results(tmp_path / "nothing")
    path = F.render_one(results, "seqlen", tmp_path / "s.svg")
    assert "No sequence-parallel records" in path.read_text()
