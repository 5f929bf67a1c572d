"""Load a results folder (``results/<sweep>/``) into plain Python data, tolerating every missing or
malformed file: a report must render from whatever is there. Run records are read by
superoffload.harness.record (``load_records``, ``sp_of``, ``world_of``, ``precision_of``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from superoffload import catalog
from superoffload.harness import record
from superoffload.harness.record import ResultFileError, parse_result, sp_of, world_of
from superoffload.planner.explain import format_ranges

STATUSES = ("ok", "oom", "error")

# What the report calls each harness system, in the order tables list them (the catalog's: ours first, then
# the peers)
SYSTEM_NAMES = {s.name: s.label for s in catalog.SYSTEMS}


def on_gh200(results: dict) -> bool:
    """The sweep ran on a GH200, the paper's Superchip (by the GPU's catalog record): only there do measured
    numbers speak to the paper's claims."""
    hw = (results.get("sweep") or {}).get("hardware") or {}
    gpu = catalog.gpu_for(hw.get("device_name"))
    return gpu is not None and gpu.name == "GH200"


def system_key(system: str) -> tuple[int, str]:
    order = list(SYSTEM_NAMES)
    return (order.index(system) if system in order else len(order), system)


def model_params(name: str, recorded: float | None = None) -> float | None:
    """One parameter count per model: the zoo shape's (superoffload.shapes), not a run's. A GPT run at a
    sequence longer or shorter than the zoo's position table builds the table to fit the run, so records
    of one model carry several counts; the model's own is the zoo's. A model outside the zoo keeps the
    recorded count."""
    from superoffload.shapes import MODELS

    shape = MODELS.get(name)
    return float(shape.total_params()) if shape is not None else recorded


def read_json(path: Path) -> tuple[Any, str | None]:
    """(data, problem): problem is None when the file was read and parsed."""
    try:
        return json.loads(Path(path).read_text()), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, f"unreadable: {type(e).__name__}: {e}"


def load_records(folder: Path) -> list[dict[str, Any]]:
    """Every run record under ``folder``; a file that is not one stands in as an error row."""
    return record.load_records(folder, keep_broken=True)


def load_optional(path: Path) -> dict[str, Any]:
    """A microbenchmark / calibration / prediction file as {"status", "data", "error"}."""
    obj, problem = read_json(path)
    if problem is not None:
        return {
            "status": "missing" if problem == "missing" else "error",
            "data": None,
            "error": f"{path.name}: {problem}",
            "path": str(path),
        }
    if isinstance(obj, dict) and obj.get("status") in ("error", "unavailable") and "written_by" in obj:
        return {"status": obj["status"], "data": None, "error": obj.get("error"), "path": str(path)}
    if isinstance(obj, dict) and obj.get("status") in ("error", "unavailable"):
        return {"status": obj["status"], "data": obj, "error": obj.get("error"), "path": str(path)}
    return {"status": "ok", "data": obj, "error": None, "path": str(path)}


def load_result(path: Path, kind: str) -> dict[str, Any]:
    """A file with a schema (`bench adam`: kind "adam_bench", `bench cast`: "cast_bench") as
    {"status", "data", "error", "path"}: status "ok" with data that follows the schema; "missing"; "error" /
    "unavailable" when the workflow's guard left a stand-in because the command failed; "invalid" when
    the file does not follow its schema (error says where), so a broken contract is reported, not drawn
    from by guessing."""
    item = load_optional(path)
    if item["status"] != "ok":
        return item
    try:
        item["data"] = parse_result(item["data"], kind, Path(path).name)
    except ResultFileError as e:
        return {"status": "invalid", "data": None, "error": str(e), "path": str(path)}
    return item


def load_results(results: str | Path) -> dict[str, Any]:
    res = Path(results)
    sweep, _ = read_json(res / "sweep.json")
    variants, _ = read_json(res / "ablation" / "variants.json")
    prov, _ = read_json(res / "provenance" / "provenance.json")
    ablation = [r for r in load_records(res / "ablation") if Path(r["_path"]).name != "variants.json"]
    explain = []
    for p in sorted((res / "predictions" / "explain").glob("*.json")):
        item = load_optional(p)
        item["name"] = p.stem
        explain.append(item)
    multi = [r for d in sorted(res.glob("runs_w*")) if d.is_dir() for r in load_records(d)]
    return {
        "dir": str(res),
        "sweep": sweep if isinstance(sweep, dict) else {},
        "runs": load_records(res / "runs"),
        "multi_runs": multi,
        "ablation": ablation,
        "variants": variants if isinstance(variants, dict) else {},
        "adam": load_result(res / "microbench" / "adam.json", "adam_bench"),
        "cast": load_result(res / "microbench" / "cast.json", "cast_bench"),
        "calibration": load_optional(res / "calibration" / "hardware.json"),
        "paper_comparison": load_optional(res / "predictions" / "paper_comparison.json"),
        "validation": load_optional(res / "predictions" / "validation.json"),
        "explain": explain,
        "provenance": prov if isinstance(prov, dict) else {},
    }


