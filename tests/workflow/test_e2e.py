"""One end-to-end `snakemake all` on a shrunken smoke sweep (smoke.yaml: one tiny point per rule family, 2 timed
steps; torch and superoffload on one rank, superoffload on two, data- and sequence-parallel): the session's
`smoke_results` run (conftest.py), which the browser test also opens. Its slow twin, test_e2e_configured.py,
runs the configured cpu_smoke sweep (every matrix, the full calibration, the whole ablation).
"""

from __future__ import annotations

import json
import os
from html import unescape

from wf_helpers import SMOKE_ARGS, snakemake

from reports import data as D


def test_snakemake_all_smoke(smoke_results):
    results_dir = smoke_results
    res = results_dir / "cpu_smoke"
    html = (res / "report.html").read_text()
    assert "cpu_smoke" in html and "no CUDA GPU" in html
    runs = D.load_records(res / "runs")
    assert {r["system"] for r in runs} == {"torch", "superoffload"}
    assert all(r["status"] == "ok" for r in runs), [r["error"] for r in runs if r["status"] != "ok"]
    # the headline's measured ratio carries the loaded-machine mark, and its note, exactly when a run behind it
    # was flagged loaded (the smoke's timed jobs share the cores with its other jobs, so it often is)
    flagged = any("loaded" in ((r.get("noise") or {}).get("flags") or []) for r in runs)
    head = unescape(html[html.index('id="headline"'):html.index('id="runs"')])
    assert ("† Measured on a loaded machine" in head) is flagged and ("† loaded" in head) is flagged
    for r in runs:  # every record is schema-valid, whatever its status
        from superoffload.harness.record import validate

        validate({k: v for k, v in r.items() if k != "_path"})
    assert all((res / "benchmarks/runs" / r["system"]).is_dir() for r in runs)
    # the smoke sweep's two-rank points (on a machine with two cores)
    if len(os.sched_getaffinity(0)) >= 2:
        multi = D.load_records(res / "runs_w2")
        assert {r["system"] for r in multi} == {"superoffload"} and len(multi) == 2
        for r in multi:
            assert r["status"] == "ok", r["error"]
            assert r["world_size"] == 2 and [k["rank"] for k in r["ranks"]] == [0, 1]
        assert "Several ranks (2 ok" in html  # superoffload data-parallel and SP=2
        # the smoke sweep's sequence-parallel point (superoffload; ulysses is filtered out here)
        (sp,) = [r for r in multi if D.sp_of(r) == 2]
        assert sp["system"] == "superoffload" and sp["run"]["local_seq"] == sp["run"]["seq"] // 2
        assert sp["system_stats"]["sequence"]["loss_tile"] == 64 and sp["run"]["offload_checkpoints"] is True
        assert "Long sequences: Ulysses sequence parallelism (1 ok" in html
        assert (res / "seqlen/seqlen.svg").stat().st_size > 0
    # the smoke's ablation has one technique: its leave-one-out is the baseline's run, copied, not run again
    variants = json.loads((res / "ablation/variants.json").read_text())["variants"]
    assert variants["loo-speculation"]["same_as"] == "cum0-baseline"
    ablation = res / "ablation"
    assert (ablation / "loo-speculation.json").read_bytes() == (ablation / "cum0-baseline.json").read_bytes()
    prov = json.loads((res / "provenance/provenance.json").read_text())
    assert "git_commit" in prov and (res / "provenance/pip_freeze.txt").stat().st_size > 0
    assert len(list((res / "figures").glob("*.svg"))) >= 8
    # a second invocation has nothing to do
    again = snakemake("all", "--cores", "2", *SMOKE_ARGS, f"results_dir={results_dir}")
    assert "Nothing to be done" in again.stdout + again.stderr

