"""The CPU's MFU denominator is one figure per machine, dtype and thread count: measured once (or by
calibrate), kept, and named in every record's source; a measurement on a loaded machine is not kept."""

from __future__ import annotations

import json

import torch

from superoffload.harness import peak
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig


def test_runs_divide_by_one_kept_figure(tmp_path, monkeypatch):
    from superoffload.harness import noise

    cache = tmp_path / "cpu_peak.json"
    monkeypatch.setenv("SUPEROFFLOAD_PEAK_CACHE", str(cache))
    # a quiet machine (test_noise.py checks the measurement; here whatever else runs must not matter)
    monkeypatch.setattr(noise.NoiseSampler, "others_share", lambda self, ranks=1: 0.0)
    recs = [run_benchmark(RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2, steps=2, warmup=1,
                                    threads=1)) for _ in range(2)]
    first, second = (r["throughput"] for r in recs)
    kept = json.loads(cache.read_text())
    assert len(kept) == 1 and next(iter(kept.values()))["by"] == "harness"
    assert first["peak_flops"] == second["peak_flops"] == next(iter(kept.values()))["flops"]
    assert "kept in" in first["peak_flops_source"] and second["peak_flops_source"].startswith("cpu-peak-cache:harness:")


def test_first_writer_wins_and_a_loaded_measurement_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROFFLOAD_PEAK_CACHE", str(tmp_path / "p.json"))
    assert not peak.store_cpu_peak(torch.float32, 1, 5e10, "calibrate", others_cpu_share=0.6)
    assert peak.store_cpu_peak(torch.float32, 1, 5e10, "calibrate", others_cpu_share=0.0)
    assert not peak.store_cpu_peak(torch.float32, 1, 9e10, "harness")
    flops, source = peak.cpu_peak(torch.float32, 1)
    assert flops == 5e10 and source.startswith("cpu-peak-cache:calibrate:")
    other, _ = peak.cpu_peak(torch.float32, 2)  # another thread count is its own figure
    assert other != 5e10


def test_a_plan_without_a_gpu_uses_this_machines_kept_matmul_rate_and_says_so(tmp_path, monkeypatch):
    """No GPU and no profile: the plan's compute is this CPU's measured matmul rate (the figure its MFU divides
    by), its cores and memory the OS's, and the plan's reasons name where each came from."""
    from superoffload.harness.systems.superoffload_system import hardware_for_device, plan_for
    from superoffload.models import get_shape
    from superoffload.planner.presets import cpu, usable_cpus

    monkeypatch.setenv("SUPEROFFLOAD_PEAK_CACHE", str(tmp_path / "p.json"))
    assert peak.store_cpu_peak(torch.float32, torch.get_num_threads(), 12.5e9, "calibrate", 0.0)
    hw, warning = hardware_for_device("sim")
    assert warning is None  # the CPU's own numbers: nothing to warn of
    assert hw.name == "this-cpu" and hw.device_matmul_flops == 12.5e9 and hw.host_cores == usable_cpus()
    assert hw.device_matmul_flops != cpu().device_matmul_flops
    run = RunConfig(system="superoffload", model="gpt-tiny", seq=64, batch=2, device="sim", precision="fp32")
    plan = plan_for(get_shape("gpt-tiny"), run)
    said = [r for r in plan.reasons if r.startswith("Hardware: this-cpu:")]
    assert len(said) == 1 and "matmul 12 GFLOP/s measured (cpu-peak-cache:calibrate:" in said[0]
    assert f"{usable_cpus()} usable CPUs" in said[0]


def test_the_probe_is_sized_so_one_matmul_takes_at_most_a_second():
    # fp32 on one loaded core (~5 GFLOP/s at 256, 21 at 1024) keeps the 1024 probe; bf16 without bf16 matmul
    # units (~0.4 GFLOP/s: 5 s at 1024, 0.7 s at 512) takes 512; slower still, 256
    assert peak.probe_size(5e9) == 1024
    assert peak.probe_size(0.4e9) == 512
    assert peak.probe_size(0.1e9) == 256 and peak.probe_size(1.0) == 256
    peak.measure_cpu_peak_flops.cache_clear()
    assert peak.measure_cpu_peak_flops(torch.bfloat16, 1, seconds=0.05) > 0