# --- record accessors ---------------------------------------------------------------------------------
def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def first_line(s: Any, limit: int = 160) -> str:
    if not s:
        return ""
    line = str(s).strip().splitlines()[0] if str(s).strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def record_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One summary-table row; numbers are None where the record has none (oom / error). ``seq`` is the global
    sequence length; under sequence parallelism (``sp`` > 1) each rank held ``seq / sp`` tokens of it."""
    run = rec.get("run") or {}
    tel = rec.get("telemetry") or {}
    sp = sp_of(rec)
    return {
        "system": rec.get("system", "?"),
        "model": _get(rec, "model", "name") or "?",
        "params": num(_get(rec, "model", "params")),
        "seq": run.get("seq"),
        "sp": sp,
        "local_seq": run.get("local_seq", run["seq"] // sp if isinstance(run.get("seq"), int) else None),
        "batch": run.get("global_batch", run.get("batch")),
        "dtype": record.precision_of(rec),
        "status": rec.get("status", "error") if rec.get("status") in STATUSES else "error",
        "tokens_per_s": num(_get(rec, "throughput", "tokens_per_s")),
        "tflops": num(_get(rec, "throughput", "model_tflops")),
        "mfu": num(_get(rec, "throughput", "mfu")),
        "hfu": num(_get(rec, "throughput", "hfu")),
        "peak_flops_source": _get(rec, "throughput", "peak_flops_source"),
        "step_median_s": num(_get(rec, "timing", "median_s")),
        "step_p10_s": num(_get(rec, "timing", "p10_s")),
        "step_p90_s": num(_get(rec, "timing", "p90_s")),
        "peak_device_bytes": num(_get(rec, "memory", "peak_device_bytes")),
        "peak_host_rss_bytes": num(_get(rec, "memory", "peak_host_rss_bytes")),
        "energy_j_per_step": num(_get(tel, "gpu", "energy_j_per_step")),
        "gpu_util_pct": num(_get(tel, "gpu", "util_pct_mean")),
        "rollbacks": rec.get("rollbacks"),
        # the run record's noise flags (superoffload/harness/noise.py): its numbers are not the code's alone
        "noise_flags": ", ".join((rec.get("noise") or {}).get("flags") or []),
        "error": first_line(rec.get("error")) if rec.get("status") != "ok" else "",
        "path": rec.get("_path", ""),
    }


def multi_rank_rows(records: list[dict[str, Any]], single: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per multi-rank record: throughput per device and aggregate, the same system's one-rank run of
    the same (model, seq, per-rank batch) where the sweep has one, and every rank's host-step time and cores."""
    base = {(r["system"], r["model"], r["seq"], r["batch"]): r for r in map(record_row, single)}
    rows = []
    for rec in records:
        row = record_row(rec)
        run = rec.get("run") or {}
        world = world_of(rec)
        per_rank_batch = run.get("batch")
        # a sequence-parallel run shares each sequence between ranks: no one-rank run is its data-parallel unit
        one = base.get((row["system"], row["model"], row["seq"], per_rank_batch)) if row["sp"] == 1 else None
        agg = num(_get(rec, "throughput", "aggregate_tokens_per_s"))
        ranks = rec.get("ranks") if isinstance(rec.get("ranks"), list) else []
        row.update(
            world=world,
            batch_per_rank=per_rank_batch,
            aggregate_tokens_per_s=agg,
            one_rank_tokens_per_s=one["tokens_per_s"] if one else None,
            # aggregate over world x one rank's: 1.0 = perfect data-parallel scaling on this machine
            scaling=(agg / (world * one["tokens_per_s"])) if (agg and one and one["tokens_per_s"]) else None,
            ranks=[{"rank": r.get("rank"), "cores": _cores(r.get("cores")), "host_threads": r.get("host_threads"),
                    "median_step_s": num(r.get("median_step_s")), "host_step_s": num(r.get("host_step_s")),
                    "host_worker_busy_s": num(r.get("host_worker_busy_s"))} for r in ranks if isinstance(r, dict)],
        )
        rows.append(row)
    return sorted(rows, key=lambda r: (r["world"], r["sp"], *sort_key(r)))


# --- long sequences (the paper's Fig 12; `snakemake seqlen`) -----------------------------------------------
FIG12_PAPER = {"model": "gpt-13b", "seq": 1048576, "chips": 8, "mfu": 0.55, "status": "V",
               "label": "paper: 55% MFU, 13B at 1M tokens on 8 GH200 [V] (abstract, arXiv 2509.21271)"}


