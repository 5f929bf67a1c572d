"""The report's content, section by section, as the template shows it: the headline first (reports.headline),
then the evidence: every table built by reports.tables (only rows and columns with data, with a count of
what was left out), every number formatted by reports.formatting, every figure placed in the section it
belongs to. The template (templates/report.html.j2) only lays this out."""

from __future__ import annotations

import base64
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from reports import data as D
from reports import figures as F
from reports import formatting as fm
from reports import headline as H
from reports import paper as P
from reports import readable as RD
from reports import tables as T

# (id, title) of each section, in order: the table of contents
SECTIONS = [
    ("headline", "Headline"),
    ("run", "This run"),
    ("runs", "Measured runs"),
    ("ranks", "Several ranks"),
    ("seqlen", "Long sequences: Ulysses sequence parallelism"),
    ("ablation", "Ablation"),
    ("micro", "Microbenchmarks and calibration"),
    ("telemetry", "Utilization and rollbacks"),
    ("convergence", "Convergence"),
    ("validation", "Cost model vs measurement"),
    ("predictions", "The paper's figures, predicted for GH200"),
    ("environment", "Environment"),
    ("method", "Method"),
]
# The section each figure is shown in
FIGURE_SECTION = {
    "largest_model": "headline", "paper_comparison": "headline", "throughput_vs_size": "runs", "mfu_vs_seq": "runs",
    "scaling": "ranks", "seqlen": "seqlen", "ablation": "ablation", "graceadam": "micro", "cast": "micro",
    "link_bandwidth": "micro", "utilization": "telemetry", "rollbacks": "telemetry", "convergence": "convergence",
}
OPEN_ROWS = 12  # a section whose table has more rows than this starts collapsed

STATUS_CLASS = {"ok": "ok", "oom": "oom", "error": "error", "missing": "missing"}


