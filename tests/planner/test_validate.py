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
