"""Helpers of the workflow tests (a uniquely named module: several test folders have a conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import _watchdog as watchdog  # noqa: E402  (the repository root is on sys.path from here)

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# The shrunken smoke sweep of the end-to-end run (conftest.py's smoke_results), whose report the browser test
# opens: smoke.yaml (one tiny point per rule family) over the configured cpu_smoke sweep, then these keys; a
# caller appends more `--config` entries (results_dir=...). Its measured jobs take one core instead of all
# (--set-threads; still one at a time, by the profile's gpu=1), so the minute of the paper_comparison job runs
# beside them rather than before them: the smoke checks the pipeline, not the timings, which get flagged loaded.
MEASURED_RULES = ("calibrate_run", "bench_run", "bench_run_multi", "bench_run_sp", "ablation_run", "bench_adam",
                  "bench_cast")
# the `--config` entries that shrink a sweep to 2 timed steps of torch and superoffload on gpt-tiny
SHRINK = ("steps_override=2", "warmup_override=0", "only_systems=[torch,superoffload]", "only_models=[gpt-tiny]")
SMOKE_ARGS = ("--configfile", str(Path(__file__).with_name("smoke.yaml")),
              "--set-threads", *(f"{rule}=1" for rule in MEASURED_RULES), "--config", *SHRINK)


def snakemake(*args: str, stall_s: float = watchdog.HANG_S, check: bool = True,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run snakemake in the repository root; --nolock so a concurrent run of the workflow does not block.
    No fixed time limit: it is killed, with its jobs, only after ``stall_s`` seconds in which neither it nor a
    job printed anything or used CPU (tests/_watchdog.py), so a hang fails the test and a busy machine does not."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # started cold, as a user starts it: snakemake imports no torch, and its jobs are its own processes
    proc = watchdog.run([*SNAKEMAKE, "--nolock", *args], stall_s=stall_s, cwd=ROOT, env=env, warm_start=False)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def _record(
    system,
    model="gpt-tiny",
    seq=128,
    batch=2,
    status="ok",
    tps=1000.0,
    params=900_000,
    timeline=None,
    rollbacks=None,
):
    ok = status == "ok"
    return {
        "schema_version": 1,
        "status": status,
        "error": None if ok else f"{status.upper()}: synthetic failure",
        "system": system,
        "model": {"name": model, "params": params, "layers": 4, "hidden": 128, "heads": 4, "vocab": 1024},
        "run": {
            "seq": seq,
            "batch": batch,
            "global_batch": batch,
            "dtype": "fp32",
            "steps": 5,
            "warmup": 2,
            "seed": 1,
        },
        "timing": {"step_times_s": [0.1, 0.11], "median_s": 0.1, "p10_s": 0.1, "p90_s": 0.11, "iqr_s": 0.01}
        if ok
        else None,
        "losses": [7.0, 6.9] if ok else [],
        "throughput": {
            "tokens_per_s": tps,
            "model_tflops": tps * 6e-6,
            "mfu": 0.3,
            "hfu": 0.3,
            "peak_flops": 1e11,
            "peak_flops_source": "measured",
        }
        if ok
        else None,
        "memory": {"peak_device_bytes": None, "peak_host_rss_bytes": 300 * 2**20},
        "telemetry": {
            "gpu": {"energy_j_per_step": 12.5, "util_pct_mean": 80.0} if timeline else None,
            "timeline": timeline or [],
        },
        "system_stats": None,
        "rollbacks": rollbacks,
        "plan": None,
        "provenance": {
            "device": "cpu",
            "cpu": "x",
            "torch": "2.13.0",
            "git_commit": None,
            "hostname_hash": "h",
        },
        "created_utc": "2026-01-01T00:00:00+00:00",
    }


def _timing(median_s: float) -> dict:
    return {"median_s": median_s, "mean_s": median_s, "std_s": 0.0, "p10_s": median_s, "p90_s": median_s,
            "iqr_s": 0.0, "min_s": median_s, "max_s": median_s}


def _adam_bench(kernels: dict[str, float] | None = None, numel: int = 4194304, threads: int = 1) -> dict:
    """A `bench adam` file that follows superoffload/harness/adam_bench.schema.json (median s per kernel)."""
    kernels = kernels or {"grace_adam": 0.006, "torch_fused": 0.02, "torch_foreach": 0.025,
                          "roofline_stream7": 0.005}
    best = min(t for k, t in kernels.items() if k in ("torch_fused", "deepspeed_cpu_adam"))
    gbs = {k: 28 * numel / t / 1e9 for k, t in kernels.items()}
    host = {"grace_double_buffer": ("speculative", 0.007), "grace_deferred_commit": ("speculative", 0.009),
            "torch_fused_separate_undo": ("speculative", 0.03), "grace_validate_first": ("validate_first", 0.008),
            "torch_fused_separate": ("validate_first", 0.025)}
    return {
        "kind": "adam_bench", "schema_version": 1, "created_utc": "2026-01-01T00:00:00+00:00",
        "command": "superoffload bench adam", "bytes_per_param": 28,
        "hyper": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        "grace_isa": "avx512", "grace_native": True, "omp_wait_policy": "PASSIVE",
        "provenance": {"device": "cpu", "cpu": "synthetic", "torch": "2.13.0"},
        "loadavg_before": [0.0, 0.0, 0.0], "loadavg_after": [0.0, 0.0, 0.0],
        "measurements": [{
            "numel": numel, "threads": threads, "skipped": {},
            "kernels": {k: {**_timing(t), "gb_per_s": gbs[k], "pct_roofline": 100 * gbs[k] / gbs["roofline_stream7"],
                            "speedup_vs_best_peer": best / t} for k, t in kernels.items()},
            "host_phase": {k: {**_timing(t), "group": g,
                               "speedup_vs_best_separate": min(tt for kk, (gg, tt) in host.items()
                                                               if gg == g and not kk.startswith("grace")) / t}
                           for k, (g, t) in host.items()},
        }],
    }


def complete_results(results_dir: Path, records: dict[str, dict] | None = None) -> Path:
    """Make `snakemake all` on ``results_dir`` have nothing to do, without running any job: every output
    exists (run and ablation records are ok records; ``records`` replaces some, by path relative to the
    sweep's folder), then `--touch` records them as up to date. Returns the sweep's folder."""
    import json

    cfg = ("--config", f"results_dir={results_dir}")
    summary = snakemake("--summary", "all", *cfg).stdout.splitlines()[1:]
    outputs = [Path(line.split("\t")[0]) for line in summary if line.strip()]
    res = next(p for p in outputs if p.name == "report.html").parent
    for p in outputs:
        p.parent.mkdir(parents=True, exist_ok=True)
        rel = p.relative_to(res).as_posix()
        if p.suffix == "":
            p.mkdir(exist_ok=True)
        elif (records or {}).get(rel) is not None:
            p.write_text(json.dumps(records[rel]))
        elif rel.startswith("runs/"):
            p.write_text(json.dumps(_record(p.parent.name)))
        elif rel.startswith("ablation/") and p.name != "variants.json":
            p.write_text(json.dumps(_record("superoffload")))
        else:
            p.write_text("{}")
    snakemake("all", "--touch", "--cores", "1", *cfg)
    return res
