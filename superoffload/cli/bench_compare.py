"""`superoffload bench compare RESULTS_DIR`: one table over the records in a folder.

Records compare with the baseline of the same (model, seq, global batch, precision, world size, SP degree):
tokens/s, TFLOPS and MFU are per device; a multi-rank record also shows its aggregate tokens/s (a record
without `world_size` ran on one rank, one without `run.sp` with SP 1). Under sequence parallelism `seq` is
the global sequence length and tokens/s count the tokens each device processed (seq / sp of every
sequence); MFU counts attention over the global sequence. Records are read by superoffload.harness.record
(the precision column is the record's ``run.dtype``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from superoffload.harness.noise import OTHERS_BOUND, SPREAD_BOUND, flags_of
from superoffload.harness.record import load_records, precision_of, sp_of, world_of


def config_key(rec: dict[str, Any]) -> tuple:
    r = rec["run"]
    return (rec["model"]["name"], r["seq"], r["global_batch"], precision_of(rec), world_of(rec), sp_of(rec))


def compare_rows(recs: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    base_tps = {config_key(r): r["throughput"]["tokens_per_s"] for r in recs
                if r["system"] == baseline and r["status"] == "ok"}
    rows = []
    for r in sorted(recs, key=lambda r: (config_key(r), r["system"])):
        tp = r.get("throughput") or {}
        mem = r.get("memory") or {}
        tps = tp.get("tokens_per_s")
        b = base_tps.get(config_key(r))
        rows.append({
            "system": r["system"], "model": r["model"]["name"], "seq": r["run"]["seq"],
            "batch": r["run"]["global_batch"], "dtype": precision_of(r), "world": world_of(r), "sp": sp_of(r),
            "status": r["status"], "tokens_per_s": tps,
            "aggregate_tokens_per_s": tp.get("aggregate_tokens_per_s", tps),
            "tflops": tp.get("model_tflops"), "mfu": tp.get("mfu"),
            "hfu": tp.get("hfu"), "peak_device_gib": (mem.get("peak_device_bytes") or 0) / 2**30 or None,
            "peak_rss_gib": (mem.get("peak_host_rss_bytes") or 0) / 2**30 or None,
            "ratio": (tps / b) if (tps and b) else None,
            "p90_over_p10": (r.get("noise") or {}).get("p90_over_p10"),
            "flags": ",".join(flags_of(r)) or None,
        })
    return rows


def format_table(rows: list[dict[str, Any]], baseline: str) -> str:
    cols = [("system", "{}"), ("model", "{}"), ("seq", "{}"), ("batch", "{}"), ("dtype", "{}"), ("world", "{}"),
            ("sp", "{}"), ("status", "{}"), ("tokens_per_s", "{:.0f}"), ("aggregate_tokens_per_s", "{:.0f}"),
            ("tflops", "{:.3f}"), ("mfu", "{:.1%}"),
            ("hfu", "{:.1%}"), ("peak_device_gib", "{:.2f}"), ("peak_rss_gib", "{:.2f}"), ("ratio", "{:.2f}x"),
            ("p90_over_p10", "{:.2f}"), ("flags", "{}")]
    head = [c if c != "ratio" else f"vs {baseline}" for c, _ in cols]
    body = [[("-" if r[c] is None else f.format(r[c])) for c, f in cols] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
    flagged = sum(1 for r in rows if r["flags"])
    if flagged:
        lines.append(f"{flagged} of {len(rows)} runs flagged (spread: p90/p10 > {SPREAD_BOUND}; loaded: other "
                     f"processes used > {OTHERS_BOUND:.0%} of the CPUs during the run): their ratios are not the "
                     "code's alone; rerun them on a quiet machine")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="print one table over the records in a folder",
                       description="Read every run record (*.json) under RESULTS_DIR and print tokens/s, "
                                   "TFLOPS, MFU, HFU, peak memory, the ratio to --baseline, the step spread "
                                   "(p90/p10) and noise flags (superoffload.harness.noise).")
    p.add_argument("results_dir", metavar="RESULTS_DIR")
    p.add_argument("--baseline", default="torch", help="system the ratio column divides by (default torch)")
    p.add_argument("--json", action="store_true", help="print rows as JSON instead of a table")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not Path(args.results_dir).is_dir():
        print(f"superoffload bench compare: error: {args.results_dir!r} is not a folder", file=sys.stderr)
        return 2
    recs = load_records(args.results_dir)
    if not recs:
        print(f"superoffload bench compare: no run records under {args.results_dir}", file=sys.stderr)
        return 1
    rows = compare_rows(recs, args.baseline)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows, args.baseline))
    return 0
