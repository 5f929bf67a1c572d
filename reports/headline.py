"""The report's headline, computed from the results folder and nothing else: SuperOffload against each peer
(measured here and predicted for GH200), the largest model per system and chip count with the memory that
binds it, the paper's claims beside ours with a status and an error, what is measured vs predicted vs taken
from the paper, and what does not hold yet and why.

Every number and sentence here is derived from the run records, the predictions file
(``predictions/paper_comparison.json``: the planner's paper rows and its largest-model rows) and the
validation; nothing is written by hand, so the headline changes when the data do.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median
from typing import Any

from reports import data as D
from reports import formatting as fm
from reports import paper as P

OURS = "superoffload"
# A paper claim "holds" when ours reaches the paper's value less this share (every compared metric is
# higher-is-better: a speed-up, a size, a utilization); the cost model's own validation target, the same
# +-20 % the validation table uses
HOLD_TOLERANCE = 0.2

# How a paper_comparison metric reads, and how its values are written
METRICS: dict[str, tuple[str, str]] = {  # metric -> (what it is, value kind)
    "superoffload/zero_offload": ("SuperOffload / ZeRO-Offload step speed", "ratio"),
    "superoffload/torch - 1": ("SuperOffload's gain over DDP (Megatron's stand-in)", "gain"),
    "superoffload/ZeRO-2 - 1": ("SuperOffload's gain over ZeRO-2", "gain"),
    "superoffload/ZeRO-3 - 1": ("SuperOffload's gain over ZeRO-3", "gain"),
    "superoffload/ulysses": ("longest sequence, SuperOffload / Ulysses", "ratio"),
    "gpu_busy_fraction": ("GPU busy share of a step", "share"),
    "largest_model_B": ("largest model (zoo label)", "billions"),
    "mfu": ("MFU (model FLOPs, no recompute)", "share"),
    "megatron_formula_mfu": ("MFU by the artifact's Megatron formula", "share"),
    "speedup_vs_previous": ("speed-up of the technique", "ratio"),
    "speedup_vs_baseline": ("speed-up, all techniques", "ratio"),
    "blog_formula_tflops": ("TFLOPS by the blog's formula", "tflops"),
    "model_tflops": ("model TFLOPS per chip", "tflops"),
}


def metric_value(metric: str, x: Any) -> str:
    """A value of ``metric`` as the headline writes it (2.50x, +83%, 55.0%, 25.0B, 600 TFLOPS)."""
    kind = METRICS.get(metric, ("", "number"))[1]
    if fm.value(x) is None:
        return fm.DASH
    if kind == "ratio":
        return fm.ratio(x)
    if kind == "gain":
        return f"+{fm.pct(x)}" if x >= 0 else fm.pct(x)
    if kind == "share":
        return fm.pct(x)
    if kind == "billions":
        return fm.params(x * 1e9)
    if kind == "tflops":
        return f"{fm.sig(x)} TFLOPS"
    return fm.sig(x)


def system_name(system: str) -> str:
    return D.SYSTEM_NAMES.get(system, system)


def _spread(vals: list[float]) -> dict[str, Any]:
    return {"n": len(vals), "median": median(vals), "min": min(vals), "max": max(vals)} if vals else {"n": 0}


def _spread_text(s: dict[str, Any], unit: str) -> str:
    """"1.15x (0.90–1.30x, 5 points)": the median, its range and count; "" when there are none."""
    if not s.get("n"):
        return ""
    if s["n"] == 1:
        return f"{fm.ratio(s['median'])} (1 {unit})"
    return f"{fm.ratio(s['median'])} ({fm.ratio(s['min'])}–{fm.ratio(s['max'])}, {s['n']} {unit}s)"


# --- SuperOffload against each peer ------------------------------------------------------------------------
# The marker of a measured ratio with a run flagged `loaded` behind it (superoffload/harness/noise.py: other
# processes used more than a quarter of the CPUs while it ran); the headline's note below the table explains it
LOADED_MARK = "†"


def loaded(row: dict[str, Any]) -> bool:
    """Whether a summary row's run was measured on a loaded machine (its record's noise flag `loaded`)."""
    return "loaded" in str(row.get("noise_flags") or "").split(", ")


def _measured_pairs(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """peer -> {ratios: SuperOffload tokens/s over the peer's at the same point (both ok), loaded: how many of
    those ratios have a run flagged `loaded` on either side, only_ours: points where only SuperOffload ran ok,
    only_peer}."""
    by: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        by[tuple(r.get(k) for k in key)][r["system"]] = r
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"ratios": [], "loaded": 0, "only_ours": 0,
                                                          "only_peer": 0})
    for point in by.values():
        ours = point.get(OURS)
        if ours is None:
            continue
        for system, r in point.items():
            if system == OURS:
                continue
            ok_ours, ok_peer = bool(ours["tokens_per_s"]), bool(r["tokens_per_s"])
            if ok_ours and ok_peer:
                out[system]["ratios"].append(ours["tokens_per_s"] / r["tokens_per_s"])
                out[system]["loaded"] += loaded(ours) or loaded(r)
            elif ok_ours:
                out[system]["only_ours"] += 1
            elif ok_peer:
                out[system]["only_peer"] += 1
    return out


def _predicted_pairs(pc_rows: list[dict[str, Any]], figure: str, chips: int) -> dict[str, dict[str, Any]]:
    """peer -> {ratios: SuperOffload's predicted model TFLOPS over the peer's per model size where both fit,
    only_ours: sizes only SuperOffload fits} for a Fig 10 / Fig 11 grid."""
    grid: dict[str, dict[str, float | None]] = defaultdict(dict)
    for r in pc_rows:
        if r.get("figure") != figure or r.get("metric") != "model_tflops" or (r.get("chips") or 1) != chips:
            continue
        model, _, system = str(r.get("point", "")).partition(" ")
        grid[model][system] = D.num(r.get("predicted"))
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"ratios": [], "only_ours": 0, "only_peer": 0})
    for cells in grid.values():
        ours = cells.get(OURS)
        for system, v in cells.items():
            if system == OURS:
                continue
            if ours and v:
                out[system]["ratios"].append(ours / v)
            elif ours:
                out[system]["only_ours"] += 1
            elif v:
                out[system]["only_peer"] += 1
    return out


def _fig12_pairs(pc_rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ulysses -> predicted MFU of SuperOffload over Ulysses' per sequence length and chip count where both
    fit, and the points only SuperOffload fits (Fig 12)."""
    cells: dict[tuple[int, int], dict[str, float | None]] = defaultdict(dict)
    for r in pc_rows:
        parts = str(r.get("point", "")).split()
        if (r.get("figure") != "fig12" or r.get("metric") != "mfu" or r.get("paper") is not None or len(parts) != 4
                or parts[1] != "seq"):
            continue
        cells[(r.get("chips") or 1, int(parts[2]))][parts[3]] = D.num(r.get("predicted"))
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"ratios": [], "only_ours": 0, "only_peer": 0})
    for c in cells.values():
        ours, peer = c.get(OURS), c.get("ulysses")
        if ours and peer:
            out["ulysses"]["ratios"].append(ours / peer)
        elif ours:
            out["ulysses"]["only_ours"] += 1
        elif peer:
            out["ulysses"]["only_peer"] += 1
    return out


