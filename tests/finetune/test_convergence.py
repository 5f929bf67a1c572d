"""The convergence check: engine (speculation forced on, clipping at 1.0) vs torch AdamW on byte-tokenized
standard library source. A 20-step version always; the documented 300-step check is marked slow."""

from __future__ import annotations

import json

import pytest

from superoffload.finetune import convergence as C
from superoffload.harness import record


def test_corpus_comes_from_this_interpreters_stdlib(tmp_path):
    info = C.build_corpus(tmp_path / "c.bin")
    assert info["files"] == list(C.CORPUS_FILES)
    assert info["tokens"] == (tmp_path / "c.bin").stat().st_size // 2 > 100_000


def test_short_check_writes_a_valid_result(tmp_path, capsys):
    out = tmp_path / "convergence.json"
    assert C.main(["--out", str(out), "--steps", "20"]) == 0
    res = record.read_result(out, "convergence")
    assert len(res["curves"]["superoffload"]) == len(res["curves"]["torch"]) == 20
    assert res["comparison"]["max_rel_diff"] < 1e-3
    assert res["speculation"]["speculated"] == 20  # speculation forced on, every step
    assert res["speculation"]["rolled_back"] == res["speculation"]["clipped"] > 0  # clipping fires from scratch
    assert "max |dloss|" in capsys.readouterr().out


@pytest.mark.slow
def test_full_check_curves_coincide(tmp_path):
    out = tmp_path / "convergence.json"
    assert C.main(["--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["steps"] == 300 and res["comparison"]["within_tolerance"]
    assert res["curves"]["torch"][-1] < 0.5 * res["curves"]["torch"][0]


def _result(steps: int = 5) -> dict:
    """A small result that follows convergence.schema.json."""
    torch_curve = [3.0 - 0.1 * i for i in range(steps)]
    so = [x + (1e-6 if i % 2 else 0.0) for i, x in enumerate(torch_curve)]
    return {
        "kind": "convergence", "schema_version": 1, "created_utc": "2026-12-01T00:00:00+00:00", "status": "ok",
        "corpus": {"files": ["textwrap.py"], "stdlib": "/x", "tokens": 1000, "sha256": "0", "tokenizer": "byte",
                   "python": "3.11.7"},
        "settings": {"model": "gpt-tiny", "steps": steps, "seq": 8, "batch": 2, "lr": 1e-3, "warmup": 1,
                     "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8, "grad_clip": 1.0, "seed": 1,
                     "dtype": "fp32", "tokens_per_step": 16, "superoffload_config": {}, "torch_optimizer": "AdamW"},
        "curves": {"superoffload": so, "torch": torch_curve},
        "comparison": {**C.compare(so, torch_curve), "weights_max_abs_diff": 0.0, "weights_mean_abs_diff": 0.0,
                       "tolerance_rel": 5e-3, "within_tolerance": True},
        "speculation": {"steps": steps, "speculated": steps, "committed": 1, "rolled_back": steps - 1,
                        "clipped": steps - 1, "skipped": 0, "validate_first": 0},
        "timing_s": {"superoffload": 1.0, "torch": 1.0}, "provenance": {"device": "cpu", "cpu": "x", "torch": "2"},
    }


def test_report_figure_reads_the_file_by_its_schema(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from reports import data as D
    from reports.figures import CAPTIONS, render_one

    res = tmp_path / "cpu_smoke"
    assert "Not available (missing)" in CAPTIONS["convergence"](D.load_results(res))
    svg = render_one(D.load_results(res), "convergence", tmp_path / "a.svg").read_text()
    assert "snakemake convergence" in svg
    record.write_result(res / "convergence" / "convergence.json", _result(), "convergence")
    cap = CAPTIONS["convergence"](D.load_results(res))
    assert "max |Δloss| = 1e-06 at step 2 of 5" in cap
    svg = render_one(D.load_results(res), "convergence", tmp_path / "b.svg").read_text()
    assert "max |Δloss| 1e-06 at step 2" in svg
    broken = _result()
    del broken["comparison"]["max_abs_diff"]
    (res / "convergence" / "convergence.json").write_text(json.dumps(broken))
    svg = render_one(D.load_results(res), "convergence", tmp_path / "c.svg").read_text()
    assert "not available (invalid)" in svg and "convergence.schema.json" in svg
