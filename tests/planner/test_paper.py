"""The paper comparison: shape of the rows, and that the numbers are finite.

Every test of the paper's row groups lives here, so that one test worker computes the costly ones once: the
multi-chip rows (Fig 11 and Fig 13 at 4 and 16 chips; ~43 s on one core) through this module's fixture, and
Fig 12's (~38 s) through superoffload.planner.paper's own cache. Spread over modules, the scheduler could put
them on two workers, each computing them (pytest-xdist --dist loadscope keeps a module on one worker)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from superoffload.planner import paper
from superoffload.planner.hardware import HardwareProfile
from superoffload.planner.paper import format_table, largest_model, multi_chip_rows, paper_comparison
from superoffload.planner.presets import get_profile

ROOT = Path(__file__).resolve().parents[2]
GH = get_profile("gh200")
M1 = 1 << 20


@pytest.fixture(scope="module")
def _gh200_multi_chip_rows() -> list[dict[str, Any]]:
    return multi_chip_rows(GH)


@pytest.fixture
def gh200_multi_chip_rows(_gh200_multi_chip_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """multi_chip_rows(gh200), computed once for this module: a copy per test, so no test sees another's edits."""
    return copy.deepcopy(_gh200_multi_chip_rows)


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
    """The multi-chip rows are the module's (their own test is test_paper_multi_chip_rows), computed once for
    both tests; the rest of the comparison is computed here. The slow twin computes it all."""
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


def test_paper_multi_chip_rows(gh200_multi_chip_rows) -> None:
    rows = gh200_multi_chip_rows
    fig11 = [r for r in rows if r["figure"] == "fig11"]
    assert {r["chips"] for r in fig11} == {4, 16}
    claims = [r for r in fig11 if r["paper"] is not None]
    assert {r["metric"] for r in claims} >= {"superoffload/zero_offload", "superoffload/torch - 1"}
    for r in claims:
        if r["predicted"] is not None:
            assert math.isfinite(r["rel_error"]) and r["paper_status"] == "S"
    sizes = [largest_model("superoffload", GH, c)[1] for c in (1, 4, 16)]
    assert sizes[0] < sizes[1] <= sizes[2]
    assert {r["chips"] for r in rows if r["figure"] == "fig13"} == {4, 16}


def test_fig12_rows() -> None:
    from superoffload.planner.paper import FIG12_SEQS, fig12_rows, fig12_table

    rows = fig12_rows(GH)
    assert {r["chips"] for r in rows} == {4, 8} and {r["figure"] for r in rows} == {"fig12"}
    mfu = [r for r in rows if r["metric"] == "mfu" and r["paper"] is None]
    assert len(mfu) == 2 * 2 * len(FIG12_SEQS)
    labelled = [r for r in rows if r["paper"] is not None]
    assert {(r["metric"], r["paper"], r["paper_status"]) for r in labelled} == {
        ("mfu", 0.55, "V"), ("megatron_formula_mfu", 0.55, "V"), ("superoffload/ulysses", 8.0, "S")}
    for r in labelled:
        assert r["predicted"] is not None and r["rel_error"] is not None
    longest = {(r["chips"], r["point"].split()[-1]): r["predicted"] for r in rows if r["metric"] == "longest_seq"}
    assert longest[(8, "superoffload")] == M1  # the paper's headline point fits
    for chips in (4, 8):
        assert longest[(chips, "superoffload")] >= longest[(chips, "ulysses")]
    assert "| 1,048,576 |" in fig12_table(rows)