# --- figures -------------------------------------------------------------------------------------------
def figure_items(results: dict, figure_files: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    """section -> its figures: {name, title, caption, uri} or, for a figure with no data at all,
    {name, title, empty: the one line that says how to fill it} instead of an image of empty axes."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, (_, caption) in F.FIGURES.items():
        path = figure_files.get(name)
        svg = path.read_bytes() if path and path.exists() else None
        measured = F.CAPTIONS[name](results) if name in F.CAPTIONS else ""
        item = {"name": name, "title": F.title(name, results), "caption": f"{caption} {measured}".strip(),
                "uri": None, "empty": None}
        if svg is None:
            item["empty"] = "not rendered (run `snakemake report`)."
        elif (note := F.empty_note(svg)) is not None:
            item["empty"] = note
        else:
            item["uri"] = "data:image/svg+xml;base64," + base64.b64encode(svg).decode()
        out[FIGURE_SECTION.get(name, "telemetry")].append(item)
    return out


# --- measured runs -------------------------------------------------------------------------------------
def _note(r: dict[str, Any]) -> str:
    parts = [f"noisy run ({r['noise_flags']})"] if r.get("noise_flags") else []
    if r.get("error"):
        parts.append(r["error"])
    return "; ".join(parts)


def _spread(r: dict[str, Any]) -> str | None:
    """"120 (113–138)": the median step in ms with its p10-p90 spread, one column for both."""
    if r.get("step_median_s") is None:
        return None
    if r.get("step_p10_s") is None:
        return fm.ms(r["step_median_s"])
    return f"{fm.ms(r['step_median_s'])} ({fm.ms(r['step_p10_s'])}–{fm.ms(r['step_p90_s'])})"


SUMMARY_COLUMNS = [
    T.Column("system", "system", left=True, key_column=True),
    T.Column("model", "model", left=True, key_column=True),
    T.Column("model_params", "params", fm.params, key_column=True, title="the model's parameter count (zoo)"),
    T.Column("seq", "seq", key_column=True), T.Column("batch", "batch", key_column=True),
    T.Column("dtype", "dtype", key_column=True),
    T.Column("status", "status", badge=True),
    T.Column("tokens_per_s", "tokens/s", fm.sig), T.Column("tflops", "TFLOPS", fm.sig),
    T.Column("mfu", "MFU", fm.pct), T.Column("hfu", "HFU", fm.pct),
    T.Column("spread", "step ms (p10–p90)"), T.Column("peak_device_bytes", "peak device", fm.nbytes),
    T.Column("peak_host_rss_bytes", "host RSS", fm.nbytes),
    T.Column("energy_j_per_step", "J/step", fm.sig), T.Column("speedup", "vs torch", fm.ratio),
    T.Column("note", "note", left=True),
]


def _with_params(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for r in rows:
        r["model_params"] = D.model_params(r["model"], r["params"])
        r["spread"] = _spread(r)
        r["note"] = _note(r)
    return rows


def summary_table(rows: list[dict[str, Any]]) -> T.Table:
    return T.build(_with_params(rows), SUMMARY_COLUMNS, row_class=lambda r: STATUS_CLASS.get(r["status"], ""),
                   keep_empty_rows=True)


MULTI_COLUMNS = [
    T.Column("system", "system", left=True, key_column=True), T.Column("model", "model", left=True, key_column=True),
    T.Column("seq", "seq", key_column=True), T.Column("batch_per_rank", "batch/rank", key_column=True),
    T.Column("world", "ranks", key_column=True), T.Column("sp", "SP", key_column=True),
    T.Column("status", "status", badge=True),
    T.Column("tokens_per_s", "tokens/s per device", fm.sig),
    T.Column("aggregate_tokens_per_s", "aggregate tokens/s", fm.sig),
    T.Column("one_rank_tokens_per_s", "1 rank tokens/s", fm.sig), T.Column("scaling", "scaling", fm.sig),
    T.Column("mfu", "MFU/device", fm.pct), T.Column("spread", "step ms (p10–p90)"),
    T.Column("per_rank", "per rank: cores, host threads, step ms, host step",
                                                left=True),
    T.Column("note", "note", left=True),
]


def _per_rank(r: dict[str, Any]) -> str:
    return "; ".join(f"{k['rank']}: cores {k['cores']}, {fm.text(k['host_threads'])} thr, "
                     f"{fm.ms(k['median_step_s'])} ms, "
                     f"{RD.seconds(k['host_step_s'])}" for k in r.get("ranks") or [])


def multi_table(rows: list[dict[str, Any]]) -> T.Table:
    for r in _with_params(rows):
        r["per_rank"] = _per_rank(r)
    return T.build(rows, MULTI_COLUMNS, row_class=lambda r: STATUS_CLASS.get(r["status"], ""), keep_empty_rows=True)


SEQLEN_COLUMNS = [
    T.Column("system", "system", left=True, key_column=True), T.Column("model", "model", left=True, key_column=True),
    T.Column("chips", "chips", key_column=True), T.Column("sp", "SP", key_column=True),
    T.Column("seq", "seq", key_column=True), T.Column("local_seq", "seq/rank", key_column=True),
    T.Column("kind", "kind", left=True, key_column=True), T.Column("status", "status", badge=True),
    T.Column("mfu", "MFU/device", fm.pct), T.Column("tokens_per_s", "tokens/s per device", fm.sig),
    T.Column("aggregate_tokens_per_s", "aggregate tokens/s", fm.sig), T.Column("step_median_s", "step ms", fm.ms),
    T.Column("note", "note", left=True),
]


def seqlen_table(rows: list[dict[str, Any]], dnf: dict | None = None) -> T.Table:
    """The sequence-parallel points; a predicted point that does not fit says which memory it overflows, in
    a neutral row (it is infeasible by design, not a failed run)."""
    shown = []
    for r in rows:
        if r["kind"] == "predicted" and r["status"] == "oom":
            b = (dnf or {}).get(("fig12", f"{r['model']} seq {r['seq']} {r['system']}", r["chips"]))
            r = {**r, "status": does_not_fit_cell(b)[0]}
        shown.append(r)
    return T.build(shown, SEQLEN_COLUMNS, row_class=lambda r: STATUS_CLASS.get(r["status"], ""),
                   keep_empty_rows=True)


# --- predictions -----------------------------------------------------------------------------------------
def _does_not_fit(results: dict) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(figure, point, chips) -> the memory that point overflows (predictions file, workflows/scripts/binding.py)."""
    data = results["paper_comparison"].get("data") or {}
    return {(d["figure"], d["point"], d.get("chips") or 1): d.get("binding") or {}
            for d in data.get("does_not_fit") or [] if isinstance(d, dict) and d.get("figure")}


def tflops_grid(pc_rows: list[dict[str, Any]], figure: str, chips: int, dnf: dict) -> T.Table:
    """A Fig 10 / Fig 11 figure as model x system: predicted model TFLOPS per chip, or why it does not fit."""
    grid: dict[str, dict[str, Any]] = {}
    systems: list[str] = []
    for r in pc_rows:
        if r.get("figure") != figure or r.get("metric") != "model_tflops" or (r.get("chips") or 1) != chips:
            continue
        model, _, system = str(r.get("point", "")).partition(" ")
        if system not in systems:
            systems.append(system)
        cell = grid.setdefault(model, {"model": model, "params": D.model_params(model)})
        v = D.num(r.get("predicted"))
        if v is not None:
            cell[system] = fm.sig(v)
        else:
            cell[system], cell[f"title:{system}"] = does_not_fit_cell(dnf.get((figure, r["point"], chips)))
    cols = [T.Column("model", "model", left=True, key_column=True),
            T.Column("params", "params", fm.params, key_column=True)]
    cols += [T.Column(s, H.system_name(s)) for s in sorted(systems, key=D.system_key)]
    return T.build(list(grid.values()), cols, titles=_cell_title)


def _cell_title(row: dict[str, Any], key: str) -> str:
    return row.get(f"title:{key}", "")


def does_not_fit_cell(b: dict[str, Any] | None) -> tuple[str, str]:
    """A grid cell for a point predicted not to fit: ("does not fit: host", "host memory: 489 GB of 480 GB")."""
    if not b or b.get("memory") in (None, "none", "?"):
        return "does not fit", ""
    return (f"does not fit: {b['memory']}",
            f"{b['memory']} memory: needs {fm.nbytes(b.get('need_bytes'))} of {fm.nbytes(b.get('capacity_bytes'))}")


def fig12_grid(pc_rows: list[dict[str, Any]], dnf: dict) -> T.Table:
    """Fig 12 as sequence length x (chips, system): predicted MFU per chip, or why it does not fit."""
    grid: dict[int, dict[str, Any]] = {}
    keys: list[tuple[int, str]] = []
    for r in pc_rows:
        parts = str(r.get("point", "")).split()
        if r.get("figure") != "fig12" or r.get("metric") != "mfu" or r.get("paper") is not None or len(parts) != 4:
            continue
        chips, seq, system = r.get("chips") or 1, int(parts[2]), parts[3]
        if (chips, system) not in keys:
            keys.append((chips, system))
        v = D.num(r.get("predicted"))
        cell, key = grid.setdefault(seq, {"seq": seq}), f"{chips}:{system}"
        if v is not None:
            cell[key] = fm.pct(v)
        else:
            cell[key], cell[f"title:{key}"] = does_not_fit_cell(dnf.get(("fig12", r["point"], chips)))
    cols = [T.Column("seq", "sequence", key_column=True)]
    cols += [T.Column(f"{c}:{s}", f"{H.system_name(s)}, {c} GH200")
             for c, s in sorted(keys, key=lambda k: (k[0], D.system_key(k[1])))]
    return T.build([grid[s] for s in sorted(grid)], cols, titles=_cell_title)


def predictions(results: dict, pc_rows: list[dict[str, Any]]) -> dict[str, Any]:
    dnf = _does_not_fit(results)
    grids = [{"title": "Fig 10: model TFLOPS per chip on one GH200 (seq 1024, batch 8)",
              "table": tflops_grid(pc_rows, "fig10", 1, dnf)}]
    for chips in sorted({r.get("chips") for r in pc_rows if r.get("figure") == "fig11" and r.get("chips")}):
        grids.append({"title": f"Fig 11: model TFLOPS per chip on {chips} GH200",
                      "table": tflops_grid(pc_rows, "fig11", chips, dnf)})
    grids.append({"title": "Fig 12: MFU per chip with Ulysses sequence parallelism (gpt-13b, micro-batch 1)",
                  "table": fig12_grid(pc_rows, dnf)})
    return {"grids": [g for g in grids if g["table"].rows]}


# --- explain plans ---------------------------------------------------------------------------------------
INFEASIBLE = re.compile(r"(host|device) memory needs [0-9.e+]+ bytes \(([^,)]+)[^)]*\) but .*?(?:has|budget is) "
                        r"[0-9.e+]+ bytes \(([^)]+)\)")


def infeasible_text(error: str) -> str | None:
    """"does not fit: host memory (489.0 GB of 480.0 GB)" from a planner's infeasible message, else None."""
    m = INFEASIBLE.search(error or "")
    if not m:
        return "does not fit" if "infeasible" in (error or "") else None
    return f"does not fit: {m[1]} memory ({m[2]} of {m[3]})"


def explain_section(items: list[dict[str, Any]]) -> dict[str, Any]:
    rows, reasons = [], []
    for e in items:
        plan = (e.get("data") or {}).get("plan") if e["status"] == "ok" else None
        if isinstance(plan, dict):
            row = RD.plan_row(e["name"], plan)
            reasons.append({"point": row["point"], "reasons": row.pop("reasons")})
        else:
            full = e.get("error") or ""
            dnf = infeasible_text(full)
            row = {"point": e["name"].replace("_s", " seq ").replace("_b", " batch "),
                   "status": dnf or e["status"], "choices": "" if dnf else D.first_line(full, 200)}
        rows.append(row)
    return {"table": T.build(rows, RD.PLAN_COLUMNS, keep_empty_rows=True), "reasons": reasons}


# --- rows of the ablation, the validation, and our measured value for a paper row ---------------------------
def ablation_rows(results: dict) -> list[dict]:
    variants = (results["variants"] or {}).get("variants") or {}
    by_name = {Path(r["_path"]).stem: D.record_row(r) for r in results["ablation"]}
    rows = []
    for name, v in sorted(variants.items(), key=lambda kv: (kv[1]["kind"], kv[1].get("step") or 0, kv[0])):
        r = by_name.get(name)
        rows.append(
            {
                "name": name,
                "kind": v["kind"],
                "technique": v.get("technique") or "",
                "options": ", ".join(f"{k}={val}" for k, val in sorted(v["options"].items())),
                "status": r["status"] if r else "missing",
                "tokens_per_s": r["tokens_per_s"] if r else None,
                "error": r["error"] if r else "no record",
            }
        )
    return rows


def validation_summary(v: dict) -> dict:
    """Rows of `superoffload validate` (predicted vs measured step time on this machine's profile)."""
    data = v.get("data") or {}
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict)]
    target = data.get("target") or 0.0
    op_rows = [r for r in rows if r.get("op_model_rel_error") is not None]  # records of older validates lack it
    return {"status": v["status"], "error": D.first_line(v.get("error"), 300), "hardware": data.get("hardware"),
            "target": data.get("target"), "target_text": f"{100 * target:g}%", "rows": rows,
            "within": sum(bool(r.get("within_target")) for r in rows),
            "op_rows": len(op_rows),
            "op_within": sum(abs(r["op_model_rel_error"]) <= target for r in op_rows)}


