"""Deterministic matplotlib figures of one results folder.

Every figure function takes the loaded results (reports.data.load_results) and returns a Figure; each
renders something when its data is missing (an empty-state text saying what is absent and why). SVGs are
byte-stable: fixed svg.hashsalt, no date metadata, text as text, sorted inputs.
Points are labelled by provenance: measured (our records), predicted (the cost model,
superoffload.planner), paper (the paper's value, with its status tag V/S).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from reports import data as D  # noqa: E402
from reports import paper as P  # noqa: E402

RC = {
    "svg.hashsalt": "superoffload-report",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "path.simplify": False,
}
SYSTEM_ORDER = ["torch", "superoffload", "zero_offload", "zero_infinity", "ds_superoffload", "fsdp_offload"]
COLORS = dict(zip(SYSTEM_ORDER, ["#555555", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"], strict=True))
STYLE = {
    "measured": dict(marker="o", linestyle="-"),
    "predicted": dict(marker="s", linestyle="--"),
    "paper": dict(marker="*", linestyle=":"),
}


def _footnote(fig: plt.Figure, text: str) -> None:
    """A small grey note under the axes (sources, status labels), leaving room for it in the layout."""
    fig.text(0.01, 0.01, text, fontsize=7, color="#666666")
    fig.tight_layout(rect=(0, 0.05, 1, 1))


def _color(system: str) -> str:
    return COLORS.get(system, "#8c564b")


def _sys_sorted(systems) -> list[str]:
    return sorted(systems, key=lambda s: (SYSTEM_ORDER.index(s) if s in SYSTEM_ORDER else 99, s))


def empty(ax, text: str) -> None:
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        wrap=True,
        transform=ax.transAxes,
        fontsize=9,
        color="#666666",
        bbox=dict(boxstyle="round", fc="#f6f6f6", ec="#cccccc"),
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def _fig(ncols: int = 1, width: float = 6.4, height: float = 3.6):
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def _status_note(records: list[dict]) -> str:
    c = D.status_counts(records)
    return f"{c['ok']} ok, {c['oom']} oom, {c['error']} error records"


def _pred_rows(results: dict, figure: str) -> list[dict]:
    pc = results["paper_comparison"]
    rows = (pc.get("data") or {}).get("rows") or [] if pc["status"] == "ok" else []
    return [r for r in rows if isinstance(r, dict) and r.get("figure") == figure]


def _params_of(model: str) -> float | None:
    """Parameters of a zoo label such as gpt-13b (billions in the label)."""
    tail = model.rsplit("-", 1)[-1].lower()
    if tail.endswith("b"):
        try:
            return float(tail[:-1]) * 1e9
        except ValueError:
            return None
    return None


# --- figures ------------------------------------------------------------------------------------------
def throughput_vs_size(results: dict) -> plt.Figure:
    """Model TFLOPS per device vs parameters, per system (the Fig 10 shape): measured on this hardware
    (left) and the cost model's prediction for one GH200 (right; different hardware, so its own axes)."""
    fig, (ax, axp) = _fig(2, width=10.0, height=3.8)
    rows = [D.record_row(r) for r in results["runs"]]
    groups: dict[tuple, set] = defaultdict(set)
    for r in rows:
        if r["params"]:
            groups[(r["seq"], r["batch"])].add(r["model"])
    drew = False
    title = "Measured: throughput vs model size"
    if groups:
        (seq, batch), _ = max(
            sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0)), key=lambda kv: len(kv[1])
        )
        title += f" (seq {seq}, batch {batch})"
        sel = [r for r in rows if (r["seq"], r["batch"]) == (seq, batch) and r["params"]]
        for system in _sys_sorted({r["system"] for r in sel}):
            pts = sorted((r["params"], r["tflops"]) for r in sel if r["system"] == system and r["tflops"])
            if pts:
                ax.plot(*zip(*pts, strict=True), color=_color(system), label=system, **STYLE["measured"])
                drew = True
            bad = sorted(r["params"] for r in sel if r["system"] == system and r["status"] != "ok")
            if bad:
                ax.scatter(
                    bad,
                    [0] * len(bad),
                    marker="x",
                    color=_color(system),
                    zorder=5,
                    label=f"{system} oom/error",
                )
                drew = True
    ax.set_title(title, fontsize=9)
    if drew:
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("model TFLOPS per device")
        ax.legend(fontsize=6)
    else:
        empty(ax, "No measured throughput: no run records.\n" + _status_note(results["runs"]))
    pred: dict[str, list] = defaultdict(list)
    for r in _pred_rows(results, "fig10"):
        if r.get("metric") != "model_tflops" or " " not in str(r.get("point")):
            continue
        model, system = str(r["point"]).split(" ", 1)
        params = _params_of(model)
        if params and D.num(r.get("predicted")) is not None:
            pred[system].append((params, r["predicted"]))
    axp.set_title("Predicted: one GH200 (cost model; Fig 10 setting)", fontsize=9)
    if pred:
        for system in _sys_sorted(pred):
            pts = sorted(pred[system])
            axp.plot(*zip(*pts, strict=True), color=_color(system), label=system, **STYLE["predicted"])
        axp.set_xscale("log")
        axp.set_xlabel("parameters")
        axp.set_ylabel("model TFLOPS per device")
        axp.legend(fontsize=6)
    else:
        pc = results["paper_comparison"]
        empty(axp, f"No predictions ({pc['status']}).\n" + D.first_line(pc.get("error"), 80))
    _footnote(
        fig,
        "paper (Fig 10): per-size values are not in the sources we could read ([MISSING]); "
        "missing models on the right = predicted not to fit",
    )
    return fig


