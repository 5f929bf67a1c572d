"""Print the result files of a results folder whose command failed, for Snakemake's --forcerun:

    snakemake all --forcerun $(python workflows/scripts/failed_runs.py results/cpu_smoke)

A failed run is a result, not a failure of the workflow: the guard leaves a valid file (a run record
with status "error" or "oom", or a stand-in {"status": "error", ...} for a microbenchmark, calibration
or prediction), so Snakemake considers the job done and never runs it again by itself. This lists those
files (status in --status, default error,oom); --forcerun re-runs exactly their jobs and what depends on
them (the figures and the report). Nothing is printed, and stderr says so, when nothing failed; then
`--forcerun` with no file forces nothing.

Torch-free and Snakemake-free: it only reads JSON files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STATUSES = ("error", "oom", "unavailable")


def failed(results: Path, statuses: set[str]) -> list[Path]:
    """Result files under ``results`` (one sweep's folder) whose top-level status is in ``statuses``."""
    out = []
    for path in sorted(results.rglob("*.json")):
        if path.name.startswith(".") or "logs" in path.relative_to(results).parts:
            continue
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a broken file is not a record of a failed run; the report shows it
        if isinstance(obj, dict) and obj.get("status") in statuses:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="one sweep's results folder, e.g. results/cpu_smoke")
    ap.add_argument("--status", default="error,oom",
                    help=f"comma-separated statuses to re-run, of {', '.join(STATUSES)} (default error,oom)")
    a = ap.parse_args(argv)
    statuses = {s.strip() for s in a.status.split(",") if s.strip()}
    if not statuses or not statuses <= set(STATUSES):
        ap.error(f"--status takes {', '.join(STATUSES)}; got {a.status!r}")
    if not a.results.is_dir():
        ap.error(f"{a.results} is not a folder (the results of one sweep, e.g. results/cpu_smoke)")
    paths = failed(a.results, statuses)
    print(f"failed_runs.py: {len(paths)} file(s) with status {'/'.join(sorted(statuses))} under {a.results}",
          file=sys.stderr)
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