def measured_for(pred: dict, rows: list[dict], multi: list[dict] | None = None) -> float | None:
    """Our measured value for a paper_comparison row, where the records have one: Fig 10 model TFLOPS of
    that system and model (seq 1024, batch 8, the figure's setting), Fig 11 the same on 4 / 16 chips (the
    multi-rank records of that chip count at the row's setting), Fig 13 the largest ok model (B) on the
    row's chip count."""
    point, metric = str(pred.get("point", "")), pred.get("metric")
    chips = pred.get("chips") if isinstance(pred.get("chips"), int) else 1
    if chips > 1:
        rows = [r for r in multi or [] if r.get("world") == chips]
    if pred.get("figure") == "fig11" and metric == "model_tflops" and " " in point:
        model, system = point.split(" ", 1)
        vals = [r["tflops"] for r in rows if r["system"] == system and r["model"] == model and r["tflops"] is not None
                and f"seq {r['seq']}, micro-batch {r.get('batch_per_rank')}/chip" in str(pred.get("note", ""))]
        return vals[0] if vals else None
    if pred.get("figure") == "fig10" and metric == "model_tflops" and " " in point:
        model, system = point.split(" ", 1)
        vals = [
            r["tflops"]
            for r in rows
            if r["system"] == system
            and r["model"] == model
            and r["seq"] == 1024
            and r["batch"] == 8
            and r["tflops"] is not None
        ]
        return vals[0] if vals else None
    if pred.get("figure") == "fig12" and metric == "mfu":  # sequence-parallel records of that point
        parts = point.split()
        if len(parts) == 4 and parts[1] == "seq" and parts[2].isdigit():
            vals = [r["mfu"] for r in multi or [] if r.get("sp", 1) > 1 and r["world"] == chips and r["mfu"] is not None
                    and (r["model"], r["seq"], r["system"]) == (parts[0], int(parts[2]), parts[3])]
            return vals[0] if vals else None
        return None
    if pred.get("figure") == "fig13" and metric == "largest_model_B":
        system = point.split(" ")[-1]
        sizes = [F.params_of(r["model"]) for r in rows if r["system"] == system and r["status"] == "ok"]
        sizes = [s / 1e9 for s in sizes if s]
        return max(sizes) if sizes else None
    return None



