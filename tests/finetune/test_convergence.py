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
    assert C.main(["--out", str(out), "--steps", "20", "--threads", "2"]) == 0
    res = record.read_result(out, "convergence")
    assert len(res["curves"]["superoffload"]) == len(res["curves"]["torch"]) == 20
    assert res["comparison"]["max_rel_diff"] < 1e-3
    assert res["speculation"]["speculated"] == 20  # speculation forced on, every step
    assert res["speculation"]["rolled_back"] == res["speculation"]["clipped"] > 0  # clipping fires from scratch
    assert "max |dloss|" in capsys.readouterr().out


@pytest.mark.slow
def test_full_check_curves_coincide(tmp_path):
    out = tmp_path / "convergence.json"
    assert C.main(["--out", str(out), "--threads", "2"]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["steps"] == 300 and res["comparison"]["within_tolerance"]
    assert res["curves"]["torch"][-1] < 0.5 * res["curves"]["torch"][0]
