"""Predicted vs measured: the cost model checked against run records, reported, never tuned.

For every `ok` record of a system the cost model knows, predict the step time on a HardwareProfile
(normally this machine's `superoffload calibrate` output) with the options the run actually used (a
SuperOffload run: its whole engine config, `Options.from_engine_config`), and report the relative
error. The target is ±20 %; a miss is reported, not fitted away.

When the profile holds profiled compute for a run's workload (``calibrate --workloads``), each row has
two predictions: ``predicted_s`` with that measured compute (it checks the transfers, host steps,
overlap and system overheads the cost model adds), and ``op_model_s`` with the op-level compute
terms alone (what a prediction for unmeasured hardware, such as the GH200 preset, rests on).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from superoffload.harness.noise import flags_of
from superoffload.harness.record import load_records, precision_of, world_of, write_json_atomic
from superoffload.options import PRECISIONS
from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.hardware import HardwareProfile
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import SYSTEMS, Options
from superoffload.shapes import get_shape

MODELLED = SYSTEMS  # the systems the cost model compares (superoffload/catalog.py)
TARGET = 0.20


def run_options(rec: dict[str, Any]) -> Options:
    """The cost-model options of the run a record describes: a SuperOffload run's engine config as it
    is (nothing dropped: host kernel, casts, rollback mode, flow layers, ...); a peer's training knobs
    from the run block (the run's dtype is the training precision)."""
    cfg = (rec.get("system_stats") or {}).get("config")
    if rec["system"] == "superoffload" and cfg:
        return Options.from_engine_config(cfg)
    run = rec["run"]
    precision = precision_of(rec)
    return Options(grad_clip=run.get("grad_clip", 0.0), grad_accum=run.get("grad_accum", 1),
                   precision=precision if precision in PRECISIONS else "bf16")


def run_host(rec: dict[str, Any]) -> dict[str, Any]:
    """The workload's ranks and host of the run a record describes: its world size, and the rank's cores (its
    --bind-cores slice, or a share of the CPUs it could use), compute threads and host optimizer threads, where
    the record says them (older records: the profile's defaults)."""
    world = world_of(rec)
    out: dict[str, Any] = {"chips": world}
    where = rec.get("placement") or {}
    cores = where.get("cores")
    if cores:
        out["cores_per_rank"] = len(cores) / (1 if where.get("bound") else world)
    threads = (rec.get("run") or {}).get("threads")
    if threads:
        out["compute_threads"] = int(threads)
    host = ((rec.get("system_stats") or {}).get("config") or {}).get("host_threads")
    if host:
        out["host_threads"] = int(host)
    return out


def compare(records: list[dict[str, Any]], hw: HardwareProfile) -> list[dict[str, Any]]:
    op_model = dataclasses.replace(hw, compute_profiles=None)
    rows = []
    for rec in records:
        if rec.get("status") != "ok" or rec["system"] not in MODELLED:
            continue
        r = rec["run"]
        w = Workload(get_shape(rec["model"]["name"]), r["seq"], r["batch"], r.get("activation_checkpointing", False),
                     precision=precision_of(rec), **run_host(rec))
        opts = run_options(rec)
        pred = predict(rec["system"], w, hw, opts)
        op = pred if not hw.compute_profiles else predict(rec["system"], w, op_model, opts)
        measured = rec["timing"]["median_s"]
        rows.append({"system": rec["system"], "model": rec["model"]["name"], "seq": r["seq"], "batch": r["batch"],
                     "dtype": w.precision, "world": w.chips, "measured_s": measured, "predicted_s": pred.step_time_s,
                     "rel_error": pred.step_time_s / measured - 1.0,
                     "within_target": abs(pred.step_time_s / measured - 1.0) <= TARGET,
                     "compute": pred.options["compute"], "op_model_s": op.step_time_s,
                     "op_model_rel_error": op.step_time_s / measured - 1.0,
                     "noise_flags": flags_of(rec)})
    return rows


def format_rows(rows: list[dict[str, Any]], hw_name: str) -> str:
    lines = [f"predicted on {hw_name} vs measured (target ±{TARGET:.0%}); compute: profiled where the profile "
             "has the workload, else the op-level terms; op-model: op-level terms only",
             f"{'system':16} {'model':10} {'seq':>5} {'batch':>5} {'dtype':5} {'ranks':>5} {'measured ms':>12} "
             f"{'predicted ms':>13} {'error':>8} {'compute':>9} {'op-model ms':>12} {'error':>8}  noise"]
    for r in rows:
        flags = ",".join(r.get("noise_flags") or []) or "-"
        lines.append(f"{r['system']:16} {r['model']:10} {r['seq']:>5} {r['batch']:>5} {r['dtype']:5} "
                     f"{r.get('world', 1):>5} "
                     f"{1e3 * r['measured_s']:>12.2f} {1e3 * r['predicted_s']:>13.2f} {r['rel_error']:>+8.1%} "
                     f"{r['compute']:>9} {1e3 * r['op_model_s']:>12.2f} {r['op_model_rel_error']:>+8.1%}  {flags}")
    inside = sum(r["within_target"] for r in rows)
    op_inside = sum(abs(r["op_model_rel_error"]) <= TARGET for r in rows)
    lines.append(f"{inside}/{len(rows)} within ±{TARGET:.0%} ({op_inside}/{len(rows)} with op-level compute only)")
    noisy = [r for r in rows if r.get("noise_flags")]
    if noisy:
        outside = sum(not r["within_target"] for r in noisy)
        lines.append(f"{len(noisy)} of the measurements come from runs flagged noisy ({outside} of them outside the "
                     "target): their errors are the machine's as much as the model's; rerun them on a quiet "
                     "machine (superoffload/harness/noise.py)")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="cost-model predictions vs measured step times of run records",
                       description=__doc__.strip().splitlines()[0])
    p.add_argument("results_dir", metavar="RESULTS_DIR")
    p.add_argument("--hardware", required=True,
                   help="HardwareProfile: preset name or a `superoffload calibrate` JSON (use this machine's)")
    p.add_argument("--out", default=None, help="write the rows as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    folder = Path(args.results_dir)
    if not folder.is_dir():
        print(f"superoffload validate: error: {folder} is not a folder", file=sys.stderr)
        return 2
    hw = get_profile(args.hardware)
    rows = compare(load_records(folder), hw)
    print(format_rows(rows, hw.name))
    if args.out:
        write_json_atomic(args.out, {"hardware": hw.name, "target": TARGET, "rows": rows})
    return 0
