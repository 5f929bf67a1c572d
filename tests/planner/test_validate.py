"""Predicted vs measured rows from run records."""

from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig
from superoffload.planner.presets import get_profile
from superoffload.planner.validate import compare, format_rows


def test_compare_real_records():
    recs = [run_benchmark(RunConfig(system=s, model="gpt-tiny", seq=32, batch=2, steps=2, warmup=1, threads=1))
            for s in ("torch", "superoffload")]
    recs.append({**recs[0], "status": "error"})  # errors are skipped
    rows = compare(recs, get_profile("cpu"))
    assert [r["system"] for r in rows] == ["torch", "superoffload"]
    for r in rows:
        assert r["predicted_s"] > 0 and r["measured_s"] > 0
        assert r["rel_error"] == r["predicted_s"] / r["measured_s"] - 1
    text = format_rows(rows, "cpu")
    assert "within ±20%" in text and "gpt-tiny" in text


def test_small_op_terms_slow_predictions_and_round_trip(tmp_path):
    """A calibrated profile's small-op fields (GEMM-efficiency curve, elementwise GB/s, dispatch cost)
    make tiny-model predictions slower, never faster, and survive the JSON round trip."""
    from dataclasses import replace

    from superoffload.harness.models import get_shape
    from superoffload.planner.costmodel import Workload, predict
    from superoffload.planner.hardware import HardwareProfile, LinkCurve

    base = get_profile("cpu")
    small = replace(base, matmul_curve=LinkCurve([10**5, 10**9], [1.0, base.device_matmul_flops / 1e9]),
                    elementwise_gbps=10.0, op_overhead_s=5e-6)
    w = Workload(get_shape("gpt-tiny"), 128, 2, activation_checkpointing=False)
    assert predict("torch", w, small).step_time_s > predict("torch", w, base).step_time_s
    small.save(tmp_path / "p.json")
    again = HardwareProfile.load(tmp_path / "p.json")
    assert again.matmul_curve == small.matmul_curve and again.op_overhead_s == 5e-6
