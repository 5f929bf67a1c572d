"""The paper comparison: shape of the rows, and that the numbers are finite."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from superoffload.planner import paper
from superoffload.planner.hardware import HardwareProfile
from superoffload.planner.paper import format_table, paper_comparison

ROOT = Path(__file__).resolve().parents[2]


def _check_rows(rows: list[dict[str, Any]]) -> None:
    keys = {"figure", "point", "metric", "predicted", "paper", "paper_status", "rel_error"}
    assert rows and all(keys <= set(r) for r in rows)
    assert {r["paper_status"] for r in rows} <= {"V", "S", "missing"}
    compared = [r for r in rows if r["paper"] is not None and r["predicted"] is not None]
    assert len(compared) >= 8
    for r in compared:
        assert math.isfinite(r["rel_error"])
    figures = {r["figure"] for r in rows}
    assert {"fig10", "fig11", "fig12", "fig13", "ablation"} <= figures
    assert "| figure |" in format_table(rows)


def test_paper_comparison_rows(monkeypatch, gh200_multi_chip_rows) -> None:
    """The multi-chip rows are the session's (conftest.py; their own test is in test_planner_chips.py), computed
    once for both tests; the rest of the comparison is computed here. The slow twin computes it all."""
    asked: list[str] = []

    def multi_chip_rows(hw: HardwareProfile) -> list[dict[str, Any]]:
        asked.append(hw.name)
        return gh200_multi_chip_rows

    monkeypatch.setattr(paper, "multi_chip_rows", multi_chip_rows)
    rows = paper_comparison()
    assert asked == ["gh200"]
    assert all(any(r is m for r in rows) for m in gh200_multi_chip_rows)  # every multi-chip row is in the table
    _check_rows(rows)
    # a sweep's choice of groups (config predictions.figures) gives exactly those rows of the whole, in order
    some = paper_comparison(figures=["fig13", "ablation", "blog"])
    assert asked == ["gh200"]  # the multi-chip group was not computed
    assert some == [r for r in rows if r["figure"] in ("ablation", "blog fig1")
                    or (r["figure"] == "fig13" and r["chips"] == 1)]


def test_the_paper_figures_are_checked_and_are_the_sweep_configs_choices() -> None:
    import yaml

    with pytest.raises(ValueError, match="choose one or more of fig10, fig13, multi_chip"):
        paper_comparison(figures=["fig11"])
    with pytest.raises(ValueError, match="none"):
        paper_comparison(figures=[])
    schema = yaml.safe_load((ROOT / "workflows" / "schemas" / "config.schema.yaml").read_text())
    predictions = schema["definitions"]["sweep"]["properties"]["predictions"]["properties"]
    assert predictions["figures"]["items"]["enum"] == list(paper.PAPER_FIGURES)


@pytest.mark.slow
def test_paper_comparison_rows_computed_whole() -> None:
    _check_rows(paper_comparison())


def test_the_workflows_predictions_script_refuses_an_unknown_figure_before_any_work(tmp_path) -> None:
    import subprocess
    import sys

    out = tmp_path / "pc.json"
    proc = subprocess.run([sys.executable, str(ROOT / "workflows" / "scripts" / "predictions.py"), "--figures",
                           "fig10,fig11", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--figures: paper figures ['fig11']: choose one or more of fig10" in proc.stderr
    assert not out.exists()
