"""One end-to-end `snakemake all` on a shrunken smoke sweep (2 timed steps, torch + superoffload, one rank
and two): the session's `smoke_results` run (conftest.py), which the browser test also opens."""

from __future__ import annotations

import json

from wf_helpers import SMOKE_CONFIG, snakemake

from reports import data as D


def test_snakemake_all_smoke(smoke_results):
    results_dir = smoke_results
    res = results_dir / "cpu_smoke"
    html = (res / "report.html").read_text()
    assert "cpu_smoke" in html and "no CUDA GPU" in html
    runs = D.load_records(res / "runs")
    assert {r["system"] for r in runs} == {"torch", "superoffload"}
    torch_rows = [r for r in runs if r["system"] == "torch"]
    assert torch_rows and all(r["status"] == "ok" for r in torch_rows)
    for r in runs:  # every record is schema-valid, whatever its status
        from superoffload.harness.record import validate

        validate({k: v for k, v in r.items() if k != "_path"})
    assert all((res / "benchmarks/runs" / r["system"]).is_dir() for r in runs)
    # the smoke sweep's two-rank point of each system (on a machine with two cores)
    import os

    if len(os.sched_getaffinity(0)) >= 2:
        multi = D.load_records(res / "runs_w2")
        assert {r["system"] for r in multi} == {"torch", "superoffload"}
        for r in multi:
            assert r["status"] == "ok", r["error"]
            assert r["world_size"] == 2 and [k["rank"] for k in r["ranks"]] == [0, 1]
        assert "Several ranks (3 ok" in html  # torch and superoffload data-parallel, superoffload SP=2
        # the smoke sweep's sequence-parallel point (superoffload; ulysses is filtered out here)
        (sp,) = [r for r in multi if D.sp_of(r) == 2]
        assert sp["system"] == "superoffload" and sp["run"]["local_seq"] == sp["run"]["seq"] // 2
        assert sp["system_stats"]["sequence"]["loss_tile"] == 64 and sp["run"]["offload_checkpoints"] is True
        assert "Long sequences: Ulysses sequence parallelism (1 ok" in html
        assert (res / "seqlen/seqlen.svg").stat().st_size > 0
    prov = json.loads((res / "provenance/provenance.json").read_text())
    assert "git_commit" in prov and (res / "provenance/pip_freeze.txt").stat().st_size > 0
    assert len(list((res / "figures").glob("*.svg"))) >= 8
    # a second invocation has nothing to do
    again = snakemake("all", "--cores", "2", "--config", f"results_dir={results_dir}", *SMOKE_CONFIG)
    assert "Nothing to be done" in again.stdout + again.stderr