def mfu_vs_seq(results: dict) -> plt.Figure:
    fig, (ax,) = _fig()
    rows = [D.record_row(r) for r in results["runs"]]
    groups: dict[tuple, set] = defaultdict(set)
    for r in rows:
        if r["seq"]:
            groups[(r["model"], r["batch"])].add(r["seq"])
    best = max(sorted(groups.items()), key=lambda kv: len(kv[1]), default=None)
    if best is None or len(best[1]) < 2:
        empty(
            ax,
            "No sequence-length sweep in the records (need one model at >= 2 sequence lengths).\n"
            + _status_note(results["runs"]),
        )
        ax.set_title("MFU vs sequence length", fontsize=10)
        return fig
    model, batch = best[0]
    sel = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
    drew = False
    for system in _sys_sorted({r["system"] for r in sel}):
        pts = sorted((r["seq"], 100 * r["mfu"]) for r in sel if r["system"] == system and r["mfu"] is not None)
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                color=_color(system),
                label=f"{system} (measured)",
                **STYLE["measured"],
            )
            drew = True
        bad = sorted(r["seq"] for r in sel if r["system"] == system and r["status"] != "ok")
        if bad:
            ax.scatter(bad, [0] * len(bad), marker="x", color=_color(system), label=f"{system} oom/error")
            drew = True
    if not drew:
        empty(ax, f"No ok records for {model} batch {batch}. " + _status_note(sel))
    else:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("MFU (%)")
        ax.legend(fontsize=7)
        ax.text(
            0.0,
            -0.22,
            "paper (Fig 12): 55% MFU at 1M tokens on 8 GH200, 13B [V]; not comparable on 1 device",
            transform=ax.transAxes,
            fontsize=7,
            color="#666666",
        )
    ax.set_title(f"MFU vs sequence length ({model}, batch {batch})", fontsize=10)
    return fig


