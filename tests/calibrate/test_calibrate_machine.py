"""`superoffload calibrate` on this machine: a quick profile that the planner can use, and the CLI."""

from __future__ import annotations

import argparse
import time

from superoffload.calibrate import machine as calibrate_mod
from superoffload.planner.plan import make_plan
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape


def test_calibrate_quick_on_this_machine(tmp_path) -> None:
    t0 = time.perf_counter()
    out = tmp_path / "prof.json"
    prof = calibrate_mod.calibrate(out, quick=True)
    # about 12 s on two quiet cores, 29 s beside other jobs: the bound is 7x the quiet time, so a busy machine
    # does not fail it and a hang or a --quick grown several times slower does
    assert time.perf_counter() - t0 < 90
    assert out.exists()
    assert prof.device_matmul_flops > 0 and prof.device_peak_flops > 0
    assert all(g > 0 for g in prof.d2h_pinned.gbps + prof.h2d_pinned.gbps)
    assert all(v > 0 for v in prof.host_adam_gbps.values())
    assert set(prof.host_adam_gbps) == {"torch", "cpuadam", "grace"}  # the engine's host_optimizer names
    assert prof.host_cast_gbps > 0 and prof.sync_latency_s > 0 and prof.host_cores >= 1
    # what the rates stand for: the threads they were measured at, host Adam at the other counts this host has
    import torch

    from superoffload.planner.presets import usable_cpus

    assert prof.compute_threads == prof.host_adam_threads == torch.get_num_threads()
    counts = {int(t) for t in prof.host_adam_by_threads or {}}
    assert counts == ({t for t in (1, 2, 4, 8, 16, 32, 64, 128) if t <= usable_cpus()} | {usable_cpus()}) - {
        torch.get_num_threads()}
    assert all(r["grace"] > 0 and r["torch"] > 0 for r in (prof.host_adam_by_threads or {}).values())
    # --quick does not load DeepSpeed: its rate is derived from the measured GraceAdam, never above it
    assert prof.host_adam_gbps["cpuadam"] < prof.host_adam_gbps["grace"]
    assert any("while calibrating" in n for n in prof.notes)
    # the measured profile drives the planner
    plan = make_plan(get_shape("gpt-tiny"), 128, 2, get_profile(str(out)))
    assert plan.predicted is not None and plan.predicted.step_time_s > 0


def test_add_cli_wires_calibrate() -> None:
    parser = argparse.ArgumentParser(prog="superoffload")
    sub = parser.add_subparsers(dest="cmd", required=True)
    calibrate_mod.add_cli(sub)
    args = parser.parse_args(["calibrate", "--quick", "--threads", "1"])
    assert args.func is not None and args.threads == 1 and args.quick


def test_calibrate_reads_the_peak_from_the_harness_table() -> None:
    """One MFU table: calibrate's own copy matched "B200" inside "NVIDIA GB200" and gave it B200's peak."""
    from superoffload.harness import peak

    assert calibrate_mod.gpu_peak_flops is peak.gpu_peak_flops
    assert peak.gpu_peak_flops("NVIDIA GB200") == 2.5e15 and peak.gpu_peak_flops("NVIDIA B200") == 2.25e15
    assert peak.gpu_peak_flops("NVIDIA GH200 480GB") == peak.gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak.gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
