"""The slow twin of test_e2e.py: `snakemake all` over the configured cpu_smoke sweep, shrunk only to two systems, one
model and 2 timed steps, for what the smoke fixture's one point per rule family leaves out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from wf_helpers import SHRINK, snakemake

from reports import data as D


# quiet, the configured sweep takes about 5 minutes on 2 cores: a limit of 5x that, the hang is the watchdog's
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_snakemake_all_configured_cpu_smoke(tmp_path: Path):
    """What the smoke fixture leaves out: torch's data-parallel point beside superoffload's, the seqlen matrix,
    the full calibration (per-system step machinery), the four-technique ablation with its alternative and
    the Adam microbenchmark at two thread counts, all in one `snakemake all` that has nothing left to do after."""
    res = tmp_path / "results"
    snakemake("all", "--cores", "2", "--config", *SHRINK, f"results_dir={res}")
    sweep = res / "cpu_smoke"
    runs = D.load_records(sweep / "runs")
    assert {(r["system"], r["run"]["seq"]) for r in runs} == {
        (s, q) for s in ("torch", "superoffload") for q in (64, 128, 256, 512)}
    assert all(r["status"] == "ok" for r in runs), [r["error"] for r in runs if r["status"] != "ok"]
    html = (sweep / "report.html").read_text()
    if len(os.sched_getaffinity(0)) >= 2:
        multi = D.load_records(sweep / "runs_w2")
        assert sorted((r["system"], D.sp_of(r)) for r in multi) == [
            ("superoffload", 1), ("superoffload", 2), ("torch", 1)]
        assert all(r["status"] == "ok" for r in multi), [r["error"] for r in multi if r["status"] != "ok"]
        assert "Several ranks (3 ok" in html  # torch and superoffload data-parallel, superoffload SP=2
    calibration = json.loads((sweep / "calibration/hardware.json").read_text())
    assert "superoffload" in (calibration["system_step_s"] or {}), calibration["notes"]  # the offloading systems
    variants = json.loads((sweep / "ablation/variants.json").read_text())["variants"]
    assert len(variants) == 10  # baseline + 4 cumulative, 4 leave-one-out, the cpuadam alternative
    ablation = {Path(r["_path"]).stem: r for r in D.load_records(sweep / "ablation") if r["_path"].endswith(
        tuple(f"/{v}.json" for v in variants))}
    assert set(ablation) == set(variants) and all(r["status"] == "ok" for r in ablation.values())
    adam = json.loads((sweep / "microbench/adam.json").read_text())
    assert [m["threads"] for m in adam["measurements"]] == [1, 2]
    again = snakemake("all", "--cores", "2", "--config", *SHRINK, f"results_dir={res}")
    assert "Nothing to be done" in again.stdout + again.stderr
