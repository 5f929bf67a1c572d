"""The report's headline and its tables: computed from the data (records, predictions), formatted with units,
only rows and columns with data, infeasible points labelled by what binds them."""

from __future__ import annotations

import json
import re
import sys
from html import unescape
from pathlib import Path

import pytest
from wf_helpers import ROOT, _record

from reports import data as D
from reports import figures as F
from reports import formatting as fm
from reports import headline as H
from reports import render as R
from reports import tables as T
from reports.context import infeasible_text

sys.path.insert(0, str(ROOT / "workflows" / "scripts"))
import binding  # noqa: E402  (the predictions job's module)

TB = 1e12


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _pc_row(figure, point, metric, predicted, paper=None, status="missing", note="", chips=1):
    err = None if predicted is None or paper is None else (predicted - paper) / paper
    return {"figure": figure, "point": point, "metric": metric, "predicted": predicted, "paper": paper,
            "paper_status": status, "rel_error": err, "note": note, "chips": chips}


def _largest(system, chips, params, memory, need, cap):
    return {"system": system, "chips": chips, "zoo_model": "gpt-30b", "zoo_layers": 36, "params": params, "layers": 40,
            "binding": {"memory": memory, "need_bytes": need, "capacity_bytes": cap,
                        "bytes_per_param": need / (params * 1.02), "at_params": params * 1.02},
            "hardware": "gh200"}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    res = tmp_path / "cpu_smoke"
    _write(res / "runs/torch/gpt-tiny_s128_b2.json", _record("torch", tps=1000.0))
    _write(res / "runs/superoffload/gpt-tiny_s128_b2.json", _record("superoffload", tps=1500.0))
    _write(res / "runs/zero_offload/gpt-tiny_s128_b2.json", _record("zero_offload", tps=500.0))
    _write(res / "runs/zero_offload/gpt-tiny_s256_b2.json", _record("zero_offload", seq=256, status="oom"))
    _write(res / "runs/superoffload/gpt-tiny_s256_b2.json", _record("superoffload", seq=256, tps=900.0,
                                                                     params=1_000_000))
    _write(res / "sweep.json", {"sweep": "cpu_smoke", "reason": "synthetic", "steps": 5, "warmup": 2,
                                "hardware": {"cpu": "x", "arch": "x86_64", "cpu_count": 2}})
    rows = [
        _pc_row("fig10", "gpt-1b superoffload", "model_tflops", 500.0),
        _pc_row("fig10", "gpt-1b zero_offload", "model_tflops", 200.0),
        _pc_row("fig10", "gpt-2b superoffload", "model_tflops", 450.0),
        _pc_row("fig10", "gpt-2b zero_offload", "model_tflops", None, note="OOM"),
        _pc_row("abstract", "fig10 sweep, max", "superoffload/zero_offload", 2.5, 2.5, "V"),
        _pc_row("fig11", "4 chips, mean over sizes", "superoffload/zero_offload", 1.2, 2.5, "S", chips=4),
        _pc_row("fig11", "4 chips, max over sizes", "superoffload/ZeRO-2 - 1", None, 0.46, "S",
                "ZeRO-2 without offload is not modelled", chips=4),
        _pc_row("fig13", "1 chip superoffload", "largest_model_B", 30.0, 25.0, "V"),
    ]
    _write(res / "predictions/paper_comparison.json", {
        "status": "ok", "hardware": "gh200", "rows": rows, "preset": None,
        "largest": [_largest("superoffload", 1, 32.6e9, "host", 0.489 * TB, 0.48 * TB),
                    _largest("zero_offload", 1, 28.6e9, "host", 0.488 * TB, 0.48 * TB),
                    _largest("torch", 1, 5.49e9, "device", 105e9, 103e9),
                    _largest("superoffload", 4, 131.7e9, "host", 0.482 * TB, 0.48 * TB)],
        "does_not_fit": [{"figure": "fig10", "point": "gpt-2b zero_offload", "chips": 1,
                          "binding": {"memory": "device", "need_bytes": 120e9, "capacity_bytes": 103e9}}]})
    _write(res / "predictions/explain/gpt-25b_s2048_b1.json", {
        "status": "error", "written_by": "guard",
        "error": "superoffload explain: infeasible: gpt-25b: host memory needs 5.000e+11 bytes (500.0 GB, ~20.3 "
                 "B/param: master_m_v 12.0) but gh200 has 4.800e+11 bytes (480.0 GB) usable. It would fit ..."})
    return res