# --- everything ----------------------------------------------------------------------------------------
def build_context(results: dict, figure_files: dict[str, Path]) -> dict[str, Any]:
    sweep = results["sweep"]
    rows = D.summary_rows(results["runs"])
    multi = D.multi_rank_rows(results.get("multi_runs", []), results["runs"])
    pc = results["paper_comparison"]
    pc_rows = ([r for r in (pc.get("data") or {}).get("rows") or [] if isinstance(r, dict)]
               if pc["status"] == "ok" else [])
    hw = sweep.get("hardware") or {}
    device = hw.get("device_name") or f"{hw.get('cpu', 'an unknown CPU')} (CPU only, no CUDA device)"
    is_gh200 = D.on_gh200(results)
    validation = validation_summary(results["validation"])
    measured = {i: measured_for(r, rows, multi) for i, r in enumerate(pc_rows)}
    claim_rows = H.claims(pc_rows, measured, is_gh200)
    seqlen_rows = D.seqlen_rows(results)
    ablation = ablation_rows(results)
    adam_rows = F.adam_rows(results["adam"].get("data"))
    cal = results["calibration"]
    profile = cal.get("data") if cal["status"] == "ok" else None
    explain = explain_section(results["explain"])
    figures = figure_items(results, figure_files)
    prov = results["provenance"]
    summary = summary_table(rows)
    peer_rows = H.peers(results, rows, multi, pc_rows)
    sections = {
        "runs": len(summary.rows) <= OPEN_ROWS,
        "ranks": len(multi) <= OPEN_ROWS,
        "seqlen": len(seqlen_rows) <= OPEN_ROWS,
    }
    return {
        "title": f"SuperOffload benchmark report: {sweep.get('sweep', Path(results['dir']).name)}",
        "toc": SECTIONS,
        "open": sections,
        "figures": figures,
        "sweep": {
            "name": sweep.get("sweep", Path(results["dir"]).name),
            "reason": sweep.get("reason", "sweep.json missing: selection unknown"),
            "description": (sweep.get("settings") or {}).get("description", ""),
            "steps": fm.text(sweep.get("steps")), "warmup": fm.text(sweep.get("warmup")),
            "dtype": fm.text((sweep.get("settings") or {}).get("dtype")),
            "launcher": sweep.get("launcher") or "",
            "hardware_key": fm.text(sweep.get("hardware_key")),
            "filters": ", ".join(f"{k}={','.join(sweep[k])}" for k in ("only_systems", "only_models") if sweep.get(k)),
        },
        "hardware": {"device": device, "cpu": hw.get("cpu", "unknown"), "cpu_count": fm.text(hw.get("cpu_count")),
                     "arch": hw.get("arch", "unknown"), "detail": hw.get("detail", "")},
        "is_gh200": is_gh200,
        "headline": {
            "peers": T.build(peer_rows, PEER_COLUMNS),
            "loaded_note": H.loaded_note(peer_rows),
            "largest": _largest(results),
            "claims": T.build(claim_rows, CLAIM_COLUMNS, keep_empty_rows=True),
            "sources": H.sources(results, pc_rows, is_gh200, device),
            "open_items": H.open_items(results, claim_rows, rows, multi, validation),
            "tolerance": H.tolerance_text(),
        },
        "counts": D.status_counts(results["runs"]),
        "summary": summary,
        "noisy": sum(bool(r.get("noise_flags")) for r in rows),
        "rows": rows,
        "multi": {
            "rows": multi,
            "table": multi_table(multi),
            "counts": D.status_counts(results.get("multi_runs", [])),
            "predicted": [p for p in sweep.get("predicted_runs") or [] if isinstance(p, dict)],
            "chips_available": fm.text(sweep.get("chips_available")),
            "chips_reason": sweep.get("chips_reason") or "",
        },
        "seqlen": {
            "rows": seqlen_rows,
            "table": seqlen_table(seqlen_rows, _does_not_fit(results)),
            "counts": D.status_counts([r for r in results.get("multi_runs", []) if D.sp_of(r) > 1]),
            "paper": D.FIG12_PAPER,
        },
        "ablation": {"rows": ablation, "table": T.build(ablation, ABLATION_COLUMNS, keep_empty_rows=True,
                                                         row_class=lambda r: STATUS_CLASS.get(r["status"], "")),
                     "counts": D.status_counts(results["ablation"])},
        "adam": {**_availability(results["adam"]), "table": RD.adam_table(adam_rows),
                 "paper": T.build([{"params": k, **v} for k, v in sorted(P.GRACE_ADAM_TABLE.items())],
                                  ADAM_PAPER_COLUMNS)},
        "cast": {**_availability(results["cast"]), "tables": RD.cast_tables(results["cast"].get("data"))},
        "calibration": {**_availability(cal), "table": RD.profile_table(profile),
                        "source": (profile or {}).get("source", ""),
                        "notes": [str(n) for n in (profile or {}).get("notes") or []]},
        "validation": validation,
        "validation_table": T.build(validation["rows"], VALIDATION_COLUMNS,
                                    strong=lambda r, k: k == "rel_error" and not r.get("within_target")),
        "paper_comparison": {"status": pc["status"], "error": D.first_line(pc.get("error"), 300),
                             "rows": [{**r, "measured": measured[i]} for i, r in enumerate(pc_rows)]},
        "predictions": predictions(results, pc_rows),
        "explain": explain,
        "provenance": {"fields": RD.provenance_fields(prov), "packages": sorted((prov.get("packages") or {}).items())},
    }