def _pair_text(p: dict[str, Any] | None, unit: str, verb: str = "fits") -> str:
    """The ratios' median and range, then the points only one side has (``verb``: fits / ran ok)."""
    if not p:
        return ""
    parts = [_spread_text(_spread(p["ratios"]), unit)] if p["ratios"] else []
    if p.get("loaded"):  # measured ratios only: a prediction has no load
        n = len(p["ratios"])
        parts[0] += f" {LOADED_MARK} " + ("loaded" if p["loaded"] == n else f"{p['loaded']} of {n} loaded")
    if p["only_ours"]:
        parts.append(f"{p['only_ours']} {unit}{'s' if p['only_ours'] > 1 else ''} only SuperOffload {verb}")
    if p["only_peer"]:
        parts.append(f"{p['only_peer']} {unit}{'s' if p['only_peer'] > 1 else ''} only the peer {verb}")
    return "; ".join(x for x in parts if x)


def peers(results: dict[str, Any], single: list[dict[str, Any]], multi: list[dict[str, Any]],
          pc_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per peer system: SuperOffload's speed relative to it, measured here (one rank, several
    ranks) and predicted for GH200 (1, 4, 16 chips; long sequences)."""
    m1 = _measured_pairs(single, ("model", "seq", "batch", "dtype"))
    dp = [r for r in multi if r["sp"] == 1]
    mw = _measured_pairs(dp, ("model", "seq", "batch_per_rank", "world", "dtype"))
    msp = _measured_pairs([r for r in multi if r["sp"] > 1], ("model", "seq", "batch", "world", "sp", "dtype"))
    p1 = _predicted_pairs(pc_rows, "fig10", 1)
    p4 = _predicted_pairs(pc_rows, "fig11", 4)
    p16 = _predicted_pairs(pc_rows, "fig11", 16)
    p12 = _fig12_pairs(pc_rows)
    systems = ({r["system"] for r in single + multi} | set(p1) | set(p4) | set(p16) | set(p12)) - {OURS}
    rows = []
    for system in sorted(systems, key=D.system_key):
        worlds = sorted({r["world"] for r in dp if r["system"] == system})
        rows.append({
            "peer": system_name(system),
            "measured_1": _pair_text(m1.get(system), "point", "ran ok"),
            "measured_n": _pair_text(mw.get(system), "point", "ran ok")
            + (f"; {'/'.join(map(str, worlds))} ranks" if mw.get(system) else ""),
            "measured_sp": _pair_text(msp.get(system), "point", "ran ok"),
            "pred_1": _pair_text(p1.get(system), "size"),
            "pred_4": _pair_text(p4.get(system), "size"),
            "pred_16": _pair_text(p16.get(system), "size"),
            "pred_12": _pair_text(p12.get(system), "point"),
        })
    return rows


def loaded_note(peer_rows: list[dict[str, Any]]) -> str:
    """The one line under the peer table when a measured ratio carries the marker; "" when none does."""
    marked = [c for r in peer_rows for k, c in r.items() if k.startswith("measured") and LOADED_MARK in c]
    if not marked:
        return ""
    return (f"{LOADED_MARK} Measured on a loaded machine: behind each ratio so marked is at least one run during "
            "which other processes used more than a quarter of the CPUs (its record's noise flag loaded), so it "
            "measures that load as much as the code; rerun those points on a quiet machine before quoting them.")


# --- the largest model -------------------------------------------------------------------------------------
def largest_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The predictions file's largest-model rows (workflows/scripts/largest.py) that are well formed."""
    data = results["paper_comparison"].get("data") or {}
    return [r for r in data.get("largest") or [] if isinstance(r, dict) and r.get("system")
            and isinstance(r.get("chips"), int)]