def test_formatting_never_prints_a_raw_value():
    assert [fm.params(x) for x in (932_000, 1_060_000, 23e9, None)] == ["0.93M", "1.06M", "23.0B", "–"]
    assert fm.nbytes(489e9) == "489 GB" and fm.nbytes(float("nan")) == "–"
    assert fm.sig(0.123456789) == "0.123" and fm.sig(1234.5678) == "1,235" and fm.sig(12) == "12"
    assert fm.text(None) == "–" and fm.text(float("nan")) == "–" and fm.pct(0.0352) == "3.52%"


def test_a_table_leaves_out_empty_columns_and_rows_and_says_so():
    cols = [T.Column("name", "name", left=True, key_column=True), T.Column("a", "a"), T.Column("b", "energy"),
            T.Column("s", "status", badge=True)]
    t = T.build([{"name": "x", "a": 1.23456, "b": None, "s": "ok"}, {"name": "y", "a": None, "b": None},
                 {"name": "z", "a": float("nan"), "s": "does not fit: host"}], cols)
    assert [c.header for c in t.columns] == ["name", "a", "status"]
    assert [[c.text for c in r] for r in t.rows] == [["x", "1.23", "ok"], ["z", "–", "does not fit: host"]]
    assert t.rows[1][2].badge == "nab"  # infeasible by design: the neutral badge, never the error red
    assert t.left_out == "Left out: 1 column without data (energy); 1 rows without data."


def test_one_parameter_count_per_model():
    # records of one model at several sequence lengths carry several counts (the position table grows)
    assert D.model_params("gpt-tiny", 900_000) == D.model_params("gpt-tiny", 1_100_000)
    assert D.model_params("not-a-zoo-model", 123.0) == 123.0


def test_the_headline_comes_from_the_data(results: Path, tmp_path: Path):
    res = D.load_results(results)
    ctx = R.build_context(res, {})
    peers = {r[0].text: [c.text for c in r] for r in ctx["headline"]["peers"].rows}
    zo = peers["ZeRO-Offload"]
    # measured: 1500 / 500 at seq 128; at seq 256 only SuperOffload ran ok
    assert zo[1] == "3.00x (1 point); 1 point only SuperOffload ran ok"
    # predicted (Fig 10): 500 / 200 at 1b; 2b fits only SuperOffload
    assert zo[2] == "2.50x (1 size); 1 size only SuperOffload fits"
    why = ctx["headline"]["largest"]["why"]
    assert why[0].startswith("SuperOffload (ours): 32.6B (gpt-30b + 4 blocks)") and "host memory binds" in why[0]
    assert "489 GB of 480 GB" in why[0]
    assert why[-1].startswith("PyTorch, no offload: 5.49B") and "device memory binds" in why[-1]
    claims = {(c["claim"]): c for c in H.claims(ctx["paper_comparison"]["rows"], {}, False)}
    assert claims["abstract: fig10 sweep, max"]["status"] == "holds (predicted)"
    assert claims["fig11: 4 chips, mean over sizes"]["status"] == "does not hold (predicted)"
    assert claims["fig11: 4 chips, mean over sizes"]["error"] == pytest.approx(-0.52)
    assert claims["fig11: 4 chips, max over sizes"]["status"] == "no prediction"
    groups = {g["title"].split(":")[0]: g["items"] for g in ctx["headline"]["open_items"]}
    assert any("4 chips, mean over sizes" in i for i in groups["Claims that do not hold"])
    assert any("ZeRO-2 without offload is not modelled" in i for i in groups["Claims without a prediction"])
    assert any("oom" in i for i in groups["On this machine"])
    # the Fig 10 grid says why a point does not fit, in a neutral cell
    grid = ctx["predictions"]["grids"][0]["table"]
    cells = {c.text: c for r in grid.rows for c in r}
    assert cells["does not fit: device"].title == "device memory: needs 120 GB of 103 GB"
    # the explain point that does not fit by design: labelled by its binding constraint, not as an error
    (plan,) = ctx["explain"]["table"].rows
    assert plan[1].text == "does not fit: host memory (500.0 GB of 480.0 GB)" and plan[1].badge == "nab"
    F.render_all(res, tmp_path / "figs")
    html = R.render_html(results, tmp_path / "figs", tmp_path / "report.html").read_text()
    assert html.index('id="headline"') < html.index('id="runs"')  # the answer first
    assert 'class="badge errb">error' not in html
    text = re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]+"', "", html))
    assert not re.search(r"\bNone\b|\bnan\b|\[MISSING\]", text)


