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


# ------------------------------------------------------------------------------------------ GPUs
@pytest.mark.parametrize("device,record", [
    ("NVIDIA GB200", "GB200"),                 # not B200: the longer name wins
    ("NVIDIA B200", "B200"),
    ("NVIDIA GH200 480GB", "GH200"),           # not H200, not H20
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
])
def test_a_gpu_is_its_most_specific_record(device: str, record: str) -> None:
    assert catalog.gpu_for(device).name == record


def test_gb200_gets_its_own_peak_everywhere() -> None:
    from superoffload.harness.peak import gpu_peak_flops
    from superoffload.planner.presets import preset_for_gpu

    assert gpu_peak_flops("NVIDIA GB200") == 2.5e15 and gpu_peak_flops("NVIDIA B200") == 2.25e15
    assert preset_for_gpu("NVIDIA GB200") == preset_for_gpu("NVIDIA B200") == "h100-pcie"  # no preset of its own


def test_gpu_records_are_listed_most_specific_first_and_none_is_shadowed() -> None:
    names = [g.name.upper() for g in catalog.GPUS]
    for i, a in enumerate(names):
        assert catalog.gpu_for(a).name.upper() == a
        for b in names[:i]:
            assert b not in a, f"{b} is listed before {a}, which contains it: list the more specific first"


def test_gpu_records_name_presets_and_sweeps_that_exist() -> None:
    from superoffload.planner.presets import PRESETS

    sweeps = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["sweeps"]
    for g in catalog.GPUS:
        assert g.preset is None or g.preset in PRESETS, g
        assert g.sweep in sweeps, g
        assert g.peak_flops["bf16"] > 0 and g.peak_source, g
    assert catalog.gpu_for("NVIDIA GH200 480GB").sweep == "gh200"
    assert catalog.gpu_for("a GPU nobody listed") is None and catalog.gpu_for(None) is None


def test_a_preset_peak_is_the_catalog_peak() -> None:
    from superoffload.planner.presets import PRESETS

    for g in catalog.GPUS:
        if g.preset is not None:
            assert PRESETS[g.preset]().device_peak_flops == g.peak_flops["bf16"], g


def test_an_unknown_gpu_plans_with_the_generic_preset_and_the_plan_says_so(monkeypatch) -> None:
    """Never a silent preset: a GPU without one of its own plans with the generic preset, and the plan's first
    reason says which GPU, which preset, and how to plan with this machine's numbers instead."""
    import torch

    from superoffload.harness.system import RunConfig
    from superoffload.harness.systems import superoffload_system as so
    from superoffload.planner.presets import GENERIC_GPU_PRESET, gpu_preset_warning
    from superoffload.shapes import get_shape

    assert gpu_preset_warning(None) is None and gpu_preset_warning("NVIDIA GH200 480GB") is None
    assert "knows it as A100" in gpu_preset_warning("NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA Imaginary X1")
    hw, warning = so.hardware_for_device("cuda")
    assert hw.name == GENERIC_GPU_PRESET
    assert "'NVIDIA Imaginary X1'" in warning and "does not list it" in warning and "calibrate" in warning
    plan = so.plan_for(get_shape("gpt-tiny"), RunConfig(system="superoffload", model="gpt-tiny", seq=32, batch=2,
                                                         precision="bf16", device="cuda"))
    assert plan.hardware == GENERIC_GPU_PRESET and plan.reasons[0] == warning
    # a profile given explicitly is the user's choice: nothing to warn about
    plan = so.plan_for(get_shape("gpt-tiny"), RunConfig(system="superoffload", model="gpt-tiny", seq=32, batch=2,
                                                         precision="bf16", device="cuda",
                                                         system_options={"hardware": "h100-pcie"}))
    assert not plan.reasons[0].startswith("Hardware: warning")
