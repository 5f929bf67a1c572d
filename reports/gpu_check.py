"""The GPU comparison's own files (``scripts/device_check.sh``): the sweep description the report reads, the
report, and the few plain files a lent GPU machine sends back, rewritten after every step so that a run cut off
returns what finished.

    python reports/gpu_check.py sweep --work W --mode gpu      # W/results/sweep.json from W/env.json, W/points.tsv
    python reports/gpu_check.py html --work W --mode gpu --out W/results/report.html
    python reports/gpu_check.py pack --work W --out OUT        # OUT/summary.txt, comparison.json, records.tar.gz

``W`` is the check's work folder: ``results/`` in the benchmark workflow's layout (``runs/<system>/<model>_s<seq>_
b<batch>.json``, ``microbench/adam.json``, ``calibration/hardware.json``, ``predictions/``, ``provenance/``), so the
report is the workflow's own (``reports/render.py``); beside it ``env.json`` (superoffload.harness.gpu_identity),
``points.tsv`` (role, model, seq, batch per line: role ``fits`` is the point torch holds, ``offload`` one it may
not), ``steps.tsv`` (every step: section, name, status, seconds used, seconds allowed, note), ``log.txt`` and
``cuda_tests.txt``. The comparison (``comparison.json``, the summary's first table and the report's opening
section) puts every system of a point side by side with SuperOffload's speed over each peer, beside the cost
model's ratio for one GH200 at the same point (``predictions/gh200_points.json``, workflows/scripts/
point_predictions.py), and the goals: at least 0.95x torch where torch fits, and where it may not, at least
1.5x ZeRO-Offload and ahead of FSDP2 CPU offload and DeepSpeed's SuperOffload. The report
(templates/gpu_check.html.j2) opens with that comparison and goes on with the workflow's whole report of the
same results folder (reports/render.py), so it is one self-contained file.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from reports import data as D  # noqa: E402
from reports import formatting as fm  # noqa: E402
from reports import tables as T  # noqa: E402
from superoffload.harness.record import write_json_atomic, write_text_atomic  # noqa: E402

OURS = "superoffload"
# (role, peer, least ratio of SuperOffload's tokens/s over the peer's, strict): the goals
GOALS = [("fits", "torch", 0.95, False), ("offload", "zero_offload", 1.5, False),
         ("offload", "fsdp_offload", 1.0, True), ("offload", "ds_superoffload", 1.0, True)]
# Everything a lent machine sends back (at most 8 files): the report and summary first
OUT_FILES = ("summary.txt", "report.html", "comparison.json", "records.tar.gz", "env.json", "cuda_tests.txt",
             "log.txt")
TAR_MEMBERS = ("results", "points.tsv", "planned.tsv", "steps.tsv", "plan.txt", "cuda_tests.txt", "log.txt", "env.json")
GB = 1e9


def read_points(work: Path) -> list[dict[str, Any]]:
    """points.tsv: one "role model seq batch" per line, in the order they run."""
    out = []
    path = work / "points.tsv"
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            out.append({"role": parts[0], "model": parts[1], "seq": int(parts[2]), "batch": int(parts[3])})
    return out


def read_planned(work: Path) -> dict[tuple, list[str]]:
    """planned.tsv: the sweep's runs, one "model seq batch system" per line: {(model, seq, batch): [system]}."""
    out: dict[tuple, list[str]] = {}
    path = work / "planned.tsv"
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            out.setdefault((parts[0], int(parts[1]), int(parts[2])), []).append(parts[3])
    return out


def read_steps(work: Path) -> list[dict[str, Any]]:
    """steps.tsv: section, name, status, seconds used, seconds allowed, note (tab-separated)."""
    out = []
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.is_file() else []:
        f = line.split("\t")
        if len(f) >= 5:
            out.append({"section": f[0], "name": f[1], "status": f[2], "used_s": _int(f[3]),
                        "allowed_s": _int(f[4]), "note": f[5] if len(f) > 5 else ""})
    return out


def _int(s: str) -> int | None:
    return int(s) if s.strip().lstrip("-").isdigit() else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- sweep.json ------------------------------------------------------------------------------------------
