"""A bad config is rejected by the schema with a message naming the problem."""

from __future__ import annotations

import copy

import pytest
import yaml
from wf_helpers import ROOT, snakemake


@pytest.mark.parametrize(
    "override,expect",
    [
        ("steps_override=-1", "minimum"),
        ("only_systems=[torch,bogus]", "bogus"),
        ("run_timeout_s=fast", "run_timeout_s"),
    ],
)
def test_bad_config_rejected_on_the_command_line(override, expect, results_dir):
    proc = snakemake("-n", "all", "--config", f"results_dir={results_dir}", override, check=False)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "Error validating config file" in err, err[-2000:]
    assert expect in err


def test_unknown_sweep_is_named(results_dir):
    proc = snakemake("-n", "all", "--config", f"results_dir={results_dir}", "sweep=nope", check=False)
    assert proc.returncode != 0
    assert "sweep 'nope' is not defined" in proc.stdout + proc.stderr


def test_schema_rejects_unknown_system_and_fills_defaults(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_check", ROOT / "workflows/scripts/config_check.py")
    config_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_check)
    schema = ROOT / "workflows/schemas/config.schema.yaml"
    full = tmp_path / "config_error.txt"
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    good = copy.deepcopy(cfg)
    del good["run_timeout_s"]
    assert config_check.check_config(good, schema, full) is None
    config_check.fill_defaults(good, schema)
    assert good["run_timeout_s"] == 3600
    assert good["sweeps"]["cpu_smoke"]["microbench"]["adam"]["numel"] == "4M"
    bad = copy.deepcopy(cfg)
    bad["sweeps"]["cpu_smoke"]["matrices"][0]["systems"].append("megatron")
    assert "megatron" in config_check.check_config(bad, schema, full)
    typo = copy.deepcopy(cfg)
    typo["sweeps"]["cpu_smoke"]["stpes"] = 3
    assert "stpes" in config_check.check_config(typo, schema, full)