def largest_model(results: dict) -> plt.Figure:
    """Largest model with an ok record per system (measured, within the sweep's list), the cost model's
    prediction for one GH200, and the paper's value (Fig 13)."""
    fig, (ax,) = _fig()
    measured: dict[str, float] = {}
    for r in map(D.record_row, results["runs"]):
        if r["status"] == "ok" and r["params"]:
            measured[r["system"]] = max(measured.get(r["system"], 0.0), r["params"] / 1e9)
    predicted: dict[str, float] = {}
    for r in _pred_rows(results, "fig13"):
        system = str(r.get("point", "")).split(" ")[-1]
        if D.num(r.get("predicted")) is not None:
            predicted[system] = float(r["predicted"])
    systems = _sys_sorted(set(measured) | set(predicted) | set(P.LARGEST_MODEL_B))
    width = 0.27
    for i, system in enumerate(systems):
        for j, (kind, val) in enumerate(
            (
                ("measured", measured.get(system)),
                ("predicted", predicted.get(system)),
                ("paper", (P.LARGEST_MODEL_B.get(system) or (None,))[0]),
            )
        ):
            if val is None:
                continue
            x = i + (j - 1) * width
            ax.bar(
                x,
                val,
                width,
                color=_color(system),
                alpha=(1.0, 0.55, 0.25)[j],
                hatch=("", "//", "..")[j],
                edgecolor="black",
                linewidth=0.5,
            )
            tag = {"measured": "M", "predicted": "P", "paper": "paper"}[kind]
            if kind == "paper":
                tag += f" [{P.LARGEST_MODEL_B[system][1]}]"
            ax.text(x, val, f"{val:.3g}\n{tag}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(systems)), systems, rotation=20, fontsize=7)
    ax.set_ylabel("largest trainable model (B params)")
    ax.set_yscale("log")
    ax.set_title("Largest trainable model on one device (M = measured, P = predicted GH200)", fontsize=9)
    ax.text(
        0.0,
        -0.3,
        "measured: the largest model of the sweep with an ok record (an OOM search only when "
        "the sweep has a max_model matrix)",
        transform=ax.transAxes,
        fontsize=7,
        color="#666666",
    )
    return fig


PRED_ABLATION = {
    "+GraceAdam": "host_optimizer",
    "+casting": "cast_policy",
    "+STV": "speculation",
    "+repartitioning": "device_tail_buckets",
}


def _predicted_ablation(results: dict) -> dict[str, float]:
    """technique -> the cost model's per-technique factor (paper_comparison 'ablation' rows)."""
    out = {}
    for r in _pred_rows(results, "ablation"):
        if r.get("metric") != "speedup_vs_previous" or D.num(r.get("predicted")) is None:
            continue
        tail = str(r.get("point", "")).split(" ")[-1]
        if tail in PRED_ABLATION:
            out[PRED_ABLATION[tail]] = float(r["predicted"])
    return out


def _ablation_data(results: dict) -> tuple[list, list, str]:
    variants = (results["variants"] or {}).get("variants") or {}
    by_name = {Path(r["_path"]).stem: D.record_row(r) for r in results["ablation"]}
    tps = {n: by_name[n]["tokens_per_s"] for n in by_name}
    techs = (results["variants"] or {}).get("techniques") or {}
    cum = sorted(((v["step"], n, v.get("technique")) for n, v in variants.items() if v["kind"] == "cumulative"))
    base = tps.get(cum[0][1]) if cum else None
    pred = _predicted_ablation(results)
    cum_rows = []
    paper_prod, pred_prod = 1.0, 1.0
    for step, name, tech in cum:
        if tech:
            paper_prod *= P.ABLATION_FACTORS.get(tech, float("nan"))
            pred_prod = pred_prod * pred[tech] if (pred_prod and tech in pred) else None
        label = "baseline" if not tech else "+" + (techs.get(tech, {}).get("label") or tech)
        meas = tps.get(name) / base if (base and tps.get(name)) else None
        cum_rows.append(
            {
                "label": label,
                "measured": meas,
                "paper": paper_prod if step else 1.0,
                "predicted": pred_prod if step else 1.0,
                "status": by_name.get(name, {}).get("status", "missing"),
            }
        )
    all_on = tps.get(cum[-1][1]) if cum else None
    loo_rows = []
    for name, v in sorted(variants.items()):
        if v["kind"] != "leave_one_out":
            continue
        tech = v["technique"]
        meas = all_on / tps[name] if (all_on and tps.get(name)) else None
        loo_rows.append(
            {
                "label": "-" + (techs.get(tech, {}).get("label") or tech),
                "measured": meas,
                "paper": P.ABLATION_FACTORS.get(tech),
                "predicted": pred.get(tech),
                "status": by_name.get(name, {}).get("status", "missing"),
            }
        )
    return cum_rows, loo_rows, _status_note(results["ablation"])


def ablation(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = _fig(2, width=9.0, height=3.8)
    cum, loo, note = _ablation_data(results)
    for ax, rows, title, ylabel in (
        (ax1, cum, "Cumulative (speed-up vs baseline)", "throughput / baseline"),
        (ax2, loo, "Leave-one-out (all-on / without it)", "slow-down without the technique"),
    ):
        ax.set_title(title, fontsize=9)
        if not rows:
            empty(ax, "No ablation variants (ablation not run).")
            continue
        x = range(len(rows))
        w = 0.27
        series = (
            ("measured", "#d62728", "", "measured"),
            ("predicted", "#1f77b4", "//", "predicted GH200"),
            ("paper", "#bbbbbb", "..", "paper [S]"),
        )
        for j, (key, color, hatch, label) in enumerate(series):
            vals = [r.get(key) for r in rows]
            ax.bar(
                [i + (j - 1) * w for i in x],
                [v or 0 for v in vals],
                w,
                color=color,
                hatch=hatch,
                edgecolor="black",
                linewidth=0.4,
                label=label,
            )
            for i, v in enumerate(vals):
                if v is not None:
                    ax.text(i + (j - 1) * w, v, f"{v:.2f}", ha="center", va="bottom", fontsize=5)
                elif key == "measured":
                    ax.text(
                        i - w,
                        0.02,
                        f"n/a ({rows[i]['status']})",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=6,
                    )
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xticks(list(x), [r["label"] for r in rows], rotation=25, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    _footnote(
        fig,
        f"ablation records: {note}; paper factors 1.104 / 1.127 / 1.45 / 1.141 "
        f"(total {P.ABLATION_TOTAL}x, stacking order unknown)",
    )
    return fig


def _first_key(row: dict, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if k in row:
            return k
    return None


def table_rows(obj: Any) -> list[dict]:
    """The first list of flat dicts in a microbenchmark result (its rows), or []."""
    if isinstance(obj, list) and obj and all(isinstance(r, dict) for r in obj):
        return obj
    if isinstance(obj, dict):
        for key in ("results", "rows", "runs", "measurements", "points", "data"):
            if key in obj:
                rows = table_rows(obj[key])
                if rows:
                    return rows
        for v in obj.values():
            rows = table_rows(v)
            if rows:
                return rows
    return []


ADAM_IMPL = ("impl", "kernel", "optimizer", "name", "backend", "variant")
ADAM_TIME = ("median_s", "time_s", "seconds", "step_s", "mean_s", "s")
ADAM_NUMEL = ("numel", "params", "n", "elements")


def adam_rows(adam_data: Any) -> list[dict]:
    """Flat rows {phase, impl, threads, numel, median_s, p10_s, p90_s, ns_per_param, gbps} from the
    GraceAdam microbenchmark: `measurements[*].kernels|host_phase.<impl>` stats, or any flat row list."""
    out = []
    if isinstance(adam_data, dict) and isinstance(adam_data.get("measurements"), list):
        for m in adam_data["measurements"]:
            if not isinstance(m, dict):
                continue
            numel = D.num(m.get("numel"))
            for phase in ("kernels", "host_phase"):
                for impl, st in sorted((m.get(phase) or {}).items()):
                    if not isinstance(st, dict) or D.num(st.get("median_s")) is None:
                        continue
                    t = float(st["median_s"])
                    out.append(
                        {
                            "phase": phase,
                            "impl": impl,
                            "threads": m.get("threads"),
                            "numel": numel,
                            "median_s": t,
                            "p10_s": D.num(st.get("p10_s")),
                            "p90_s": D.num(st.get("p90_s")),
                            "ns_per_param": t / numel * 1e9 if numel else None,
                            "gbps": D.num(st.get("gb_per_s")),
                        }
                    )
        return out
    for r in table_rows(adam_data):
        ik, tk, nk = _first_key(r, ADAM_IMPL), _first_key(r, ADAM_TIME), _first_key(r, ADAM_NUMEL)
        gk = next((k for k in r if "gbps" in k.lower() or "gb_s" in k.lower() or "gb_per_s" in k.lower()), None)
        if ik is None or (tk is None and gk is None):
            continue
        numel = D.num(r.get(nk)) if nk else None
        t = D.num(r.get(tk)) if tk else None
        out.append(
            {
                "phase": "kernels",
                "impl": str(r[ik]),
                "threads": r.get("threads"),
                "numel": numel,
                "median_s": t,
                "p10_s": None,
                "p90_s": None,
                "ns_per_param": (t / numel * 1e9) if (t and numel) else None,
                "gbps": D.num(r.get(gk)) if gk else None,
            }
        )
    return out


def adam_points(results: dict) -> list[dict]:
    """The optimizer-kernel rows (not the host-phase compositions) of the GraceAdam microbenchmark."""
    return [r for r in adam_rows(results["adam"].get("data")) if r["phase"] == "kernels"]


def graceadam(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = _fig(2, width=9.0, height=3.6)
    pts = adam_points(results)
    ax1.set_title("Host Adam step, measured (ns per parameter)", fontsize=9)
    if not pts or not any(p["ns_per_param"] or p["gbps"] for p in pts):
        a = results["adam"]
        empty(
            ax1,
            f"GraceAdam microbenchmark not available ({a['status']}).\n{D.first_line(a.get('error'), 90)}",
        )
    else:
        metric = "ns_per_param" if any(p["ns_per_param"] for p in pts) else "gbps"
        labels = [f"{p['impl']}\n{p['threads']} thr" if p["threads"] is not None else p["impl"] for p in pts]
        vals = [p[metric] or 0 for p in pts]
        ax1.bar(
            range(len(pts)),
            vals,
            color=["#d62728" if P.kernel_key(p["impl"]) == "grace-adam" else "#1f77b4" for p in pts],
        )
        ax1.set_xticks(range(len(pts)), labels, rotation=30, ha="right", fontsize=6)
        ax1.set_ylabel("ns / parameter" if metric == "ns_per_param" else "GB/s")
    # speed-up ratios: ours (best over threads per kernel) vs the paper's table
    ax2.set_title("Speed-up of GraceAdam: measured vs paper [V]", fontsize=9)
    best: dict[str, float] = {}
    for p in pts:
        key = P.kernel_key(p["impl"])
        if key and p["ns_per_param"]:
            best[key] = min(best.get(key, math.inf), p["ns_per_param"])
    labels, meas, pap = [], [], []
    for other in ("pt-cpu", "cpu-adam"):
        labels.append(f"{other} / grace-adam")
        meas.append(best[other] / best["grace-adam"] if other in best and "grace-adam" in best else None)
        pap.append(sum(v[other] / v["grace-adam"] for v in P.GRACE_ADAM_TABLE.values()) / len(P.GRACE_ADAM_TABLE))
    x = range(len(labels))
    ax2.bar([i - 0.2 for i in x], [m or 0 for m in meas], 0.4, color="#d62728", label="measured (this host)")
    ax2.bar(
        [i + 0.2 for i in x],
        pap,
        0.4,
        color="#bbbbbb",
        hatch="..",
        edgecolor="black",
        linewidth=0.5,
        label="paper, mean over 1-8B (GH200)",
    )
    for i in x:
        ax2.text(
            i - 0.2,
            meas[i] or 0,
            "n/a" if meas[i] is None else f"{meas[i]:.2f}x",
            ha="center",
            va="bottom",
            fontsize=7,
        )
        ax2.text(i + 0.2, pap[i], f"{pap[i]:.2f}x", ha="center", va="bottom", fontsize=7)
    ax2.set_xticks(list(x), labels, fontsize=7)
    ax2.axhline(1.0, color="black", linewidth=0.6)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


CAST_SIZE = ("bytes", "size_bytes", "nbytes", "size", "numel", "elements")


def cast_series(results: dict) -> dict[str, dict[str, list]]:
    """{"latency": {series: [(bytes, seconds)]}, "bandwidth": {series: [(bytes, GB/s)]}} from every row list
    of the cast microbenchmark (e.g. grad_path / param_path latencies, link bandwidths)."""
    data = results["cast"].get("data")
    lists = {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}
    if not lists and table_rows(data):
        lists = {"cast": table_rows(data)}
    out: dict[str, dict[str, list]] = {"latency": defaultdict(list), "bandwidth": defaultdict(list)}
    for name, rows in sorted(lists.items()):
        for r in rows:
            if not isinstance(r, dict):
                continue
            sk = _first_key(r, CAST_SIZE)
            gk = next((k for k in ("gbps", "bandwidth_gbps", "gb_per_s") if k in r), None)
            tk = _first_key(r, ("median_s", "latency_s", "time_s", "seconds"))
            if sk is None or D.num(r.get(sk)) is None:
                continue
            tags = [str(v) for k, v in sorted(r.items()) if isinstance(v, str) and k not in ("unit", "device")]
            label = f"{name}: {' '.join(tags)}" if tags else name
            if gk and D.num(r.get(gk)) is not None:
                out["bandwidth"][label].append((float(r[sk]), float(r[gk])))
            elif tk and D.num(r.get(tk)) is not None:
                out["latency"][label].append((float(r[sk]), float(r[tk])))
    return out


def cast(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = _fig(2, width=10.0, height=3.8)
    series = cast_series(results)
    c = results["cast"]
    for ax, key, ylabel, title in (
        (ax1, "latency", "seconds (median)", "Cast + transfer paths (measured)"),
        (ax2, "bandwidth", "GB/s", "Host<->device copies (measured)"),
    ):
        ax.set_title(title, fontsize=9)
        if not series[key]:
            empty(ax, f"Cast microbenchmark: no {key} data ({c['status']}).\n{D.first_line(c.get('error'), 80)}")
            continue
        for label in sorted(series[key]):
            ax.plot(*zip(*sorted(series[key][label]), strict=True), label=label, **STYLE["measured"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=5)
    _footnote(
        fig,
        "paper (blog Fig 4): on GH200, cast on the GPU then move fp32 is best [V]; its latencies "
        "are [MISSING]. On a CPU-only host the 'device' is the CPU, so this only checks the plumbing.",
    )
    return fig


def link_bandwidth(results: dict) -> plt.Figure:
    fig, (ax,) = _fig()
    ax.set_title("Host<->device link bandwidth vs transfer size", fontsize=10)
    drew = False
    cal = results["calibration"].get("data") if results["calibration"]["status"] == "ok" else None
    preset = (results["paper_comparison"].get("data") or {}).get("preset")
    for kind, prof in (("measured", cal), ("predicted", preset)):
        if not isinstance(prof, dict):
            continue
        for key, color in (
            ("h2d_pinned", "#1f77b4"),
            ("d2h_pinned", "#d62728"),
            ("h2d_pageable", "#2ca02c"),
            ("d2h_pageable", "#ff7f0e"),
        ):
            curve = prof.get(key)
            if isinstance(curve, dict) and curve.get("sizes") and curve.get("gbps"):
                name = prof.get("name", "")
                ax.plot(
                    curve["sizes"],
                    curve["gbps"],
                    color=color,
                    alpha=1.0 if kind == "measured" else 0.5,
                    label=f"{key} ({kind}{', ' + name if name else ''})",
                    **STYLE[kind],
                )
                drew = True
    if not drew:
        empty(
            ax,
            "No calibration profile and no preset profile: run `snakemake calibrate`.\n"
            + D.first_line(results["calibration"].get("error"), 90),
        )
        return fig
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per copy")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=6)
    ax.text(
        0.0,
        -0.22,
        "paper: C2C 450 GB/s per direction (vendor spec); '~64 MB buckets' [S]",
        transform=ax.transAxes,
        fontsize=7,
        color="#666666",
    )
    return fig


def gpu_timeline(results: dict) -> plt.Figure:
    """Utilization over time of one record per system (the largest config with a timeline)."""
    fig, (ax,) = _fig()
    best: dict[str, tuple] = {}
    for rec in results["runs"]:
        tl = (rec.get("telemetry") or {}).get("timeline") or []
        if rec.get("status") != "ok" or not tl:
            continue
        row = D.record_row(rec)
        key = (row["params"] or 0, row["seq"] or 0, row["batch"] or 0)
        if rec["system"] not in best or key > best[rec["system"]][0]:
            best[rec["system"]] = (key, row, tl)
    drew, host_only = False, False
    for system in _sys_sorted(best):
        _, row, tl = best[system]
        metric = "gpu_util_pct" if any("gpu_util_pct" in s for s in tl) else "host_cpu_pct"
        host_only |= metric == "host_cpu_pct"
        pts = [(s["t"], s[metric]) for s in tl if D.num(s.get(metric)) is not None and D.num(s.get("t")) is not None]
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                color=_color(system),
                linewidth=1,
                label=f"{system} {row['model']} s{row['seq']} ({metric}, measured)",
            )
            drew = True
    ax.set_title("Utilization timeline (telemetry samples)", fontsize=10)
    if not drew:
        empty(
            ax,
            "No telemetry timeline in the ok records (runs too short for the sampler, or no "
            "telemetry).\nPaper (blog Fig 2): GPU utilization ~50% (ZeRO-Offload) -> >80% (SuperOffload) [V]",
        )
        return fig
    for system, val in P.GPU_UTIL.items() if not host_only else ():
        ax.axhline(100 * val, color=_color(system), linestyle=":", linewidth=0.8)
        ax.text(0, 100 * val, f" paper {system} {100 * val:.0f}% [V]", fontsize=6, va="bottom")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("utilization (%)" + (" - host CPU, no GPU telemetry" if host_only else ""))
    ax.set_ylim(0, 105 if not host_only else None)
    ax.legend(fontsize=6)
    return fig


ROLLBACK_KEYS = ("steps", "speculated", "validate_first", "rolled_back", "clipped", "skipped", "committed")


def rollbacks(results: dict) -> plt.Figure:
    fig, (ax,) = _fig()
    bars = []
    for rec in sorted(results["runs"] + results["ablation"], key=lambda r: r.get("_path", "")):
        counts = D.rollback_counts(rec)
        if counts:
            row = D.record_row(rec)
            bars.append((f"{row['system']} {row['model']} s{row['seq']}\n{Path(rec.get('_path', '')).stem}", counts))
    ax.set_title("Speculation rollbacks per run (from records' `rollbacks`)", fontsize=10)
    if not bars:
        empty(
            ax,
            "No record carries rollback counters (no speculating system ran ok).\n"
            f"Paper: clipping in 93 of steps 1000-80000 of BLOOM ({100 * P.ROLLBACK_RATE:.2f}%) [V]",
        )
        return fig
    present = {k for _, c in bars for k in c if not k.endswith(("_s", "rate")) and "time" not in k}
    keys = [k for k in ROLLBACK_KEYS if k in present] + sorted(present - set(ROLLBACK_KEYS))
    keys = keys[:7]
    width = 0.8 / len(keys)
    for j, k in enumerate(keys):
        ax.bar(
            [i + (j - (len(keys) - 1) / 2) * width for i in range(len(bars))],
            [c.get(k, 0) for _, c in bars],
            width,
            label=k,
        )
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], rotation=30, ha="right", fontsize=5)
    ax.set_ylabel("count (measured)")
    ax.legend(fontsize=6)
    ax.set_title(
        f"Speculation rollbacks per run (records' `rollbacks`); paper: {100 * P.ROLLBACK_RATE:.2f}% of "
        "steps after warm-up (BLOOM) [V]",
        fontsize=8,
    )
    return fig


def paper_comparison(results: dict) -> plt.Figure:
    """predicted / paper for every paper_comparison row that has both (1.0 = the cost model agrees)."""
    fig, (ax,) = _fig(width=7.0, height=4.0)
    pc = results["paper_comparison"]
    rows = [
        r
        for r in ((pc.get("data") or {}).get("rows") or [])
        if D.num(r.get("predicted")) is not None and D.num(r.get("paper"))
    ]
    ax.set_title("Cost-model prediction vs the paper (predicted / paper)", fontsize=10)
    if not rows:
        empty(
            ax,
            f"No predicted-vs-paper rows (paper_comparison: {pc['status']}).\n" + D.first_line(pc.get("error"), 90),
        )
        return fig
    labels = [f"{r['figure']}: {r['point']} [{r.get('paper_status', '?')}]" for r in rows]
    ratios = [r["predicted"] / r["paper"] for r in rows]
    ax.barh(range(len(rows)), ratios, color=["#1f77b4" if 0.8 <= q <= 1.25 else "#ff7f0e" for q in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("predicted / paper")
    fig.tight_layout()
    return fig


FIGURES: dict[str, tuple[Callable[[dict], plt.Figure], str]] = {
    "throughput_vs_size": (
        throughput_vs_size,
        "Throughput (model TFLOPS per device) vs model size per "
        "system; measured lines, cost-model predictions for one GH200 dashed (Fig 10).",
    ),
    "mfu_vs_seq": (mfu_vs_seq, "MFU vs sequence length (model FLOPs, no recompute)."),
    "largest_model": (
        largest_model,
        "Largest trainable model per system: measured, predicted, paper (Fig 13).",
    ),
    "ablation": (
        ablation,
        "Ablation of the superoffload system, cumulative and leave-one-out, with the paper's per-technique factors.",
    ),
    "graceadam": (graceadam, "GraceAdam microbenchmark and its speed-ups vs the paper's table."),
    "cast": (cast, "Cast and transfer microbenchmark."),
    "link_bandwidth": (
        link_bandwidth,
        "Link bandwidth vs transfer size: calibration (measured) and the preset profile the predictions use.",
    ),
    "gpu_timeline": (gpu_timeline, "Utilization timeline from the records' telemetry."),
    "rollbacks": (rollbacks, "Speculation rollback counters from the records."),
    "paper_comparison": (paper_comparison, "Cost-model predictions divided by the paper's values."),
}


def svg_bytes(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "superoffload reports"}, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def render_all(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write every figure as <name>.svg; a figure that raises becomes an empty-state figure saying so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    with matplotlib.rc_context(RC):
        for name, (fn, _) in FIGURES.items():
            try:
                fig = fn(results)
            except Exception as e:  # noqa: BLE001 - one bad figure must not sink the report
                fig, (ax,) = _fig()
                empty(ax, f"{name}: could not draw ({type(e).__name__}: {D.first_line(str(e), 80)})")
            path = out / f"{name}.svg"
            path.write_bytes(svg_bytes(fig))
            paths[name] = path
    return paths
