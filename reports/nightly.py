"""Nightly regression check against a stored reference (benchmarks/reference/nightly-<hardware>.json).

    python reports/nightly.py compare --runs DIR --reference REF.json --hardware-key KEY --out VERDICT.json
                                      [--threshold-pct 10] [--sigma 3] [--update]
    python reports/nightly.py microbench --storage DIR --work-dir DIR --out VERDICT.json [--update]

`compare` reads DIR/<case>/rep<i>.json run records (each case run several times), takes per case the
median over the repeats of tokens/s, and compares it with the reference's median. A case regresses
when it is slower by more than max(threshold-pct %, sigma x the std of the reference's repeats / its
median), or when it was ok in the reference and is not now. Prints a table; exits 1 on a regression,
2 when there is no reference for this hardware (--update writes one). `microbench` runs
benchmarks/test_microbench.py under pytest-benchmark, prints pytest-benchmark's own comparison with
the saved baseline, and applies the same noise-aware rule to the per-benchmark medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reports import data as D  # noqa: E402

EXIT_REGRESSION, EXIT_NO_REFERENCE = 1, 2


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "values": values,
        "median": statistics.median(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def summarize_runs(runs_dir: str | Path) -> dict[str, dict[str, Any]]:
    """case -> {status, tokens_per_s stats, step_s stats, errors}: the median over repeats per case."""
    cases: dict[str, dict[str, Any]] = {}
    for case_dir in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir() and any(p.glob("rep*.json"))):
        recs = D.load_records(case_dir)
        ok = [r for r in recs if r.get("status") == "ok" and D.num((r.get("throughput") or {}).get("tokens_per_s"))]
        statuses = sorted({r.get("status", "error") for r in recs})
        cases[case_dir.name] = {
            "status": "ok"
            if ok and len(ok) == len(recs)
            else ("partial" if ok else statuses[0] if statuses else "missing"),
            "repeats": len(recs),
            "tokens_per_s": _stats([float(r["throughput"]["tokens_per_s"]) for r in ok]),
            "step_s": _stats([float(r["timing"]["median_s"]) for r in ok if r.get("timing")]),
            "errors": sorted({D.first_line(r.get("error"), 200) for r in recs if r.get("status") != "ok"}),
        }
    return cases


def threshold(ref: dict[str, Any], threshold_pct: float, sigma: float) -> float:
    """Allowed relative slow-down: max(threshold_pct %, sigma * std / median of the reference)."""
    med, std = ref.get("median"), ref.get("std") or 0.0
    noise = sigma * std / med if med else 0.0
    return max(threshold_pct / 100.0, noise)


def compare(
    current: dict[str, dict], reference: dict[str, dict], threshold_pct: float, sigma: float
) -> list[dict[str, Any]]:
    rows = []
    for case in sorted(set(current) | set(reference)):
        cur, ref = current.get(case), reference.get(case)
        row: dict[str, Any] = {
            "case": case,
            "ref_tokens_per_s": None,
            "tokens_per_s": None,
            "change": None,
            "allowed": None,
            "verdict": "",
        }
        if cur is None:
            row["verdict"] = "MISSING (in the reference, not run now)"
            row["regression"] = False
        elif ref is None:
            row.update(tokens_per_s=cur["tokens_per_s"]["median"], verdict="new (no reference)", regression=False)
        else:
            rm, cm = ref["tokens_per_s"]["median"], cur["tokens_per_s"]["median"]
            row.update(ref_tokens_per_s=rm, tokens_per_s=cm)
            if ref["status"] == "ok" and cur["status"] != "ok":
                row.update(verdict=f"REGRESSION: was ok, now {cur['status']}", regression=True)
            elif rm is None or cm is None:
                row.update(verdict=f"n/a (reference {ref['status']}, now {cur['status']})", regression=False)
            else:
                allowed = threshold(ref["tokens_per_s"], threshold_pct, sigma)
                change = cm / rm - 1.0
                slower = -change > allowed
                row.update(
                    change=change,
                    allowed=allowed,
                    regression=slower,
                    verdict="REGRESSION: slower" if slower else ("faster" if change > allowed else "ok"),
                )
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ["case", "reference tok/s", "now tok/s", "change", "allowed", "verdict"]
    body = [
        [
            r["case"],
            D_fmt(r["ref_tokens_per_s"], ".0f"),
            D_fmt(r["tokens_per_s"], ".0f"),
            "–" if r["change"] is None else f"{100 * r['change']:+.1f}%",
            "–" if r["allowed"] is None else f"-{100 * r['allowed']:.1f}%",
            r["verdict"],
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


def D_fmt(x: Any, spec: str) -> str:  # noqa: N802 - tiny local formatter
    return "–" if x is None else format(x, spec)


def _write(path: str | Path, obj: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def cmd_compare(a: argparse.Namespace) -> int:
    current = summarize_runs(a.runs)
    if a.update:
        ref = {
            "hardware_key": a.hardware_key,
            "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "source": str(a.runs),
            "threshold_pct": a.threshold_pct,
            "sigma": a.sigma,
            "cases": current,
        }
        _write(a.reference, ref)
        print(f"nightly: wrote reference {a.reference} ({len(current)} cases)")
        _write(a.out, {"updated_reference": str(a.reference), "cases": current, "regression": False})
        return 0
    ref_path = Path(a.reference)
    if not ref_path.exists():
        print(
            f"nightly: no reference for hardware {a.hardware_key!r} ({ref_path}).\n"
            "Create it with: snakemake nightly --config nightly_update_reference=true",
            file=sys.stderr,
        )
        return EXIT_NO_REFERENCE
    reference = json.loads(ref_path.read_text())
    rows = compare(current, reference.get("cases", {}), a.threshold_pct, a.sigma)
    print(
        f"nightly vs {ref_path.name} (threshold: slower by more than max({a.threshold_pct:g}%, "
        f"{a.sigma:g} sigma of the reference repeats))"
    )
    print(format_table(rows))
    regressed = [r["case"] for r in rows if r["regression"]]
    verdict = {
        "hardware_key": a.hardware_key,
        "reference": str(ref_path),
        "rows": rows,
        "regression": bool(regressed),
        "regressed": regressed,
    }
    if regressed:
        print(f"nightly: REGRESSION in {', '.join(regressed)}", file=sys.stderr)
        return EXIT_REGRESSION  # no verdict file: Snakemake marks the job (and `snakemake nightly`) failed
    _write(a.out, verdict)
    print("nightly: no regression")
    return 0


# --- microbenchmarks through pytest-benchmark -----------------------------------------------------------
def _pytest(args: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--timeout=600",
        str(ROOT / "benchmarks" / "test_microbench.py"),
        "--benchmark-only",
        *args,
    ]
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def _bench_stats(path: Path) -> dict[str, dict[str, float]]:
    obj = json.loads(path.read_text())
    return {b["name"]: {"median": b["stats"]["median"], "std": b["stats"]["stddev"]} for b in obj.get("benchmarks", [])}


def cmd_microbench(a: argparse.Namespace) -> int:
    storage, work = Path(a.storage), Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    new_json = work / "microbench.json"
    if a.update:
        for old in storage.rglob("*.json") if storage.exists() else []:
            old.unlink()
        rc = _pytest(
            [
                f"--benchmark-storage=file://{storage}",
                "--benchmark-save=reference",
                f"--benchmark-json={new_json}",
            ]
        )
        for saved in storage.rglob("*.json"):  # a checked-in file: no host name in it
            obj = json.loads(saved.read_text())
            if isinstance(obj.get("machine_info"), dict) and "node" in obj["machine_info"]:
                obj["machine_info"]["node"] = "redacted"
                saved.write_text(json.dumps(obj, indent=4) + "\n")
        _write(a.out, {"updated_reference": str(storage), "pytest_returncode": rc, "regression": False})
        return 0 if rc == 0 else rc
    saved = sorted(storage.rglob("*.json")) if storage.exists() else []
    if not saved:
        print(
            f"nightly microbench: no saved pytest-benchmark baseline under {storage}.\n"
            "Create it with: snakemake nightly --config nightly_update_reference=true",
            file=sys.stderr,
        )
        return EXIT_NO_REFERENCE
    # pytest-benchmark's own comparison table (--benchmark-compare: the latest saved run in the storage)
    rc = _pytest(
        [
            f"--benchmark-storage=file://{storage}",
            "--benchmark-compare",
            f"--benchmark-json={new_json}",
            "--benchmark-columns=min,median,stddev,rounds",
        ]
    )
    if rc != 0 or not new_json.exists():
        print(f"nightly microbench: pytest failed ({rc})", file=sys.stderr)
        return rc or 1
    ref, cur = _bench_stats(saved[-1]), _bench_stats(new_json)
    rows = []
    for name in sorted(set(ref) | set(cur)):
        r, c = ref.get(name), cur.get(name)
        if r is None or c is None:
            rows.append(
                {
                    "case": name,
                    "ref_tokens_per_s": None,
                    "tokens_per_s": None,
                    "change": None,
                    "allowed": None,
                    "verdict": "new" if r is None else "MISSING",
                    "regression": False,
                }
            )
            continue
        allowed = max(a.threshold_pct / 100.0, a.sigma * r["std"] / r["median"] if r["median"] else 0.0)
        change = c["median"] / r["median"] - 1.0  # time: positive = slower
        slower = change > allowed
        rows.append(
            {
                "case": name,
                "ref_tokens_per_s": r["median"] * 1e6,
                "tokens_per_s": c["median"] * 1e6,
                "change": -change,
                "allowed": allowed,
                "regression": slower,
                "verdict": "REGRESSION: slower" if slower else "ok",
            }
        )
    print("microbenchmarks (median microseconds; change as speed)")
    print(format_table(rows).replace("tok/s", "us    "))
    regressed = [r["case"] for r in rows if r["regression"]]
    if regressed:
        print(f"nightly microbench: REGRESSION in {', '.join(regressed)}", file=sys.stderr)
        return EXIT_REGRESSION
    _write(a.out, {"baseline": str(saved[-1]), "rows": rows, "regression": False})
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="compare nightly run records with the stored reference")
    c.add_argument("--runs", required=True)
    c.add_argument("--reference", required=True)
    c.add_argument("--hardware-key", required=True)
    c.add_argument("--out", required=True)
    m = sub.add_parser("microbench", help="pytest-benchmark microbenchmarks vs the saved baseline")
    m.add_argument("--storage", required=True)
    m.add_argument("--work-dir", required=True)
    m.add_argument("--out", required=True)
    for q in (c, m):
        q.add_argument("--threshold-pct", type=float, default=10.0)
        q.add_argument("--sigma", type=float, default=3.0)
        q.add_argument("--update", action="store_true", help="write the reference instead of comparing")
    a = p.parse_args(argv)
    return cmd_compare(a) if a.cmd == "compare" else cmd_microbench(a)


if __name__ == "__main__":
    sys.exit(main())
