"""The catalog (superoffload/catalog.py) is the one table of systems and GPUs: every other table derives
from it, the workflow schema's copy is kept equal to it, and a GPU is matched by its most specific record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from superoffload import catalog

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ systems
def test_the_workflow_schema_lists_the_catalog_systems() -> None:
    """The schema cannot import Python: its enum is a copy, and this keeps the copy equal."""
    schema = yaml.safe_load((ROOT / "workflows" / "schemas" / "config.schema.yaml").read_text())
    assert sorted(schema["definitions"]["system"]["enum"]) == sorted(catalog.SYSTEM_NAMES)


def test_every_table_of_systems_derives_from_the_catalog() -> None:
    from reports import data as report_data
    from reports.figures import common as figures
    from superoffload.calibrate import accuracy
    from superoffload.calibrate import systems as calibrate_systems
    from superoffload.harness import systems as registry
    from superoffload.planner import systems as planner

    assert list(registry.SYSTEMS) == list(catalog.SYSTEM_NAMES)
    assert set(registry.SP_SYSTEMS) == {"superoffload", "ulysses"}
    assert set(registry.MULTI_RANK) == set(catalog.SYSTEM_NAMES)
    assert set(planner.SYSTEMS) == {"superoffload", "zero_offload", "zero_infinity", "fsdp_offload",
                                    "ds_superoffload", "torch"}
    assert planner.PAPER_ONLY_SYSTEMS == ("ulysses",)
    assert accuracy.MODELLED == planner.SYSTEMS
    assert set(calibrate_systems.SYSTEMS) == set(planner.SYSTEMS) - {catalog.REFERENCE}
    assert list(report_data.SYSTEM_NAMES) == list(catalog.SYSTEM_NAMES)
    assert set(figures.COLORS) == set(catalog.SYSTEM_NAMES)
    assert sorted(catalog.SYSTEM_NAMES, key=figures.sys_key) == list(catalog.SYSTEM_NAMES)


def test_system_records_are_whole() -> None:
    names = [s.name for s in catalog.SYSTEMS]
    assert len(set(names)) == len(names)
    colors = [s.color for s in catalog.SYSTEMS]
    assert len(set(colors)) == len(colors), "two systems would share a colour in every figure"
    assert catalog.REFERENCE in names
    for s in catalog.SYSTEMS:
        module, sep, cls = s.implementation.partition(":")
        assert sep and cls, s
        # found without importing it (a DeepSpeed baseline would pull DeepSpeed in)
        assert importlib.util.find_spec(module) is not None, s
        assert f"class {cls}" in Path(importlib.util.find_spec(module).origin).read_text(), s
    with pytest.raises(ValueError, match="choose one of: superoffload"):
        catalog.system("colossal")
    assert catalog.system("ulysses").modelled == "paper"