def sweep_info(env: dict[str, Any], points: list[dict[str, Any]], mode: str, steps: int, warmup: int,
               planned: dict[tuple, list[str]]) -> dict[str, Any]:
    """What the report's header reads (reports/context.py): the sweep's name and reason, the hardware."""
    host, gpu = env.get("host") or {}, env.get("gpu") or {}
    link = gpu.get("link") or {}
    detail = ""
    if gpu:
        detail = (f"driver {gpu.get('driver')}, CUDA {gpu.get('cuda_driver')}, "
                  + ("NVLink-C2C" if link.get("kind") == "c2c" else
                     f"PCIe gen{link.get('pcie_gen')} x{link.get('pcie_width')}"))
    rehearsal = mode != "gpu"
    return {
        "sweep": "gpu_check_rehearsal" if rehearsal else "gpu_check",
        "reason": ("scripts/device_check.sh rehearsed on this CPU (REHEARSE=" + mode + "): tiny models stand in "
                   "for gpt-1b and gpt-5b; the numbers test the script, not the systems") if rehearsal else
                  "scripts/device_check.sh on a lent GPU: every peer side by side, bf16, checkpointing, clipping on",
        "hardware": {"device_name": env.get("device_name"), "cpu": host.get("cpu"), "cpu_count": host.get("cores"),
                     "arch": (env.get("provenance") or {}).get("arch"), "detail": detail},
        "settings": {"description": "The GPU comparison: "
                     + "; ".join(f"{p['model']} seq {p['seq']} batch {p['batch']} ({p['role']})" for p in points),
                     "dtype": "bf16"},
        "steps": steps, "warmup": warmup, "launcher": "",
        "runs": [{"system": s, **p} for p in points for s in planned.get((p["model"], p["seq"], p["batch"]), [])],
        "predicted_runs": [],
    }


# --- the comparison --------------------------------------------------------------------------------------
def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def run_summary(rec: dict[str, Any]) -> dict[str, Any]:
    """The comparison's numbers of one record: timing, throughput, memory, telemetry, what ran where."""
    row = D.record_row(rec)
    gpu = _get(rec, "telemetry", "gpu") or {}
    kbps = (lambda k: gpu[k] * 1e3 / GB if isinstance(gpu.get(k), (int, float)) else None)
    prov = rec.get("provenance") or {}
    return {
        "status": row["status"], "error": row["error"], "not_run": rec.get("not_run"),
        "step_ms": _ms(row["step_median_s"]), "p10_ms": _ms(row["step_p10_s"]), "p90_ms": _ms(row["step_p90_s"]),
        "tokens_per_s": row["tokens_per_s"], "mfu": row["mfu"], "tflops": row["tflops"],
        "peak_device_gib": _gib(row["peak_device_bytes"]), "peak_host_rss_gib": _gib(row["peak_host_rss_bytes"]),
        "gpu_util_pct": gpu.get("util_pct_mean"), "power_w": gpu.get("power_w_mean"),
        "gpu_mem_used_gib": _gib(gpu.get("mem_used_bytes_peak")), "sm_clock_mhz": gpu.get("sm_clock_mhz_mean"),
        "pcie_rx_gbps": kbps("pcie_rx_kbps_mean"), "pcie_tx_gbps": kbps("pcie_tx_kbps_mean"),
        "energy_j_per_step": gpu.get("energy_j_per_step"),
        "host_cpu_pct": _get(rec, "telemetry", "host", "cpu_pct_mean"),
        "telemetry_samples": _get(rec, "telemetry", "samples"),
        "noise_flags": row["noise_flags"], "device": prov.get("device"), "init_device": _get(rec, "run", "init_device"),
        "grace_adam": prov.get("grace_adam"), "git_commit": prov.get("git_commit"), "torch": prov.get("torch"),
        "deepspeed": prov.get("deepspeed"), "plan_buckets": _get(rec, "plan", "buckets"),
        "path": os.path.relpath(rec.get("_path", ""), ROOT) if rec.get("_path") else "",
    }


def _ms(s: float | None) -> float | None:
    return None if s is None else 1000.0 * s


