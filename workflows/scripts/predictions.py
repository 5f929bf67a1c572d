"""Predicted paper figures: superoffload.planner.paper.paper_comparison() rows, the largest model per
system and chip count with the memory that binds it, the memory each point that does not fit overflows
(binding.py), and the preset hardware profile they assume, in one JSON file. Degrades to
{"status": "unavailable"} while the planner part is not installed, so the report shows "not available"
instead of failing."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path


def collect(hardware: str, figures: list[str] | None = None) -> dict:
    out: dict = {"status": "ok", "hardware": hardware, "rows": [], "preset": None, "error": None,
                 "figures": figures}
    try:
        from superoffload.planner.paper import paper_comparison

        out["rows"] = [dict(r) for r in paper_comparison(hardware, figures)]
    except ImportError as e:
        out.update(status="unavailable", error=f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - a failing predictor is a result, not a crash
        out.update(status="error", error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
    try:  # apart from the rows: a failure here leaves the comparison intact and says why
        from binding import does_not_fit, largest_rows

        out["largest"] = largest_rows(hardware)
        out["does_not_fit"] = does_not_fit(out["rows"], hardware)
    except Exception as e:  # noqa: BLE001
        out["largest"], out["does_not_fit"] = [], []
        out["binding_error"] = f"{type(e).__name__}: {e}"
    try:
        from superoffload.planner.presets import get_profile

        out["preset"] = get_profile(hardware).to_dict()
    except Exception as e:  # noqa: BLE001
        out["preset_error"] = f"{type(e).__name__}: {e}"
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--hardware", default="gh200")
    p.add_argument("--figures", default=None,
                   help="comma-separated row groups of superoffload.planner.paper.PAPER_FIGURES (default: all)")
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    figures = None
    if a.figures:
        figures = [f.strip() for f in a.figures.split(",")]
        try:
            from superoffload.planner.paper import check_figures
        except ImportError:  # no planner: collect() records "unavailable"
            pass
        else:
            try:
                check_figures(figures)
            except ValueError as e:
                p.error(f"--figures: {e}")
    data = collect(a.hardware, figures)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    print(f"paper_comparison: {data['status']}, {len(data['rows'])} rows, {len(data['largest'])} largest-model rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