def binding_text(b: dict[str, Any] | None, short: bool = False) -> str:
    """"host memory: one block more needs 489 GB of 480 GB (14.6 B/param)"."""
    if not isinstance(b, dict) or b.get("memory") in (None, "none"):
        return ""
    if short:
        return f"{b['memory']} memory"
    need, cap = fm.nbytes(b.get("need_bytes")), fm.nbytes(b.get("capacity_bytes"))
    per = fm.value(b.get("bytes_per_param"))
    return (f"{b['memory']} memory: one block more needs {need} of {cap}"
            + (f" ({fm.sig(per)} B/param)" if per is not None else ""))


def _measured_largest(records: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    """system -> (model, its parameter count) of the largest model with an ok record in this sweep."""
    best: dict[str, tuple[str, float]] = {}
    for rec in records:
        r = D.record_row(rec)
        n = D.model_params(r["model"], r["params"])
        if r["status"] == "ok" and n and n > best.get(r["system"], ("", 0.0))[1]:
            best[r["system"]] = (r["model"], n)
    return best


def largest(results: dict[str, Any]) -> dict[str, Any]:
    """The largest-model table (system x chip count, with what binds each) and the sentences that explain
    the one-chip result, from the predictions file; the measured column from this sweep's ok records."""
    rows = largest_rows(results)
    chips = sorted({r["chips"] for r in rows})
    measured = _measured_largest(results["runs"] + results.get("multi_runs", []))
    by = {(r["system"], r["chips"]): r for r in rows}
    systems = sorted({r["system"] for r in rows} | set(measured), key=D.system_key)
    table = []
    for system in systems:
        row: dict[str, Any] = {"system": system_name(system)}
        m = measured.get(system)
        row["measured"] = f"{fm.params(m[1])} ({m[0]})" if m else ""
        paper = P.LARGEST_MODEL_B.get(system)
        row["paper"] = f"{fm.params(paper[0] * 1e9)} [{paper[1]}]" if paper else ""
        for c in chips:
            r = by.get((system, c))
            if r is None:
                row[f"c{c}"] = ""
            elif not r.get("params"):
                row[f"c{c}"] = "nothing fits"
            else:
                row[f"c{c}"] = (f"{fm.params(r['params'])} ({_grown(r)}); "
                                f"{binding_text(r.get('binding'), short=True)} binds")
            row[f"b{c}"] = binding_text((r or {}).get("binding"))
        table.append(row)
    return {"chips": chips, "rows": table, "why": _largest_why(rows, 1) if 1 in chips else [],
            "hardware": rows[0].get("hardware", "") if rows else "",
            "error": (results["paper_comparison"].get("data") or {}).get("binding_error", "")}


def _grown(r: dict[str, Any]) -> str:
    """"gpt-30b + 4 blocks" (the zoo model grown by whole blocks), "gpt-25b" when it could not grow."""
    extra = (r.get("layers") or 0) - (r.get("zoo_layers") or r.get("layers") or 0)
    if not r.get("zoo_layers"):  # an older predictions file: the layer count only
        return f"{r['zoo_model']}, {r['layers']} layers"
    return f"{r['zoo_model']} + {extra} block{'s' if extra != 1 else ''}" if extra > 0 else str(r["zoo_model"])


def _largest_why(rows: list[dict[str, Any]], chips: int) -> list[str]:
    """Sentences, largest first: each group of systems with the same result on ``chips`` chips, its size
    and what binds it at how many bytes per parameter."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for r in rows:
        if r["chips"] != chips or not r.get("params"):
            continue
        b = r.get("binding") or {}
        per = fm.value(b.get("bytes_per_param"))
        groups[(r["params"], _grown(r), b.get("memory"), round(per, 2) if per is not None else None,
                b.get("need_bytes"), b.get("capacity_bytes"))].append(r["system"])
    out = []
    for (params, grown, memory, per, need, cap), systems in sorted(groups.items(), key=lambda kv: -kv[0][0]):
        who = ", ".join(system_name(s) for s in sorted(systems, key=D.system_key))
        text = f"{who}: {fm.params(params)} ({grown})"
        if memory and memory != "none":
            text += (f"; {memory} memory binds: one block more needs {fm.nbytes(need)} of {fm.nbytes(cap)}"
                     + (f", {fm.sig(per)} bytes per parameter" if per is not None else ""))
        out.append(text + ".")
    return out


# --- the paper's claims ----------------------------------------------------------------------------------
def claim_status(ours: float | None, paper: float | None, tol: float = HOLD_TOLERANCE) -> str:
    """holds / does not hold (ours against the paper's value less ``tol``), or no prediction."""
    if ours is None or paper is None:
        return "no prediction"
    return "holds" if ours >= paper * (1 - tol) else "does not hold"


def claims(pc_rows: list[dict[str, Any]], measured: dict[int, float | None], is_gh200: bool,
           tol: float = HOLD_TOLERANCE) -> list[dict[str, Any]]:
    """Every paper_comparison row with a paper value: the claim, the paper's value and status tag, ours
    predicted for GH200 and measured here (where this sweep ran the setting), the error and whether the
    claim holds. Measured values decide only on a GH200 (elsewhere the prediction does), and the largest model
    a sweep ran only when it reaches the paper's (it is a lower bound)."""
    out = []
    for i, r in enumerate(pc_rows):
        paper = D.num(r.get("paper"))
        if paper is None:
            continue
        metric = str(r.get("metric", ""))
        pred, meas = D.num(r.get("predicted")), measured.get(i)
        evidence = "measured" if (is_gh200 and meas is not None) else "predicted"
        if metric == "largest_model_B" and meas is not None and meas < paper * (1 - tol):
            # the largest model a sweep ran is a lower bound (its list may stop below the limit): it can show
            # that a claim holds, never that it does not
            evidence = "predicted"
        ours = meas if evidence == "measured" else pred
        status = claim_status(ours, paper, tol)
        if status != "no prediction":
            status += f" ({evidence})"
        out.append({
            "claim": f"{r.get('figure')}: {r.get('point')}",
            "what": METRICS.get(metric, (metric, ""))[0],
            "paper": f"{metric_value(metric, paper)} [{r.get('paper_status', '?')}]",
            "predicted": metric_value(metric, pred),
            "measured": metric_value(metric, meas) if meas is not None else None,
            "ours": metric_value(metric, ours), "evidence": evidence,
            "error": (ours - paper) / paper if ours is not None and paper else None,
            "status": status,
            "note": r.get("note", ""),
            "chips": r.get("chips") or 1,
        })
    return out


# --- what the numbers are, and what does not hold -----------------------------------------------------------
def sources(results: dict[str, Any], pc_rows: list[dict[str, Any]], is_gh200: bool,
            device: str) -> list[str]:
    """What is measured (where), predicted (by what) and the paper's (with what status)."""
    c = D.status_counts(results["runs"])
    cm = D.status_counts(results.get("multi_runs", []))
    out = [f"Measured: {c['ok'] + c['oom'] + c['error']} one-rank runs ({c['ok']} ok, {c['oom']} oom, "
           f"{c['error']} error) and {sum(cm.values())} multi-rank runs on {device}"
           + ("" if is_gh200 else " (not a GH200: these numbers test the code, not the paper's claims)") + "."]
    pc = results["paper_comparison"]
    if pc["status"] == "ok":
        hw = (pc.get("data") or {}).get("hardware") or "gh200"
        n_pred = sum(D.num(r.get("predicted")) is not None for r in pc_rows)
        out.append(f"Predicted: {n_pred} values of the paper's figures by the cost model on the {hw} preset "
                   "(superoffload.planner.paper), never fitted to the paper.")
    else:
        out.append(f"Predicted: not available ({pc['status']}).")
    tags: dict[str, int] = defaultdict(int)
    for r in pc_rows:
        if D.num(r.get("paper")) is not None:
            tags[str(r.get("paper_status", "?"))] += 1
    if tags:
        names = {"V": "verbatim from an authors' source", "S": "from a third-party summary"}
        counts = ", ".join(f"{n} values [{t}] {names.get(t, '')}".rstrip() for t, n in sorted(tags.items()))
        out.append(f"Paper: {counts}; values the sources do not give are left out, never guessed.")
    return out


def tolerance_text(tol: float = HOLD_TOLERANCE) -> str:
    return f"{100 * tol:g}%"


def _claim_line(c: dict[str, Any], with_error: bool = True) -> str:
    line = f"{c['claim']}, {c['what']}: ours {c['ours']} ({c['evidence']}), paper {c['paper']}"
    if with_error and c["error"] is not None:
        line += f" ({fm.signed_pct(c['error'])})"
    return line + (f". {c['note']}" if c["note"] else "") + "."


def open_items(results: dict[str, Any], claim_rows: list[dict[str, Any]], single: list[dict[str, Any]],
               multi: list[dict[str, Any]], validation: dict[str, Any],
               tol: float = HOLD_TOLERANCE) -> list[dict[str, Any]]:
    """What does not hold yet, and why, in groups {title, items}: claims that do not hold, claims without a
    prediction, claims ours exceeds by more than the tolerance, what went wrong on this machine (failed and
    noisy runs, cost-model misses), inputs that are not there. Empty groups are left out."""
    below = [_claim_line(c) for c in claim_rows if c["status"].startswith("does not hold")]
    none = [_claim_line(c, False) for c in claim_rows if c["status"] == "no prediction"]
    above = [_claim_line(c) for c in claim_rows if c["status"].startswith("holds") and c["error"] is not None
             and c["error"] > tol]
    here = []
    failed = [r for r in single + multi if r["status"] != "ok"]
    by: dict[str, list[str]] = defaultdict(list)
    for r in failed:
        by[f"{r['status']}: {r['error'] or 'no message'}"].append(f"{r['system']} {r['model']} s{r['seq']}")
    for why, runs in sorted(by.items()):
        here.append(f"{len(runs)} run{'s' if len(runs) > 1 else ''} failed ({', '.join(runs[:4])}"
                    f"{', ...' if len(runs) > 4 else ''}): {why}.")
    noisy = [r for r in single + multi if r.get("noise_flags")]
    if noisy:
        here.append(f"{len(noisy)} of {len(single) + len(multi)} runs are flagged noisy (other load or spread on "
                    "this machine): their numbers are not the code's alone.")
    if validation["rows"] and validation["within"] < len(validation["rows"]):
        here.append(f"The cost model predicts {validation['within']} of {len(validation['rows'])} of this sweep's "
                    f"runs within ±{tolerance_text(validation['target'] or tol)} on this machine's calibration "
                    "(section Cost model vs measurement).")
    missing = []
    for key, what in (("calibration", "Calibration"), ("adam", "GraceAdam microbenchmark"),
                      ("cast", "Cast microbenchmark"), ("validation", "Cost-model validation"),
                      ("paper_comparison", "Predictions")):
        item = results[key]
        if item["status"] != "ok":
            why = f": {D.first_line(item['error'], 160)}" if item.get("error") else ""
            missing.append(f"{what} not available ({item['status']}){why}.")
    groups = [
        (f"Claims that do not hold: ours below the paper's value less {tolerance_text(tol)}", below),
        ("Claims without a prediction: the cost model does not model that system or setting", none),
        (f"Claims ours exceeds by more than {tolerance_text(tol)}: the model or the paper's setting may differ", above),
        ("On this machine", here),
        ("Inputs that are not there", missing),
    ]
    return [{"title": t, "items": items} for t, items in groups if items]
