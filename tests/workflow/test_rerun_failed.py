"""Failed runs are results (valid records), so Snakemake does not rerun them by itself; the documented
`snakemake all --forcerun $(python workflows/scripts/failed_runs.py RESULTS)` reruns exactly those."""

from __future__ import annotations

import json
import subprocess
import sys

from wf_helpers import ROOT, _record, complete_results, snakemake, watchdog

SCRIPT = ROOT / "workflows" / "scripts" / "failed_runs.py"
GUARD_STANDIN = {"status": "error", "error": "boom", "written_by": "workflows/scripts/guard.py"}


def _failed(res, *args) -> list[str]:
    proc = watchdog.run([sys.executable, str(SCRIPT), str(res), *args], check=True)
    assert "file(s) with status" in proc.stderr
    return proc.stdout.split()


def test_failed_runs_lists_error_and_oom_results(tmp_path):
    res = tmp_path / "cpu_smoke"
    for rel, obj in {
        "runs/torch/gpt-tiny_s128_b2.json": _record("torch"),
        "runs/zero_offload/gpt-tiny_s128_b2.json": _record("zero_offload", status="error"),
        "runs/fsdp_offload/gpt-small_s128_b2.json": _record("fsdp_offload", status="oom"),
        "ablation/cum1-speculation.json": _record("superoffload", status="error"),
        "microbench/cast.json": GUARD_STANDIN,
        "microbench/adam.json": {"status": "unavailable", "written_by": "workflows/scripts/guard.py"},
        "logs/runs/x.json": GUARD_STANDIN,  # logs are not results
        "runs/torch/broken.json": "{ not json",
    }.items():
        p = res / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    assert _failed(res) == [str(res / r) for r in ("ablation/cum1-speculation.json", "microbench/cast.json",
                                                   "runs/fsdp_offload/gpt-small_s128_b2.json",
                                                   "runs/zero_offload/gpt-tiny_s128_b2.json")]
    assert _failed(res, "--status", "oom") == [str(res / "runs/fsdp_offload/gpt-small_s128_b2.json")]
    assert _failed(res, "--status", "unavailable") == [str(res / "microbench/adam.json")]
    bad = subprocess.run([sys.executable, str(SCRIPT), str(res), "--status", "failed"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2 and "--status takes" in bad.stderr


def test_forcerun_of_the_failed_runs_reruns_only_them(results_dir):
    failed = {
        "runs/zero_offload/gpt-tiny_s128_b2.json": _record("zero_offload", status="error"),
        "runs/torch/gpt-small_s128_b2.json": _record("torch", "gpt-small", status="oom"),
    }
    res = complete_results(results_dir, failed)
    cfg = ("--config", f"results_dir={results_dir}")
    proc = snakemake("-n", "all", *cfg)
    assert "Nothing to be done" in proc.stdout + proc.stderr  # failures are results
    files = _failed(res)
    assert sorted(files) == sorted(str(res / r) for r in failed)
    proc = snakemake("-n", "all", *cfg, "--forcerun", *files)
    out = proc.stdout + proc.stderr
    reruns = [line for line in out.splitlines() if line.strip().startswith("output:") and "/runs/" in line]
    assert sorted(line.split("output:")[1].strip() for line in reruns) == sorted(files)
    assert "render_report" in out  # and the report that shows them
    # nothing failed: `--forcerun` with no file forces nothing
    proc = snakemake("-n", "all", *cfg, "--forcerun")
    assert "Nothing to be done" in proc.stdout + proc.stderr
