"""The cost model's step for each system at a few named points, on a named hardware profile: what the GPU
comparison (scripts/device_check.sh) prints beside each measured ratio, "predicted for one GH200 at this same
model, sequence and batch".

    python workflows/scripts/point_predictions.py --points W/points.tsv --systems torch,superoffload \\
        --hardware gh200 --out W/results/predictions/gh200_points.json

``--points``: one "role model seq batch" per line (device_check.sh's points.tsv). Every point is predicted
with activation checkpointing, bf16 and gradient clipping at 1.0 (the sweep's settings), one chip, and the
profile's own host (its cores and threads: not the machine this runs on). A point that does not fit the
profile's memory keeps its step time with ``fits`` false. A point the cost model cannot price (an unknown
model, a system it does not model) is a row with ``error``; the file is written whatever happens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's superoffload, installed or not
from superoffload.harness.record import write_json_atomic  # noqa: E402  (torch-free)


def read_points(path: Path) -> list[tuple[str, int, int]]:
    """(model, seq, batch) of each "role model seq batch" line, in order, without repeats."""
    out: list[tuple[str, int, int]] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            point = (parts[1], int(parts[2]), int(parts[3]))
            if point not in out:
                out.append(point)
    return out


def predict_points(points: list[tuple[str, int, int]], systems: list[str], hardware: str) -> dict[str, Any]:
    from superoffload.planner.costmodel import Workload, predict
    from superoffload.planner.presets import get_profile
    from superoffload.planner.systems import Options
    from superoffload.shapes import get_shape

    hw = get_profile(hardware)
    opts = Options(grad_clip=1.0, precision="bf16")
    rows = []
    for model, seq, batch in points:
        for system in systems:
            row: dict[str, Any] = {"system": system, "model": model, "seq": seq, "batch": batch}
            try:
                p = predict(system, Workload(get_shape(model), seq, batch, True, precision="bf16"), hw, opts)
            except (KeyError, ValueError) as e:  # an unknown model or system: this row says so
                rows.append({**row, "error": f"{type(e).__name__}: {e}"})
                continue
            bind = p.binding()
            rows.append({**row, "step_s": p.step_time_s, "tokens_per_s": p.tokens_per_s, "mfu": p.mfu,
                         "fits": p.fits, "binding": bind[0] if bind else None,
                         "peak_hbm_gib": p.peak_hbm_bytes / 2**30, "host_gib": p.host_bytes / 2**30})
    return {"status": "ok", "hardware": hw.name, "settings": "bf16, activation checkpointing, clipping 1.0, "
            "one chip, the profile's host", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", required=True, type=Path, help='"role model seq batch" per line')
    ap.add_argument("--systems", required=True, help="comma-separated systems")
    ap.add_argument("--hardware", default="gh200", help="a planner preset or a `superoffload calibrate` JSON")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    if not a.points.is_file():
        print(f"point_predictions: --points {a.points} is not a file", file=sys.stderr)
        return 2
    try:
        data = predict_points(read_points(a.points), [s for s in a.systems.split(",") if s], a.hardware)
    except Exception as e:  # noqa: BLE001 - a failing predictor is a result the report shows, not a crash
        data = {"status": "error", "hardware": a.hardware, "rows": [], "error": f"{type(e).__name__}: {e}"}
    write_json_atomic(a.out, data)
    n_ok = sum("step_s" in r for r in data["rows"])
    print(f"point_predictions on {data['hardware']}: {data['status']}, {n_ok} of {len(data['rows'])} rows priced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
