"""`snakemake -n` for every target and every profile."""

from __future__ import annotations

import importlib.util

import pytest
import yaml
from wf_helpers import ROOT, snakemake

TARGETS = ["all", "figures", "seqlen", "ablation", "nightly", "calibrate", "report", "plan_optimality"]


@pytest.mark.parametrize("target", TARGETS)
def test_dry_run_target(target, results_dir):
    proc = snakemake("-n", target, "--config", f"results_dir={results_dir}")
    out = proc.stdout + proc.stderr
    assert "Job stats" in out or "Nothing to be done" in out, out[-2000:]


def test_default_target_is_all(results_dir):
    proc = snakemake("-n", "--config", f"results_dir={results_dir}")
    assert "rule all:" in proc.stdout or "all " in proc.stdout


def test_cpu_machine_picks_the_smoke_sweep(results_dir):
    import torch

    proc = snakemake("-n", "all", "--config", f"results_dir={results_dir}")
    if not torch.cuda.is_available():
        assert f"{results_dir}/cpu_smoke/report.html" in proc.stdout


@pytest.mark.parametrize("profile,sweep", [("gh200", "gh200"), ("h100", "gpu")])
def test_dry_run_gpu_profiles(profile, sweep, results_dir):
    proc = snakemake(
        "-n", "all", "--workflow-profile", f"profiles/{profile}", "--config", f"results_dir={results_dir}"
    )
    assert f"{results_dir}/{sweep}/report.html" in proc.stdout
    assert "bench_run" in proc.stdout


def test_h100_profile_launcher_reaches_the_command(results_dir):
    proc = snakemake(
        "-n", "-p", "all", "--workflow-profile", "profiles/h100", "--config", f"results_dir={results_dir}"
    )
    assert "numactl --cpunodebind=0 --membind=0" in proc.stdout


def test_slurm_profile(results_dir):
    """Dry run with the slurm executor when its plugin is installed; otherwise the profile is parsed by
    Snakemake with the executor overridden to local (checks the YAML keys, resources and config)."""
    prof = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert "CHANGE_ME" in prof["default-resources"]["slurm_partition"]
    assert "CHANGE_ME" in prof["default-resources"]["slurm_account"]
    args = ["-n", "all", "--workflow-profile", "profiles/slurm", "--config", f"results_dir={results_dir}"]
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        args += ["--executor", "local"]
    proc = snakemake(*args)
    assert f"{results_dir}/gh200/report.html" in proc.stdout


def test_default_profile_sets_cores_and_gpu_resource():
    prof = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert prof["cores"] and prof["keep-going"] is True
    assert "gpu=1" in prof["resources"]


def test_an_ablation_variant_that_repeats_another_is_measured_once(results_dir):
    """Leave-one-out of the last technique has the options of the cumulative step before it: `ablation_same`
    copies that run's record instead of a second `ablation_run`; every other variant is measured."""
    order = yaml.safe_load((ROOT / "config/config.yaml").read_text())["ablation"]["order"]
    proc = snakemake("-n", "ablation", "--config", f"results_dir={results_dir}")
    jobs = {}  # output file name -> rule
    for block in proc.stdout.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        for line in block.splitlines():
            if line.strip().startswith("output:"):
                jobs[line.split(":", 1)[1].strip().rsplit("/", 1)[-1]] = rule
    assert jobs[f"loo-{order[-1]}.json"] == "ablation_same", proc.stdout[-3000:]
    assert jobs[f"cum{len(order) - 1}-{order[-2]}.json"] == "ablation_run"
    assert [f for f, r in jobs.items() if r == "ablation_same"] == [f"loo-{order[-1]}.json"]
    assert all(jobs[f"loo-{t}.json"] == "ablation_run" for t in order[:-1])
