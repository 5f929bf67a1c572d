"""One vocabulary: the planner's Options and Plan use the engine config's names and values, and an engine
config turns into Options without losing a knob."""

from __future__ import annotations

import dataclasses
import json

import pytest

from superoffload.engine.config import SuperOffloadConfig
from superoffload.options import ENGINE_DEFAULTS, SHARED_KEYS
from superoffload.planner.hardware import HardwareProfile
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options


def test_engine_defaults_are_the_engines() -> None:
    cfg = SuperOffloadConfig().to_dict()
    assert {k: cfg[k] for k in SHARED_KEYS} == ENGINE_DEFAULTS


def test_options_fields_are_the_engine_keys() -> None:
    names = {f.name for f in dataclasses.fields(Options)}
    assert set(SHARED_KEYS) <= names


def test_from_engine_config_loses_nothing() -> None:
    cfg = SuperOffloadConfig.from_any({
        "precision": "bf16", "bucket_size": 4096, "device_tail_buckets": 3, "speculation": False,
        "rollback_mode": "full_copy", "grad_cast": "host", "param_cast": "device", "host_optimizer": "torch",
        "flow_layers": [2, 3], "flow_prefetch": 2, "grad_accum": 4, "grad_clip": 0.5}).to_dict()
    opts = Options.from_engine_config(cfg)
    for k in SHARED_KEYS:
        want = tuple(cfg[k]) if k == "flow_layers" else cfg[k]
        assert getattr(opts, k) == want, k


def test_from_engine_config_fills_keys_older_records_lack_with_the_engine_defaults() -> None:
    cfg = SuperOffloadConfig().to_dict()
    for k in ("host_optimizer", "flow_layers", "flow_prefetch"):
        del cfg[k]
    opts = Options.from_engine_config(cfg)
    assert (opts.host_optimizer, opts.flow_layers, opts.flow_prefetch) == ("grace", (), 1)
    assert opts.param_cast == "host"  # the engine's default, not the planner's
    with pytest.raises(ValueError, match="host_optimizer"):
        Options.from_engine_config({**cfg, "host_optimizer": "graceadam"})


def test_options_reject_values_outside_the_vocabulary() -> None:
    for field, bad in (("host_optimizer", "graceadam"), ("rollback_mode", "none"), ("grad_cast", "gpu"),
                       ("precision", "fp8")):
        with pytest.raises(ValueError, match=field):
            Options(**{field: bad}).validate()


def test_profiles_with_the_old_host_kernel_name_still_load(tmp_path) -> None:
    d = get_profile("gh200").to_dict()
    d["host_adam_gbps"] = {("graceadam" if k == "grace" else k): v for k, v in d["host_adam_gbps"].items()}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    prof = HardwareProfile.load(path)
    assert set(prof.host_adam_gbps) == {"grace", "torch", "cpuadam"}
    assert prof == get_profile("gh200")


def test_engine_memory_input_has_the_engines_names_and_defaults() -> None:
    """The memory model's input is built from the engine's vocabulary, not defaults of its own: its defaults are
    SuperOffloadConfig's, and an engine config and the Options read from it give the same input."""
    from superoffload.options import MEMORY_DEFAULTS
    from superoffload.planner.costmodel import engine_memory_input
    from superoffload.planner.memory import EngineMemoryInput

    engine = SuperOffloadConfig().to_dict()
    assert engine["staging_buffers"] == MEMORY_DEFAULTS["staging_buffers"]
    assert engine["optimizer"]["amsgrad"] == MEMORY_DEFAULTS["amsgrad"]
    blank = EngineMemoryInput()
    for f in dataclasses.fields(EngineMemoryInput):
        if f.name in engine:
            want = tuple(engine[f.name]) if f.name == "flow_layers" else engine[f.name]
            assert getattr(blank, f.name) == want, f.name
    cfg = SuperOffloadConfig.from_any({"precision": "bf16", "bucket_size": 4096, "device_tail_buckets": 2,
                                       "grad_cast": "host", "flow_layers": [1], "upload_slots": 3}).to_dict()
    assert engine_memory_input(cfg, world=2) == engine_memory_input(Options.from_engine_config(cfg), world=2)
    with_ring = engine_memory_input({**cfg, "staging_buffers": 3, "optimizer": {**cfg["optimizer"], "amsgrad": True}})
    assert (with_ring.staging_buffers, with_ring.amsgrad) == (3, True)


def test_workload_precision_keeps_its_old_name() -> None:
    from dataclasses import replace

    from superoffload.planner.costmodel import Workload
    from superoffload.shapes import get_shape

    w = Workload(get_shape("gpt-tiny"), 32, 2, dtype="fp32")
    assert w.precision == "fp32" and w == Workload(get_shape("gpt-tiny"), 32, 2, precision="fp32")
    assert replace(w, sp=1).precision == "fp32"
