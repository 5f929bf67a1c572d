"""The planner regression case: a plan_optimality result in a night's folder becomes one case per point, judged on
planned / best tokens/s like every relative metric, with a command that measures the grid at both ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from superoffload.cli.main import main
from superoffload.nightly import fingerprint as F
from superoffload.nightly import metrics as M
from superoffload.nightly.store import History

from .test_cli import CASE, _record

POINT = "gpt-tiny:s128:b2:w2:fp32"
PO_CASE = "plan_optimality_gpt-tiny_s128_b2_w2_fp32"


def _config(label: str, tps: list[float], errors: list[str] | None = None) -> dict:
    return {"label": label, "options": {}, "predicted_step_s": 0.02, "tokens_per_s": tps, "errors": errors or []}


def _result(planned: list[float], best: list[float], commit: str = "ab" * 20, complete: bool = True) -> dict:
    """A plan_optimality result as the benchmark writes it (only what the nightly reads is filled)."""
    return {
        "kind": "plan_optimality", "schema_version": 1, "created_utc": "2026-11-01T00:00:00+00:00",
        "complete": complete,
        "settings": {"workloads": ["gpt-tiny:128:2"], "world": [2], "dtype": ["fp32"],
                     "grid": ["planned", "bucket/4", "one-bucket"], "repeats": len(planned), "steps": 8, "warmup": 2,
                     "threads": 1, "bind_cores": False, "device": "auto", "hardware": "this-cpu", "peers": []},
        "hardware": {"name": "cpu", "source": "preset", "collectives": []},
        "provenance": {"device": "cpu", "cpu": "Test CPU", "cpu_count": 2, "torch": "2.13.0", "git_commit": commit,
                       "git_dirty": False},
        "points": [{"id": POINT, "best_label": "one-bucket",
                    "configs": [_config("planned", planned), _config("bucket/4", [1.0] * len(planned)),
                                _config("one-bucket", best)]}],
    }


def _night(root: Path, name: str, planned: list[float], best: list[float], commit: str) -> Path:
    d = root / name
    (d / CASE).mkdir(parents=True)
    (d / CASE / "rep0.json").write_text(json.dumps(_record(1000, commit=commit)))
    (d / "plan_optimality").mkdir()
    (d / "plan_optimality" / "rep0.json").write_text(json.dumps(_result(planned, best, commit)))
    return d


def test_a_result_gives_a_case_per_point_and_a_paired_ratio_per_repeat() -> None:
    samples = M.from_record("plan_optimality", 0, _result([90.0, 100.0, 80.0], [100.0, 100.0, 100.0]))
    got = {(s.metric, s.rep): s for s in samples}
    assert {s.case for s in samples} == {PO_CASE}
    assert [got[("planned_over_best", r)].value for r in range(3)] == pytest.approx([0.9, 1.0, 0.8])
    assert got[("status", 0)].text == "ok" and got[("best_config", 0)].text == "one-bucket"
    assert json.loads(got[("spec", 0)].text)["hardware"] == "this-cpu"
    # an unfinished grid or a failed run is a status failure, not a ratio
    bad = M.from_record("plan_optimality", 0, _result([90.0], [100.0], complete=False))
    assert {(s.metric, s.text) for s in bad if s.metric == "status"} == {("status", "error")}
    assert not any(s.metric == "planned_over_best" for s in bad)
    # the same fingerprint as the night's run records (same threads, binding and dtype)
    assert F.from_record(_result([1.0], [1.0])) == F.from_record(_record(1000))


def test_a_planner_regression_is_caught_and_says_how_to_measure_it(tmp_path) -> None:
    store = str(tmp_path / "h.sqlite")
    nights = [([98.0, 100.0, 97.0], [100.0] * 3)] * 4 + [([80.0, 79.0, 81.0], [100.0] * 3)] * 2
    for i, (planned, best) in enumerate(nights):
        d = _night(tmp_path, f"n{i}", planned, best, commit=f"{i:02d}" * 20)
        assert main(["nightly", "record", "--runs", str(d), "--store", store, "--source", f"n{i}"]) == 0
    out = tmp_path / "v.json"
    assert main(["nightly", "check", "--store", store, "--out", str(out)]) == 1
    v = json.loads(out.read_text())
    assert f"{PO_CASE}:planned_over_best" in v["regressed"]
    [cmd] = [c for c in v["bisect"] if "plan_optimality.py" in c]
    assert "--workloads gpt-tiny:128:2 --world 2 --dtype fp32" in cmd and "--hardware this-cpu" in cmd
    assert f"{'04' * 6}" in cmd and f"{'03' * 6}" in cmd
    with History(store) as h:
        row = [r for r in h.nights("training")]
        assert len(row) == 6
