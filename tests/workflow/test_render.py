"""The report renders from synthetic results with missing, oom, error and malformed records; figures are
byte-identical across renders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from wf_helpers import ROOT, _adam_bench, _record, watchdog

from reports import data as D
from reports import figures as F
from reports import render as R


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    res = tmp_path / "cpu_smoke"
    tl = [{"t": 0.1 * i, "step": i, "gpu_util_pct": 50 + i, "host_cpu_pct": 90} for i in range(10)]
    _write(res / "runs/torch/gpt-tiny_s128_b2.json", _record("torch", timeline=tl))
    _write(
        res / "runs/torch/gpt-small_s128_b2.json", _record("torch", "gpt-small", tps=300, params=21_000_000)
    )
    _write(
        res / "runs/superoffload/gpt-tiny_s128_b2.json",
        _record("superoffload", tps=1500, rollbacks={"rollbacks": 2, "skipped": 1, "steps": 7}),
    )
    _write(
        res / "runs/superoffload/gpt-small_s128_b2.json", _record("superoffload", "gpt-small", status="oom")
    )
    _write(res / "runs/zero_offload/gpt-tiny_s128_b2.json", _record("zero_offload", status="error"))
    _write(res / "runs/fsdp_offload/gpt-tiny_s128_b2.json", "{ not json")
    for seq in (64, 256):
        _write(res / f"runs/torch/gpt-tiny_s{seq}_b2.json", _record("torch", seq=seq, tps=900))
    _write(
        res / "sweep.json",
        {
            "sweep": "cpu_smoke",
            "reason": "synthetic: no CUDA GPU",
            "steps": 5,
            "warmup": 2,
            "settings": {"description": "test", "dtype": "fp32"},
            "launcher": "",
            "hardware_key": "cpu-test",
            "hardware": {"cuda": False, "cpu": "x", "arch": "x86_64", "cpu_count": 2, "detail": "none"},
        },
    )
    variants = {
        "cum0-baseline": {"kind": "cumulative", "step": 0, "technique": None, "options": {"a": 0}},
        "cum1-speculation": {
            "kind": "cumulative",
            "step": 1,
            "technique": "speculation",
            "options": {"speculation": True},
        },
        "loo-speculation": {
            "kind": "leave_one_out",
            "step": None,
            "technique": "speculation",
            "options": {"speculation": False},
        },
    }
    _write(
        res / "ablation/variants.json",
        {"variants": variants, "techniques": {"speculation": {"label": "STV"}}},
    )
    _write(res / "ablation/cum0-baseline.json", _record("superoffload", tps=1000))
    _write(res / "ablation/cum1-speculation.json", _record("superoffload", status="error"))
    # loo-speculation missing on purpose
    _write(res / "microbench/adam.json", _adam_bench())
    _write(
        res / "microbench/cast.json",
        {"status": "unavailable", "error": "invalid choice: 'cast'", "written_by": "guard"},
    )
    # calibration missing entirely; predictions with rows
    _write(
        res / "predictions/paper_comparison.json",
        {
            "status": "ok",
            "rows": [
                {
                    "figure": "fig10",
                    "point": "gpt-1b torch",
                    "metric": "model_tflops",
                    "predicted": 480.0,
                    "paper": None,
                    "paper_status": "missing",
                    "rel_error": None,
                    "note": "",
                },
                {
                    "figure": "fig13",
                    "point": "1 chip superoffload",
                    "metric": "largest_model_B",
                    "predicted": 25.0,
                    "paper": 25.0,
                    "paper_status": "V",
                    "rel_error": 0.0,
                    "note": "",
                },
            ],
            "preset": None,
        },
    )
    _write(
        res / "predictions/validation.json",
        {"hardware": "cpu-calibrated", "target": 0.2, "rows": [
            {"system": "torch", "model": "gpt-tiny", "seq": 128, "batch": 2, "dtype": "fp32", "measured_s": 0.0200,
             "predicted_s": 0.0190, "rel_error": -0.05, "within_target": True, "compute": "profiled",
             "op_model_s": 0.0170, "op_model_rel_error": -0.15},
            {"system": "zero_offload", "model": "gpt-tiny", "seq": 128, "batch": 2, "dtype": "fp32",
             "measured_s": 0.0300, "predicted_s": 0.0150, "rel_error": -0.5, "within_target": False},
        ]},
    )
    return res


def test_report_renders_with_missing_oom_error(synthetic, tmp_path):
    figs = F.render_all(D.load_results(synthetic), tmp_path / "figs")
    assert set(figs) == set(F.FIGURES)
    out = R.render_html(synthetic, tmp_path / "figs", tmp_path / "report.html")
    html = out.read_text()
    assert 'class="oom"' in html and 'class="error"' in html
    assert "synthetic failure" in html
    assert "not available (unavailable)" in html  # cast microbenchmark
    assert "Calibration: not available (missing)" in html
    assert "not a run record" in html or "unreadable" in html  # the malformed file is an error row
    # a figure with data is an image; one whose every panel is empty is one line saying how to fill it
    empty = {name for name, path in figs.items() if F.empty_note(path.read_bytes()) is not None}
    assert empty and len(empty) < len(F.FIGURES)
    assert html.count("data:image/svg+xml;base64,") == len(F.FIGURES) - len(empty)
    assert "Convergence: engine vs torch</b>: no data yet." in html and "snakemake convergence" in html
    assert "grace_adam" in html and "host_phase" in html  # the GraceAdam rows made it into the table
    assert {p["impl"] for p in F.adam_points(D.load_results(synthetic))} == {
        "grace_adam", "torch_fused", "torch_foreach", "roofline_stream7"}
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    # cost model vs measurement: the count, both rows, the miss in bold
    assert "<b>1 of 2</b>" in html and "<b>-50.0%</b>" in html and "-5.0%" in html
    # the op-level column: counted over the rows that have it (the second is from an older validate)
    assert "op-level" in html and "<b>1 of 1</b>" in html and "-15.0%" in html and "profiled" in html


def test_report_renders_from_an_empty_folder(tmp_path):
    figs = F.render_all(D.load_results(tmp_path / "nothing"), tmp_path / "figs")
    assert len(figs) == len(F.FIGURES)
    html = R.render_html(tmp_path / "nothing", tmp_path / "figs", tmp_path / "r.html").read_text()
    assert "No run records" in html and "Validation not available (missing)" in html


def test_strict_undefined():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        R.environment().get_template("report.html.j2").render(title="x")


def test_summary_rows_speedup_and_statuses(synthetic):
    rows = D.summary_rows(D.load_results(synthetic)["runs"])
    so = next(r for r in rows if r["system"] == "superoffload" and r["model"] == "gpt-tiny")
    assert so["speedup"] == pytest.approx(1.5)
    assert {r["status"] for r in rows} == {"ok", "oom", "error"}


def test_figures_byte_identical_across_renders(synthetic, tmp_path):
    for out in ("a", "b"):
        watchdog.run([sys.executable, str(ROOT / "reports/render.py"), "figures", "--results", str(synthetic),
                      "--out", str(tmp_path / out)], check=True)
    a = sorted((tmp_path / "a").glob("*.svg"))
    assert [p.name for p in a] == [p.name for p in sorted((tmp_path / "b").glob("*.svg"))] and a
    for p in a:
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes(), p.name
        assert b"<dc:date>" not in p.read_bytes()


def test_a_microbenchmark_file_off_its_schema_is_reported_not_guessed(synthetic, tmp_path):
    """A `bench adam` file with a field the schema does not know and one it lacks: the report says which
    file, schema and field, in the GraceAdam section and in the figure, and draws nothing from it."""
    bad = _adam_bench()
    kernel = bad["measurements"][0]["kernels"]["grace_adam"]
    kernel["time_s"] = kernel.pop("median_s")  # the kind of renaming the old report code guessed around
    _write(synthetic / "microbench/adam.json", bad)
    results = D.load_results(synthetic)
    assert results["adam"]["status"] == "invalid" and results["adam"]["data"] is None
    assert "adam_bench.schema.json: at measurements/0/kernels/grace_adam" in results["adam"]["error"]
    assert F.adam_points(results) == []
    figs = F.render_all(results, tmp_path / "figs")
    svg = figs["graceadam"].read_text()
    assert "not available (invalid)" in svg and "adam_bench.schema.json" in svg
    html = R.render_html(synthetic, tmp_path / "figs", tmp_path / "report.html").read_text()
    assert "GraceAdam microbenchmark: not available (invalid): adam.json does not follow" in html


def test_cast_file_is_read_by_its_schema(synthetic, tmp_path):
    from superoffload.harness.microbench import cast

    rec = cast.measure([64 << 10, 1 << 20], repeats=1, device="cpu")
    _write(synthetic / "microbench/cast.json", rec)
    results = D.load_results(synthetic)
    assert results["cast"]["status"] == "ok"
    series = F.cast_series(results)
    assert set(series["bandwidth"]) == {"link: d2h pageable", "link: h2d pageable"}
    assert set(series["latency"]) == {f"{p}_path: {p} {c}" for p in ("grad", "param")
                                      for c in ("device_cast", "host_cast")}
    assert all(len(pts) == 2 for s in series.values() for pts in s.values())
    html = R.render_html(synthetic, tmp_path / "figs", tmp_path / "report.html").read_text()
    assert "<h4>grad_path: gradients to the host</h4>" in html and "<h4>link: host-device copies</h4>" in html
    assert "<h4>param_path: parameters to the device</h4>" in html
    assert "device_cast" in html and "host_cast" in html and " GB/s at " in html  # one row per policy, not per size


def test_a_noisy_run_is_flagged_in_the_report(synthetic, tmp_path):
    path = synthetic / "runs/torch/gpt-tiny_s128_b2.json"
    rec = json.loads(path.read_text())
    rec["noise"] = {"loadavg_before": [3.0] * 3, "loadavg_after": [3.0] * 3, "usable_cpus": 2,
                    "others_cpu_share": 0.6, "p90_over_p10": 3.1, "flags": ["spread", "loaded"]}
    path.write_text(json.dumps(rec))
    html = R.render_html(synthetic, tmp_path / "figs", tmp_path / "report.html").read_text()
    assert "noisy run (spread, loaded)" in html and "runs are flagged noisy" in html
    quiet = R.render_html(synthetic.parent / "nothing", tmp_path / "figs2", tmp_path / "r2.html").read_text()
    assert "flagged noisy" not in quiet
