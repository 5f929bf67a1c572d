"""A bad workflow config stops the workflow with one line per error (key path, schema message, closest valid
name) and the full message in a file, instead of Snakemake's dump of the whole schema."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml
from wf_helpers import ROOT, snakemake

SCHEMA = ROOT / "workflows/schemas/config.schema.yaml"
_spec = importlib.util.spec_from_file_location("config_check", ROOT / "workflows/scripts/config_check.py")
config_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(config_check)


@pytest.fixture
def cfg() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def _check(config: dict, tmp_path: Path) -> tuple[str | None, Path]:
    full = tmp_path / "config_error.txt"
    return config_check.check_config(config, SCHEMA, full), full


def test_unknown_nested_key_is_one_line_with_the_closest_key(cfg, tmp_path):
    cfg["sweeps"]["cpu_smoke"]["stpes"] = 3
    msg, full = _check(cfg, tmp_path)
    assert msg == (
        "Error validating config file: sweeps.cpu_smoke.stpes: Additional properties are not allowed "
        f"('stpes' was unexpected); did you mean 'steps'? (full message: {full})"
    )
    text = full.read_text()
    assert "sweeps.cpu_smoke.stpes" in text and "schema path: #/properties/sweeps/" in text
    assert "allowed keys here: description, device, dtype, steps" in text


def test_several_errors_are_one_line_each_up_to_a_few(cfg, tmp_path):
    matrix = cfg["sweeps"]["cpu_smoke"]["matrices"][0]
    matrix["modells"] = matrix.pop("models")  # unknown key + the required one missing
    cfg["only_systems"] = ["torchh"]
    cfg["stpes_override"] = 2
    cfg["run_timeout_s"] = 0
    msg, full = _check(cfg, tmp_path)
    lines = msg.splitlines()
    assert lines[0] == f"Error validating config file: 5 errors (full message: {full})"
    assert len(lines) == 1 + config_check.MAX_LINES + 1 and lines[-1] == "  ... and 2 more"
    assert "  only_systems[0]: 'torchh' is not one of" in msg and "did you mean 'torch'?" in msg
    assert "did you mean 'steps_override'?" in msg
    text = full.read_text()
    assert "sweeps.cpu_smoke.matrices[0].modells" in text and "did you mean 'models'?" in text
    assert "'models' is a required property" in text and "run_timeout_s: 0 is less than or equal" in text


def test_wrong_type_names_the_key_and_the_type(cfg, tmp_path):
    cfg["run_timeout_s"] = "fast"
    msg, _ = _check(cfg, tmp_path)
    assert msg.startswith("Error validating config file: run_timeout_s: 'fast' is not of type 'number' (")
    cfg["run_timeout_s"] = 60
    cfg["sweeps"]["cpu_smoke"]["matrices"][0]["seq"] = ["128"]
    msg, _ = _check(cfg, tmp_path)
    assert "sweeps.cpu_smoke.matrices[0].seq[0]: '128' is not of type 'integer'" in msg
    assert "did you mean" not in msg


def test_valid_config_passes_and_fill_defaults_fills_them(cfg, tmp_path):
    del cfg["run_timeout_s"]
    del cfg["sweeps"]["cpu_smoke"]["microbench"]
    stale = tmp_path / "config_error.txt"
    stale.write_text("an earlier run's error")
    before = copy.deepcopy(cfg)
    msg, full = _check(cfg, tmp_path)
    assert msg is None and not full.exists()  # an earlier message does not linger
    assert cfg == before  # the check works on a copy; filling is a separate step
    assert config_check.fill_defaults(cfg, SCHEMA) is cfg  # what common.smk runs next
    assert cfg["run_timeout_s"] == 3600
    assert cfg["sweeps"]["cpu_smoke"]["microbench"]["adam"]["numel"] == "4M"
    assert cfg["plan_optimality"]["peers"] == ["torch", "zero_offload"]
    assert cfg["sweeps"]["gpu"]["matrices"][0]["chips"] == [1]  # through additionalProperties and items
    cfg["multinode"]["port"] = 1234
    config_check.fill_defaults(cfg, SCHEMA)
    assert cfg["multinode"]["port"] == 1234  # a value set is never replaced
    assert cfg["plan_optimality"]["peers"] is not config_check.fill_defaults(copy.deepcopy(before), SCHEMA)[
        "plan_optimality"]["peers"]  # each fill gets its own copy of a default


def test_dry_run_with_a_typo_prints_a_short_error(results_dir):
    proc = snakemake("-n", "all", "--config", f"results_dir={results_dir}", "stpes_override=2", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert len(out.splitlines()) < 40, out[-3000:]
    assert "stpes_override: Additional properties are not allowed" in out
    assert "did you mean 'steps_override'?" in out and "(full message: .snakemake/config_error.txt)" in out