def fig12_predictions(paper_comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """The cost model's Fig 12 points (paper_comparison rows ``fig12`` / ``mfu`` per model, sequence, system
    and chip count): {system, model, seq, chips, mfu (None = OOM), note}."""
    rows = (paper_comparison.get("data") or {}).get("rows") or [] if paper_comparison.get("status") == "ok" else []
    out = []
    for r in rows:
        if not isinstance(r, dict) or r.get("figure") != "fig12" or r.get("metric") != "mfu":
            continue
        parts = str(r.get("point", "")).split()
        if len(parts) != 4 or parts[1] != "seq" or not parts[2].isdigit():
            continue
        chips = r.get("chips") if isinstance(r.get("chips"), int) else 1
        out.append({"system": parts[3], "model": parts[0], "seq": int(parts[2]), "chips": chips,
                    "mfu": num(r.get("predicted")), "note": r.get("note", ""), "paper": num(r.get("paper"))})
    # one row per point (the 1M / 8-chip point also has the paper's labelled row: same prediction)
    seen: dict[tuple, dict[str, Any]] = {}
    for row in out:
        seen.setdefault((row["system"], row["model"], row["seq"], row["chips"]), row)
    return list(seen.values())


def seqlen_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every sequence-parallel point of the sweep: measured (its record under runs_w<N>/, any status) or
    predicted (a point needing more chips than available, with the cost model's Fig 12 MFU where the point is
    one of Fig 12's; "OOM" when predicted not to fit; "no prediction" otherwise)."""
    rows: list[dict[str, Any]] = []
    for rec in results.get("multi_runs", []):
        row = record_row(rec)
        if row["sp"] == 1:
            continue
        world = world_of(rec)
        rows.append({**row, "chips": world, "kind": "measured",
                     "aggregate_tokens_per_s": num(_get(rec, "throughput", "aggregate_tokens_per_s")),
                     "note": row["error"]})
    pred = {(p["system"], p["model"], p["seq"], p["chips"]): p
            for p in fig12_predictions(results.get("paper_comparison") or {})}
    for point in (results.get("sweep") or {}).get("predicted_runs") or []:
        if not isinstance(point, dict) or (point.get("sp") or 1) == 1:
            continue
        p = pred.get((point.get("system"), point.get("model"), point.get("seq"), point.get("chips")))
        status = "predicted" if p and p["mfu"] is not None else ("oom" if p else "missing")
        rows.append({"system": point.get("system"), "model": point.get("model"), "seq": point.get("seq"),
                     "sp": point.get("sp"), "local_seq": (point.get("seq") or 0) // (point.get("sp") or 1),
                     "chips": point.get("chips"), "batch": point.get("batch"), "kind": "predicted",
                     "status": status, "mfu": p["mfu"] if p else None, "tokens_per_s": None,
                     "aggregate_tokens_per_s": None, "step_median_s": None,
                     "note": ("OOM (predicted)" if status == "oom" else p["note"]) if p
                     else "no prediction: not a Fig 12 point"})
    return sorted(rows, key=lambda r: (r["model"] or "", r["chips"] or 0, r["system"] or "", r["seq"] or 0,
                                       r["kind"]))


def _cores(cores: Any) -> str:
    """A core list as ranges ("0-71"), for a table cell."""
    if not isinstance(cores, list) or not cores:
        return "–"
    return format_ranges(cores)


def sort_key(row: dict[str, Any]) -> tuple:
    return (row["params"] or 0, row["model"], row["seq"] or 0, row["batch"] or 0, row["system"])


def summary_rows(records: list[dict[str, Any]], baseline: str = "torch") -> list[dict[str, Any]]:
    rows = sorted((record_row(r) for r in records), key=sort_key)
    base = {
        (r["model"], r["seq"], r["batch"], r["dtype"]): r["tokens_per_s"]
        for r in rows
        if r["system"] == baseline and r["tokens_per_s"]
    }
    for r in rows:
        b = base.get((r["model"], r["seq"], r["batch"], r["dtype"]))
        r["speedup"] = r["tokens_per_s"] / b if (b and r["tokens_per_s"]) else None
    return rows


def status_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for r in records:
        s = r.get("status")
        counts[s if s in counts else "error"] += 1
    return counts


def rollback_counts(rec: dict[str, Any]) -> dict[str, float]:
    """Numeric counters of a record's `rollbacks` block (engine-defined keys), flattened one level."""
    out: dict[str, float] = {}
    rb = rec.get("rollbacks")
    if not isinstance(rb, dict):
        return out
    for k, v in rb.items():
        if num(v) is not None:
            out[k] = float(v)
        elif isinstance(v, dict):
            for k2, v2 in v.items():
                if num(v2) is not None:
                    out[f"{k}.{k2}"] = float(v2)
        elif isinstance(v, list) and k.endswith(("steps", "events")):
            out[f"{k} (count)"] = float(len(v))
    return out