def _availability(item: dict[str, Any]) -> dict[str, Any]:
    return {"status": item["status"], "error": D.first_line(item.get("error"), 300), "path": item.get("path", "")}


def _largest(results: dict) -> dict[str, Any]:
    info = H.largest(results)
    cols = [T.Column("system", "system", left=True, key_column=True),
            T.Column("measured", "measured here (largest ok run)", left=True)]
    cols += [T.Column(f"c{c}", f"predicted, {c} GH200" if c > 1 else "predicted, one GH200", left=True)
             for c in info["chips"]]
    cols.append(T.Column("paper", "paper, one GH200", left=True))
    info["table"] = T.build(info["rows"], cols)
    return info


PEER_COLUMNS = [
    T.Column("peer", "SuperOffload against", left=True, key_column=True),
    T.Column("measured_1", "measured here, one rank", left=True),
    T.Column("measured_n", "measured here, several ranks", left=True),
    T.Column("measured_sp", "measured here, sequence parallel", left=True),
    T.Column("pred_1", "predicted, one GH200 (Fig 10)", left=True),
    T.Column("pred_4", "predicted, 4 GH200 (Fig 11)", left=True),
    T.Column("pred_16", "predicted, 16 GH200 (Fig 11)", left=True),
    T.Column("pred_12", "predicted, long sequences (Fig 12)", left=True),
]
CLAIM_COLUMNS = [
    T.Column("claim", "claim", left=True, key_column=True), T.Column("what", "what", left=True, key_column=True),
    T.Column("paper", "paper"), T.Column("predicted", "ours, predicted GH200"),
    T.Column("measured", "ours, measured here"),
    T.Column("error", "error", fm.signed_pct), T.Column("status", "status", badge=True),
    T.Column("note", "note", left=True),
]
ABLATION_COLUMNS = [
    T.Column("name", "variant", left=True, key_column=True), T.Column("kind", "kind", left=True, key_column=True),
    T.Column("technique", "technique", left=True, key_column=True), T.Column("options", "options", left=True),
    T.Column("status", "status", badge=True), T.Column("tokens_per_s", "tokens/s", fm.sig),
    T.Column("error", "note", left=True),
]
ADAM_PAPER_COLUMNS = [T.Column("params", "params", fm.params, key_column=True),
                      T.Column("pt-cpu", "PT-CPU s"), T.Column("cpu-adam", "CPU-Adam s"),
                      T.Column("grace-adam", "GraceAdam s")]
VALIDATION_COLUMNS = [
    T.Column("system", "system", left=True, key_column=True), T.Column("model", "model", left=True, key_column=True),
    T.Column("seq", "seq", key_column=True), T.Column("batch", "batch", key_column=True),
    T.Column("measured_s", "measured ms", fm.ms), T.Column("predicted_s", "predicted ms", fm.ms),
    T.Column("rel_error", "error", fm.signed_pct), T.Column("compute", "compute", left=True),
    T.Column("op_model_s", "op-model ms", fm.ms), T.Column("op_model_rel_error", "op-model error", fm.signed_pct),
]
