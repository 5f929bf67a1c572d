"""Profiles: presets, link curves, JSON round trip."""

from __future__ import annotations

import json
import math

import pytest

from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.hardware import GB, Curve, GiB, HardwareProfile
from superoffload.planner.presets import PRESETS, get_profile
from superoffload.shapes import get_shape


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trips_through_json(name: str, tmp_path) -> None:
    prof = get_profile(name)
    path = tmp_path / f"{name}.json"
    prof.save(path)
    assert HardwareProfile.load(path) == prof
    assert get_profile(str(path)) == prof
    json.loads(path.read_text())  # plain JSON
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temporary behind


def test_curve_keeps_its_old_name() -> None:
    from superoffload.planner.hardware import LinkCurve

    assert LinkCurve is Curve


def test_link_curve_interpolates_in_log_size() -> None:
    c = Curve([2**20, 2**24], [10.0, 50.0])
    assert c.bandwidth(2**22) == pytest.approx(30.0)  # log-midpoint
    assert c.bandwidth(1) == 10.0 and c.bandwidth(2**40) == 50.0  # clamped
    assert c.seconds(2**24) == pytest.approx(2**24 / (50.0 * GB))


def test_latency_bandwidth_curve_approaches_peak() -> None:
    c = Curve.latency_bandwidth(100.0, 10e-6)
    assert c.gbps == sorted(c.gbps)
    assert c.gbps[-1] == pytest.approx(100.0, rel=0.01)
    assert c.gbps[0] < 60.0


def test_gh200_preset_uses_the_specs() -> None:
    p = get_profile("gh200")
    assert p.device_peak_flops == 989e12
    assert p.h2d_pinned.peak() < 450.0  # never above the 450 GB/s per-direction spec
    assert p.host_cores == 72
    # the GraceAdam table: 8e9 params in 0.608 s
    assert p.host_adam_seconds(8e9, "grace") == pytest.approx(0.608)
    assert p.host_adam_seconds(8e9, "torch") == pytest.approx(1.834)
    assert math.isclose(p.host_adam_gbps["grace"] / p.host_adam_gbps["cpuadam"], 0.769 / 0.608)


def test_unknown_hardware_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown hardware"):
        get_profile("tpu-v9")
    with pytest.raises(ValueError):
        Curve([2, 1], [1.0, 1.0])


def test_small_op_terms_slow_predictions_and_round_trip(tmp_path) -> None:
    """A calibrated profile's small-op fields (GEMM-efficiency curve, elementwise GB/s, dispatch cost)
    make tiny-model predictions slower, never faster, and survive the JSON round trip."""
    from dataclasses import replace


    base = get_profile("cpu")
    small = replace(base, matmul_curve=Curve([10**5, 10**9], [1.0, base.device_matmul_flops / 1e9]),
                    elementwise_gbps=10.0, op_overhead_s=5e-6)
    w = Workload(get_shape("gpt-tiny"), 128, 2, activation_checkpointing=False)
    assert predict("torch", w, small).step_time_s > predict("torch", w, base).step_time_s
    small.save(tmp_path / "p.json")
    again = HardwareProfile.load(tmp_path / "p.json")
    assert again.matmul_curve == small.matmul_curve and again.op_overhead_s == 5e-6


def test_a_cpu_run_without_a_profile_plans_for_this_machine(monkeypatch) -> None:
    """Without a GPU and without a profile the plan is made for this machine's cores and memory (the cpu
    preset's spec numbers per core), not for the preset's generic 8 cores and 64 GiB."""
    from superoffload.planner import presets

    monkeypatch.setattr(presets.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(presets.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 6 * 2**18}[name])
    here, generic = presets.default_profile(None), presets.cpu()
    assert here.host_cores == 2 and here.host_memory_bytes == 6 * GiB
    assert here.device_peak_flops == generic.device_peak_flops * 2 / generic.host_cores
    assert "2 usable CPUs" in here.source and here.device_is_host
    assert presets.default_profile("NVIDIA GH200 480GB").name == "gh200"
