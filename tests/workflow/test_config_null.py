"""The config's optional blocks: `null` leaves the part out, an empty block means every schema default, and a
bad value gets the config check's one-line error, never a Python traceback.

The one block the config documents as optional (`config/config.yaml`, the schema, docs/workflow.md) is
`nightly.plan_optimality` ("null leaves it out"); `test_every_nullable_block_has_a_workflow_test` makes a new
nullable block fail here until it has its own test. Dry runs only (a second or two each).
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from wf_helpers import ROOT, snakemake

SCHEMA_FILE = ROOT / "workflows/schemas/config.schema.yaml"
_spec = importlib.util.spec_from_file_location("config_check", ROOT / "workflows/scripts/config_check.py")
config_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(config_check)

# Each block the config documents as optional (type object or null), with the test that shows the workflow
# leaving it out.
TESTED_NULLABLE_BLOCKS = {"nightly.plan_optimality": "test_nightly_plan_optimality_null_leaves_the_case_out"}
PO_COMMAND = "benchmarks/plan_optimality.py"  # in the printed shell line of rule nightly_plan_optimality


def _base_config() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _nullable_blocks(node: Any, schema: Mapping, where: str = "") -> Iterator[str]:
    """Key paths (``a.b``; ``*`` for any key) of every object in the schema whose type also allows null."""
    if not isinstance(node, Mapping):
        return
    if "$ref" in node:  # "#/definitions/<name>": only the schema's own definitions are used
        yield from _nullable_blocks(schema["definitions"][node["$ref"].rsplit("/", 1)[1]], schema, where)
    types = node.get("type")
    if isinstance(types, list) and "object" in types and "null" in types:
        yield where
    for name, sub in (node.get("properties") or {}).items():
        yield from _nullable_blocks(sub, schema, f"{where}.{name}" if where else name)
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _nullable_blocks(node["additionalProperties"], schema, f"{where}.*" if where else "*")
    if isinstance(node.get("items"), Mapping):
        yield from _nullable_blocks(node["items"], schema, f"{where}[]")


def test_every_nullable_block_has_a_workflow_test():
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    found = set(_nullable_blocks(schema, schema))
    assert found == set(TESTED_NULLABLE_BLOCKS), (
        f"blocks that accept null: {sorted(found)}; each needs a dry-run test here showing null leaves it out")
    for test in TESTED_NULLABLE_BLOCKS.values():
        assert test in globals()


def test_nightly_plan_optimality_null_leaves_the_case_out(tmp_path):
    """The issue's own config: a --configfile over config/config.yaml that sets the block to null."""
    override = {"results_dir": str(tmp_path / "results"), "nightly": {"plan_optimality": None}}
    proc = snakemake("-n", "-p", "nightly", "--configfile", str(_write(tmp_path / "null.yaml", override)),
                     check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "AttributeError" not in out
    assert "nightly_run" in proc.stdout  # the other nightly cases still run
    assert "rule nightly_plan_optimality:" not in proc.stdout and PO_COMMAND not in proc.stdout
    assert "plan_optimality/rep0.json" not in proc.stdout  # nor does nightly_check wait for its file


def test_nightly_plan_optimality_empty_block_runs_the_schema_defaults(tmp_path):
    """`{}` is the case with every default. --replace-workflow-config: a --configfile merges into
    config/config.yaml key by key, so an empty block there would only keep that file's values."""
    cfg = _base_config()
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["nightly"]["plan_optimality"] = {}
    proc = snakemake("-n", "-p", "nightly", "--replace-workflow-config",
                     "--configfile", str(_write(tmp_path / "empty.yaml", cfg)), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule nightly_plan_optimality:" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if PO_COMMAND in x)
    schema = yaml.safe_load(SCHEMA_FILE.read_text())
    defaults = {k: v["default"] for k, v in
                schema["properties"]["nightly"]["properties"]["plan_optimality"]["properties"].items()}
    for flag, value in [("--hardware", defaults["hardware"]), ("--workloads", ",".join(defaults["workloads"])),
                        ("--world", ",".join(map(str, defaults["world"]))), ("--repeats", str(defaults["repeats"]))]:
        assert f"{flag} {value} " in line, line


def test_bad_plan_optimality_is_the_one_line_error(tmp_path):
    """`false` (as if it switched the case off) is neither a block nor null."""
    override = {"results_dir": str(tmp_path / "results"), "nightly": {"plan_optimality": False}}
    proc = snakemake("-n", "nightly", "--configfile", str(_write(tmp_path / "bad.yaml", override)), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out and "AttributeError" not in out
    assert ("Error validating config file: nightly.plan_optimality: False is not of type 'object', 'null' "
            "(full message: .snakemake/config_error.txt)") in out, out[-3000:]


@pytest.mark.parametrize("value,expect", [
    (None, None),
    ({}, "defaults"),
    ({"world": [1]}, "defaults"),
])
def test_fill_defaults_keeps_null_and_fills_an_empty_block(value, expect, tmp_path):
    cfg = _base_config()
    cfg["nightly"]["plan_optimality"] = copy.deepcopy(value)
    assert config_check.check_config(cfg, SCHEMA_FILE, tmp_path / "config_error.txt") is None
    config_check.fill_defaults(cfg, SCHEMA_FILE)
    block = cfg["nightly"]["plan_optimality"]
    if expect is None:
        assert block is None
    else:
        assert block["hardware"] == "this-cpu" and block["workloads"] == ["gpt-tiny:128"]
        assert block["world"] == (value.get("world") or [1, 2])  # a value given is kept


def test_a_sweep_without_its_ablation_is_the_one_line_error(tmp_path):
    """The ablation rules read the sweep's `ablation` block; leaving it out is a config error, not a KeyError."""
    cfg = _base_config()
    del cfg["sweeps"]["gpu"]["ablation"]
    msg = config_check.check_config(cfg, SCHEMA_FILE, tmp_path / "config_error.txt")
    assert msg == ("Error validating config file: sweeps.gpu: 'ablation' is a required property "
                   f"(full message: {tmp_path / 'config_error.txt'})")


def test_null_given_through_config_is_named_as_a_string(tmp_path):
    """`--config 'nightly={plan_optimality: null}'` reaches the config as the string 'null' (Snakemake parses
    nested --config values with YAML's BaseLoader): the error says so and what to do instead."""
    cfg = _base_config()
    cfg["nightly"]["plan_optimality"] = "null"
    msg = config_check.check_config(cfg, SCHEMA_FILE, tmp_path / "config_error.txt")
    assert msg.startswith("Error validating config file: nightly.plan_optimality: 'null' is not of type "
                          "'object', 'null'; a nested --config value is always a string: set it in a --configfile")
    cfg = _base_config()
    cfg["nightly"]["repeats"] = "often"  # a real string: no such hint
    msg = config_check.check_config(cfg, SCHEMA_FILE, tmp_path / "config_error.txt")
    assert "nightly.repeats: 'often' is not of type 'integer'" in msg and "--config" not in msg