def test_infeasible_messages_name_their_binding_memory():
    msg = ("gpt-40b seq 2048 batch 1: device memory needs 1.200e+11 bytes (120.0 GB) but the budget is "
           "1.031e+11 bytes (103.1 GB). Would help: ...")
    assert infeasible_text(msg) == "does not fit: device memory (120.0 GB of 103.1 GB)"
    assert infeasible_text("superoffload explain: infeasible: something else") == "does not fit"
    assert infeasible_text("Traceback: KeyError") is None


def test_largest_rows_say_what_binds_one_block_later():
    """The planner's largest model per system (one chip) with the memory one more block overflows: the
    largest fits and the next does not (binding.py against the planner's own feasibility)."""
    rows = binding.largest_rows("gh200", chip_counts=(1,))
    assert {r["system"] for r in rows} == set(binding.SYSTEMS)
    for r in rows:
        if not r["params"]:
            continue
        b = r["binding"]
        assert b["memory"] in ("host", "device"), r
        assert b["need_bytes"] > b["capacity_bytes"] and b["at_params"] > r["params"], r


def test_points_that_do_not_fit_say_which_memory():
    """binding.does_not_fit against the planner: Fig 10's points predicted OOM overflow a memory it names,
    and a point that fits is not listed."""
    rows = [_pc_row("fig10", "gpt-25b torch", "model_tflops", None, note="OOM"),
            _pc_row("fig10", "gpt-1b torch", "model_tflops", 480.0),
            _pc_row("fig13", "1 chip torch", "largest_model_B", 5.0, 3.5, "S")]
    (only,) = binding.does_not_fit(rows)
    assert only["point"] == "gpt-25b torch" and only["binding"]["memory"] == "device"
    assert only["binding"]["need_bytes"] > only["binding"]["capacity_bytes"]


def test_ratios_from_a_loaded_machine_are_marked_in_the_headline(results: Path, tmp_path: Path):
    """A ratio with a run flagged `loaded` behind it carries the marker and the headline says what it means; a
    ratio of quiet runs does not, and a quiet sweep has no note."""
    quiet = R.build_context(D.load_results(results), {})
    assert quiet["headline"]["loaded_note"] == ""
    assert not any(H.LOADED_MARK in c.text for r in quiet["headline"]["peers"].rows for c in r)
    rec = _record("superoffload", tps=1500.0)
    rec["noise"] = {"flags": ["loaded"]}  # as superoffload/harness/noise.py writes it
    _write(results / "runs/superoffload/gpt-tiny_s128_b2.json", rec)
    torch = _record("torch", seq=256, tps=800.0)
    torch["noise"] = {"flags": ["spread"]}  # noisy, but not loaded: no marker of its own
    _write(results / "runs/torch/gpt-tiny_s256_b2.json", torch)
    ctx = R.build_context(D.load_results(results), {})
    peers = {r[0].text: [c.text for c in r] for r in ctx["headline"]["peers"].rows}
    # seq 128: 1500 / 500 with ours loaded; seq 256: 900 / 800, both not loaded
    assert peers["ZeRO-Offload"][1] == "3.00x (1 point) † loaded; 1 point only SuperOffload ran ok"
    assert peers["PyTorch, no offload"][1] == "1.31x (1.12x–1.50x, 2 points) † 1 of 2 loaded"
    assert H.LOADED_MARK not in peers["ZeRO-Offload"][2]  # the predicted column: no load to speak of
    note = ctx["headline"]["loaded_note"]
    assert note.startswith("† Measured on a loaded machine") and "quiet machine" in note
    page = R.render_html(results, tmp_path / "no-figures", tmp_path / "report.html").read_text()
    head = unescape(page[page.index('id="headline"'):page.index('id="runs"')])
    assert "3.00x (1 point) † loaded" in head and note in head