def _gib(b: float | None) -> float | None:
    return None if not isinstance(b, (int, float)) else b / 2**30


def gh200_points(results: Path) -> tuple[dict[tuple, dict[str, dict[str, Any]]], str]:
    """{(model, seq, batch): {system: predicted row}} of predictions/gh200_points.json, and "" or why there is
    none."""
    data = _json(results / "predictions" / "gh200_points.json")
    if not isinstance(data, dict) or data.get("status") != "ok":
        why = (data or {}).get("error") if isinstance(data, dict) else None
        return {}, f"GH200 point predictions: {D.first_line(why) if why else 'missing'}"
    out: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in data.get("rows") or []:
        out.setdefault((r.get("model"), r.get("seq"), r.get("batch")), {})[r.get("system")] = r
    return out, ""


def predicted_ratios(pred: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """peer -> {ratio: SuperOffload's predicted tokens/s over the peer's (None where either does not fit or
    was not priced), note}."""
    ours = pred.get(OURS) or {}
    out = {}
    for system, r in pred.items():
        if system == OURS:
            continue
        if "tokens_per_s" not in r or "tokens_per_s" not in ours:
            out[system] = {"ratio": None, "note": D.first_line(r.get("error") or ours.get("error") or "not priced")}
        elif not (r["fits"] and ours["fits"]):
            who = [n for n, x in ((OURS, ours), (system, r)) if not x["fits"]]
            out[system] = {"ratio": None, "note": " and ".join(who) + " would not fit"}
        else:
            out[system] = {"ratio": ours["tokens_per_s"] / r["tokens_per_s"], "note": ""}
    return out


def comparison(work: Path) -> dict[str, Any]:
    """Per point, every system's run and SuperOffload's tokens/s over each peer's, beside the GH200
    prediction of the same ratio; the goals."""
    records = D.load_records(work / "results" / "runs")
    by: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        r = D.record_row(rec)
        by.setdefault((r["model"], r["seq"], r["batch"]), {})[r["system"]] = rec
    predicted, why = gh200_points(work / "results")
    planned = read_planned(work)
    points = []
    for p in read_points(work):
        recs = by.get((p["model"], p["seq"], p["batch"]), {})
        runs = {s: run_summary(recs[s]) for s in sorted(recs, key=D.system_key)}
        ours = (runs.get(OURS) or {}).get("tokens_per_s")
        ratios = {s: ours / r["tokens_per_s"] for s, r in runs.items()
                  if s != OURS and ours and r.get("tokens_per_s")}
        points.append({**p, "planned": planned.get((p["model"], p["seq"], p["batch"]), []), "runs": runs,
                       "ratios": ratios,
                       "gh200": predicted_ratios(predicted.get((p["model"], p["seq"], p["batch"]), {}))})
    return {"kind": "gpu_check_comparison", "commit": os.environ.get("DEVICE_CHECK_COMMIT"), "points": points,
            "goals": goals(points), "gh200_missing": why}


def goals(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal at each point of its role: the ratio, met / not met, or why there is none; and the GH200
    prediction of the same ratio."""
    out = []
    for p in points:
        for role, peer, least, strict in GOALS:
            if p["role"] != role:
                continue
            x = p["ratios"].get(peer)
            if x is not None:
                verdict = "met" if (x > least if strict else x >= least) else "not met"
            else:
                ours, theirs = p["runs"].get(OURS), p["runs"].get(peer)
                verdict = "not measured: " + ("no record" if not ours or not theirs else
                                              f"{OURS} {ours['status']}, {peer} {theirs['status']}")
            gh = (p.get("gh200") or {}).get(peer) or {}
            out.append({"point": f"{p['model']} seq {p['seq']} batch {p['batch']}", "peer": peer,
                        "goal": f"{'>' if strict else '>='} {least:g}x", "ratio": x, "verdict": verdict,
                        "gh200_ratio": gh.get("ratio"), "gh200_note": gh.get("note", "")})
    return out


# --- summary.txt -----------------------------------------------------------------------------------------
def _cell(x: Any, kind: str = "") -> str:
    if x is None or x == "":
        return "-"
    if kind == "pct":
        return f"{100 * x:.1f}%"
    if kind == "f1":
        return f"{x:.1f}"
    if kind == "f2":
        return f"{x:.2f}"
    return fm.sig(x) if isinstance(x, (int, float)) else str(x)


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _x(r: float | None) -> str:
    return f"{r:.2f}x" if r else "-"


def comparison_text(cmp: dict[str, Any]) -> str:
    header = ["point", "system", "status", "step ms", "p10-p90", "tok/s", "MFU", "x ours", "GH200 x", "GPU%", "W",
              "PCIe rx/tx GB/s", "dev GiB", "host GiB", "note"]
    rows = []
    for p in cmp["points"]:
        name = f"{p['model']} s{p['seq']} b{p['batch']}"
        for s, r in p["runs"].items():
            rx, tx = r["pcie_rx_gbps"], r["pcie_tx_gbps"]
            rows.append([name, s, r["status"], _cell(r["step_ms"], "f1"),
                         f"{_cell(r['p10_ms'], 'f1')}-{_cell(r['p90_ms'], 'f1')}", _cell(r["tokens_per_s"]),
                         _cell(r["mfu"], "pct"), _x(p["ratios"].get(s)),
                         _x(((p.get("gh200") or {}).get(s) or {}).get("ratio")), _cell(r["gpu_util_pct"], "f1"),
                         _cell(r["power_w"], "f1"), f"{_cell(rx, 'f2')}/{_cell(tx, 'f2')}",
                         _cell(r["peak_device_gib"], "f2"), _cell(r["peak_host_rss_gib"], "f2"),
                         (r["error"] or r["noise_flags"] or "")[:110]])
        if not p["runs"]:
            rows.append([name, "-", "no records", *["-"] * 11, ""])
    goal_rows = [[g["point"], f"SuperOffload / {g['peer']}", g["goal"], _x(g["ratio"]), g["verdict"],
                  _x(g["gh200_ratio"]) if g["gh200_ratio"] else (g["gh200_note"] or "-")] for g in cmp["goals"]]
    gh200 = f" ({cmp['gh200_missing']})" if cmp.get("gh200_missing") else ""
    return ("x ours = SuperOffload's tokens/s over this system's at the same point, measured here; GH200 x = the "
            f"same ratio predicted by the cost model for one GH200{gh200}\n" + table(header, rows)
            + "\n\nGoals\n" + table(["point", "ratio", "goal", "measured", "verdict", "GH200 predicted"], goal_rows))


def steps_text(steps: list[dict[str, Any]]) -> str:
    rows = [[s["section"], s["name"], s["status"], _cell(s["used_s"]), _cell(s["allowed_s"]), s["note"][:100]]
            for s in steps]
    return table(["section", "step", "status", "used s", "allowed s", "note"], rows)


def launch_costs(results: Path) -> tuple[str, list[tuple[str, str]]]:
    """benchmarks/launch_costs.py's result: (its status line, its top-level numbers and words as (key, text))."""
    data = _json(results / "microbench" / "launch_costs.json")
    if not isinstance(data, dict):
        return "launch counters: no result", []
    status = data.get("status", "ok")
    if status != "ok" and not any(isinstance(v, (int, float)) for v in data.values()):
        return f"launch counters: {status}: {D.first_line(data.get('error'))}", []
    flat = [(k, fm.text(v)) for k, v in data.items() if isinstance(v, (int, float, str)) and k != "status"]
    return f"launch counters: {status}, {len(flat)} top-level values (the whole file is in records.tar.gz)", flat


def adam_text(results: Path) -> str:
    """Host Adam GB/s (28 B/param) per kernel and thread count, from bench adam's file."""
    item = D.load_result(results / "microbench" / "adam.json", "adam_bench")
    if item["status"] != "ok":
        return f"host Adam: {item['status']}: {D.first_line(item.get('error'))}"
    kernels = ("grace_adam", "torch_fused", "torch_foreach", "deepspeed_cpu_adam", "roofline_stream7")
    rows = []
    for m in item["data"]["measurements"]:
        ks = m.get("kernels") or {}
        rows.append([str(m.get("numel")), str(m.get("threads"))]
                    + [_cell((ks.get(k) or {}).get("gb_per_s"), "f1") for k in kernels])
        rows[-1].append("; ".join(f"{k}: {v}"[:80] for k, v in (m.get("skipped") or {}).items()))
    return "host Adam, GB/s at 28 B/param\n" + table(["numel", "threads", *kernels, "skipped"], rows)


def validation_text(results: Path) -> str:
    data = _json(results / "predictions" / "validation.json")
    rows = data.get("rows") if isinstance(data, dict) else data if isinstance(data, list) else None
    if not isinstance(rows, list):
        return "cost model validation: " + (D.first_line((data or {}).get("error")) if isinstance(data, dict)
                                            else "no result")
    out = [[str(r.get("system")), f"{r.get('model')} s{r.get('seq')} b{r.get('batch')}",
            _cell(_ms(r.get("measured_s")), "f1"), _cell(_ms(r.get("predicted_s")), "f1"),
            _cell(r.get("rel_error"), "pct")] for r in rows if isinstance(r, dict)]
    inside = sum(bool(r.get("within_target")) for r in rows if isinstance(r, dict))
    return (f"cost model validation on {data.get('hardware')}: {inside} of {len(out)} runs within "
            f"+-{100 * (data.get('target') or 0.2):.0f}%\n"
            + table(["system", "point", "measured ms", "predicted ms", "error"], out))


def _launch_text(results: Path) -> str:
    line, values = launch_costs(results)
    return "\n".join([line, *(f"  {k}: {v}" for k, v in values[:20])])


def summary(work: Path, mode: str) -> str:
    env = _json(work / "env.json") or {}
    parts = [f"GPU comparison (scripts/device_check.sh, mode {mode}), commit "
             f"{os.environ.get('DEVICE_CHECK_COMMIT') or (env.get('provenance') or {}).get('git_commit') or '?'}",
             env.get("line") or "environment: not read yet",
             comparison_text(comparison(work)), steps_text(read_steps(work)), adam_text(work / "results"),
             _launch_text(work / "results"), validation_text(work / "results")]
    plan = work / "plan.txt"
    if plan.is_file():
        parts.insert(2, plan.read_text().rstrip())
    cuda = work / "cuda_tests.txt"
    if cuda.is_file():
        parts.append("CUDA tests (last lines)\n" + "\n".join(cuda.read_text(errors="replace").splitlines()[-6:]))
    return "\n\n".join(parts) + "\n"


# --- report.html -------------------------------------------------------------------------------------------
PEER_COLUMNS = [
    T.Column("point", "point", left=True, key_column=True),
    T.Column("peer", "SuperOffload against", left=True, key_column=True),
    T.Column("ours", "SuperOffload tokens/s", fm.sig), T.Column("theirs", "peer tokens/s", fm.sig),
    T.Column("measured", "measured here", left=True, title="SuperOffload's tokens/s over the peer's at this point"),
    T.Column("goal", "goal"), T.Column("verdict", "verdict", left=True),
    T.Column("gh200", "predicted, one GH200, same point", left=True,
             title="the cost model's SuperOffload tokens/s over the peer's on the GH200 preset, at this point"),
]
RUN_COLUMNS = [
    T.Column("point", "point", left=True, key_column=True), T.Column("system", "system", left=True, key_column=True),
    T.Column("status", "status", badge=True), T.Column("step_ms", "step ms", fm.sig),
    T.Column("spread", "p10–p90 ms", left=True), T.Column("tokens_per_s", "tokens/s", fm.sig),
    T.Column("mfu", "MFU", fm.pct), T.Column("x_ours", "SuperOffload / this", fm.ratio),
    T.Column("gpu_util_pct", "GPU util %", fm.sig), T.Column("power_w", "power W", fm.sig),
    T.Column("gpu_mem_used_gib", "GPU mem GiB (NVML)", fm.sig), T.Column("pcie", "PCIe rx/tx GB/s", left=True),
    T.Column("energy_j_per_step", "J/step", fm.sig), T.Column("host_cpu_pct", "host CPU %", fm.sig),
    T.Column("peak_host_rss_gib", "host RSS GiB", fm.sig), T.Column("device", "device", left=True),
    T.Column("init_device", "weights drawn on", left=True), T.Column("note", "note", left=True),
]
STEP_COLUMNS = [T.Column("section", "section", left=True, key_column=True),
                T.Column("name", "step", left=True, key_column=True), T.Column("status", "status", left=True),
                T.Column("used_s", "used s"), T.Column("allowed_s", "allowed s"), T.Column("note", "note", left=True)]


def _no_ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None, peer: str, planned: list[str]) -> str:
    """Why a point has no measured ratio: "torch: infeasible by design (not run)", "superoffload: not run"
    (planned, but no time was left for it)."""
    parts = []
    for name, r in ((OURS, ours), (peer, theirs)):
        if r is None and name in planned:
            parts.append(f"{name}: not run")
        elif r is None:
            parts.append(f"{name}: not in the sweep at this point")
        elif r["status"] != "ok":
            parts.append(f"{name}: " + ("infeasible by design (not run)" if r.get("not_run") else r["status"]))
    return "; ".join(parts)


def peer_rows(cmp: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per point and peer the sweep planned or ran: both throughputs, the measured ratio (or why there
    is none), the goal and its verdict, and the GH200 prediction of the same ratio."""
    goal_of = {(g["point"], g["peer"]): g for g in cmp["goals"]}
    rows = []
    for p in cmp["points"]:
        point = f"{p['model']} seq {p['seq']} batch {p['batch']}"
        ours = p["runs"].get(OURS)
        for peer in sorted((set(p["planned"]) | set(p["runs"])) - {OURS}, key=D.system_key):
            theirs, g, gh = p["runs"].get(peer), goal_of.get((point, peer), {}), p["gh200"].get(peer) or {}
            x = p["ratios"].get(peer)
            rows.append({"point": point, "peer": D.SYSTEM_NAMES.get(peer, peer),
                         "ours": (ours or {}).get("tokens_per_s"), "theirs": (theirs or {}).get("tokens_per_s"),
                         "measured": fm.ratio(x) if x else _no_ratio(ours, theirs, peer, p["planned"]),
                         "goal": g.get("goal"), "verdict": g.get("verdict"),
                         "gh200": fm.ratio(gh["ratio"]) if gh.get("ratio") else gh.get("note")})
    return rows


def run_rows(cmp: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for p in cmp["points"]:
        for s, r in p["runs"].items():
            rx, tx = r["pcie_rx_gbps"], r["pcie_tx_gbps"]
            rows.append({**r, "point": f"{p['model']} s{p['seq']} b{p['batch']}", "system": D.SYSTEM_NAMES.get(s, s),
                         "spread": f"{fm.sig(r['p10_ms'])}–{fm.sig(r['p90_ms'])}" if r["p10_ms"] else "",
                         "x_ours": p["ratios"].get(s), "pcie": f"{fm.sig(rx)} / {fm.sig(tx)}" if rx or tx else "",
                         "note": r["error"] or r["noise_flags"]})
    return rows


def html_context(work: Path, mode: str) -> dict[str, Any]:
    """The report's opening section (templates/gpu_check.html.j2's ``gpu_check``)."""
    cmp = comparison(work)
    env = _json(work / "env.json") or {}
    host, torch_v = env.get("host") or {}, env.get("torch") or {}
    launch_line, launch_values = launch_costs(work / "results")
    return {
        "title": f"GPU comparison on {env.get('device_name') or 'a machine not yet identified'}",
        "rehearsal": "" if mode == "gpu" else (
            f"A rehearsal on this CPU (REHEARSE={mode}): tiny models stand in for gpt-1b and gpt-5b, SuperOffload "
            "runs on the simulated device and the peers on the CPU. The numbers test the script, not the systems."),
        "identity": [("device", env.get("line") or "not read"),
                     ("host", f"{host.get('cpu')}, {host.get('cores')} cores, {host.get('memory_total_mib')} MiB"),
                     ("torch", f"{torch_v.get('version')} (CUDA {torch_v.get('cuda')})"),
                     ("commit", cmp.get("commit") or "unknown"), ("mode", mode)],
        "peers": T.build(peer_rows(cmp), PEER_COLUMNS, keep_empty_rows=True),
        "runs": T.build(run_rows(cmp), RUN_COLUMNS, keep_empty_rows=True,
                        row_class=lambda r: r["status"] if r["status"] in ("oom", "error") else ""),
        "steps": T.build(read_steps(work), STEP_COLUMNS, keep_empty_rows=True),
        "launch": {"line": launch_line, "numbers": launch_values},
        "gh200_missing": cmp["gh200_missing"],
    }


def render_html(work: Path, mode: str, out: Path) -> Path:
    """report.html: the comparison first, then the workflow's report of the same results, one file."""
    from reports import render

    results = D.load_results(work / "results")
    figdir = work / "results" / "figures"
    figs = {p.stem: p for p in sorted(figdir.glob("*.svg"))} if figdir.is_dir() else {}
    ctx = {**render.build_context(results, figs), "gpu_check": html_context(work, mode)}
    write_text_atomic(out, render.environment().get_template("gpu_check.html.j2").render(**ctx))
    return out


# --- what goes back ---------------------------------------------------------------------------------------
def _tarball(work: Path, dest: Path) -> None:
    """Every record, log and result file of the work folder, as one gzip tarball written atomically."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for name in TAR_MEMBERS:
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=_no_temp)
    tmp = dest.with_name(dest.name + ".part")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, dest)


def _no_temp(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    base = Path(info.name).name
    return None if base.startswith(".") or base.endswith((".claim", ".part")) else info


def pack(work: Path, out: Path, mode: str) -> list[Path]:
    """Write OUT's files from the work folder (each atomically): the summary, the comparison, the tarball, and
    copies of env.json, cuda_tests.txt, log.txt and report.html where they exist. Returns what OUT holds."""
    out.mkdir(parents=True, exist_ok=True)
    cmp = comparison(work)
    write_json_atomic(out / "comparison.json", {**cmp, "mode": mode, "steps": read_steps(work),
                                                "env": _json(work / "env.json")})
    write_text_atomic(out / "summary.txt", summary(work, mode))
    _tarball(work, out / "records.tar.gz")
    for name, src in (("env.json", work / "env.json"), ("cuda_tests.txt", work / "cuda_tests.txt"),
                      ("log.txt", work / "log.txt"), ("report.html", work / "results" / "report.html")):
        if src.is_file():
            tmp = out / f"{name}.part"
            shutil.copyfile(src, tmp)
            os.replace(tmp, out / name)
    return sorted(p for p in out.iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sw = sub.add_parser("sweep", help="write WORK/results/sweep.json")
    sw.add_argument("--work", required=True, type=Path)
    sw.add_argument("--mode", required=True, choices=("gpu", "1", "short"))
    sw.add_argument("--steps", required=True, type=int)
    sw.add_argument("--warmup", required=True, type=int)
    ht = sub.add_parser("html", help="write the report (the comparison, then the workflow's report)")
    ht.add_argument("--work", required=True, type=Path)
    ht.add_argument("--mode", required=True, choices=("gpu", "1", "short"))
    ht.add_argument("--out", required=True, type=Path)
    pk = sub.add_parser("pack", help="write OUT's files from WORK")
    pk.add_argument("--work", required=True, type=Path)
    pk.add_argument("--out", required=True, type=Path)
    pk.add_argument("--mode", required=True, choices=("gpu", "1", "short"))
    a = ap.parse_args(argv)
    if a.cmd == "sweep":
        info = sweep_info(_json(a.work / "env.json") or {}, read_points(a.work), a.mode, a.steps, a.warmup,
                          read_planned(a.work))
        write_json_atomic(a.work / "results" / "sweep.json", info)
        return 0
    if a.cmd == "html":
        print(f"wrote {render_html(a.work, a.mode, a.out)}")
        return 0
    files = pack(a.work, a.out, a.mode)
    extra = [p.name for p in files if p.name not in OUT_FILES]
    print(f"packed {len(files)} files into {a.out}" + (f" (not ours: {', '.join(extra)})" if extra else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
