"""The paper comparison: shape of the rows, and that the numbers are finite."""

from __future__ import annotations

import math

from superoffload.planner.paper import format_table, paper_comparison


def test_paper_comparison_rows() -> None:
    rows = paper_comparison()
    keys = {"figure", "point", "metric", "predicted", "paper", "paper_status", "rel_error"}
    assert rows and all(keys <= set(r) for r in rows)
    assert {r["paper_status"] for r in rows} <= {"V", "S", "missing"}
    compared = [r for r in rows if r["paper"] is not None and r["predicted"] is not None]
    assert len(compared) >= 8
    for r in compared:
        assert math.isfinite(r["rel_error"])
    figures = {r["figure"] for r in rows}
    assert {"fig10", "fig13", "ablation"} <= figures
    assert "| figure |" in format_table(rows)
