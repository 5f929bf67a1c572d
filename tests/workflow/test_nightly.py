"""The nightly comparison: noise-aware thresholds, status changes, missing reference."""

from __future__ import annotations

import json
from pathlib import Path

from wf_helpers import _record

from reports import nightly as N


def _runs(folder: Path, case: str, tps: list[float], status: str = "ok") -> None:
    for i, t in enumerate(tps):
        p = folder / case / f"rep{i}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(_record("torch", tps=t, status=status)))


def test_threshold_is_max_of_pct_and_sigma():
    assert N.threshold({"median": 100.0, "std": 1.0}, 10, 3) == 0.10
    assert N.threshold({"median": 100.0, "std": 5.0}, 10, 3) == 0.15


def test_compare_flags_slowdown_and_status_change(tmp_path):
    ref_dir, cur_dir = tmp_path / "ref", tmp_path / "cur"
    _runs(ref_dir, "fast", [1000, 1010, 990])
    _runs(ref_dir, "noisy", [1000, 1300, 700])
    _runs(ref_dir, "broke", [500, 500, 500])
    _runs(cur_dir, "fast", [850, 860, 855])  # -14.5% > 10% -> regression
    _runs(cur_dir, "noisy", [800, 810, 790])  # -20%, allowed 3*300/1000 = 90% -> ok
    _runs(cur_dir, "broke", [0, 0, 0], status="error")
    rows = N.compare(N.summarize_runs(cur_dir), N.summarize_runs(ref_dir), 10, 3)
    verdict = {r["case"]: r for r in rows}
    assert verdict["fast"]["regression"] and verdict["fast"]["change"] < -0.1
    assert not verdict["noisy"]["regression"]
    assert verdict["broke"]["regression"] and "now error" in verdict["broke"]["verdict"]
    assert "REGRESSION" in N.format_table(rows)


def test_cli_update_then_compare(tmp_path, capsys):
    runs, ref, out = tmp_path / "runs", tmp_path / "ref.json", tmp_path / "v.json"
    _runs(runs, "torch_gpt-tiny_s128_b2", [1000, 1000, 1001])
    base = [
        "compare",
        "--runs",
        str(runs),
        "--reference",
        str(ref),
        "--hardware-key",
        "cpu-test",
        "--out",
        str(out),
    ]
    assert N.main(base) == N.EXIT_NO_REFERENCE
    assert N.main([*base, "--update"]) == 0 and ref.exists()
    assert N.main(base) == 0
    _runs(runs, "torch_gpt-tiny_s128_b2", [500, 500, 500])
    assert N.main(base) == N.EXIT_REGRESSION
    assert "REGRESSION" in capsys.readouterr().out
