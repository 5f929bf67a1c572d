"""Figures of the microbenchmark files and the calibration: the GraceAdam kernel (`bench adam`), casting
and link bandwidth (`bench cast`), and the calibrated / preset link curves.

`bench adam` and `bench cast` files are read as their schemas define them
(superoffload/harness/adam_bench.schema.json, cast_bench.schema.json): reports.data loads them only if
they validate, and otherwise passes their status (missing, error, invalid) and the reason, which the
figure prints instead of drawing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from reports import data as D
from reports import paper as P
from reports.figures.common import STYLE, empty, footnote, legend_outside, new_fig, plt


def _unavailable(ax, what: str, item: dict) -> None:
    """The empty state of a microbenchmark figure: the file's status and why (a schema error in full)."""
    limit = 200 if item["status"] == "invalid" else 90
    empty(ax, f"{what} not available ({item['status']}).\n{D.first_line(item.get('error'), limit)}")


def adam_rows(adam: dict[str, Any] | None) -> list[dict]:
    """Flat rows {phase, impl, threads, numel, median_s, p10_s, p90_s, ns_per_param, gbps} of a valid
    adam_bench record: one per kernel (phase "kernels") and per host-phase sequence ("host_phase")."""
    out = []
    for m in (adam or {}).get("measurements", []):
        numel = float(m["numel"])
        for phase in ("kernels", "host_phase"):
            for impl, st in sorted(m[phase].items()):
                t = float(st["median_s"])
                out.append(
                    {
                        "phase": phase,
                        "impl": impl,
                        "threads": m["threads"],
                        "numel": numel,
                        "median_s": t,
                        "p10_s": float(st["p10_s"]),
                        "p90_s": float(st["p90_s"]),
                        "ns_per_param": t / numel * 1e9,
                        "gbps": float(st["gb_per_s"]) if phase == "kernels" else None,
                    }
                )
    return out


def adam_points(results: dict) -> list[dict]:
    """The optimizer-kernel rows (not the host-phase sequences) of the GraceAdam microbenchmark."""
    return [r for r in adam_rows(results["adam"].get("data")) if r["phase"] == "kernels"]


def graceadam(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = new_fig(2, width=9.0, height=3.6)
    pts = adam_points(results)
    ax1.set_title("Host Adam step, measured (ns per parameter)", fontsize=9)
    if not pts:
        _unavailable(ax1, "GraceAdam microbenchmark", results["adam"])
    else:
        labels = [f"{p['impl']}, {p['threads']} thr" for p in pts]
        ax1.bar(
            range(len(pts)),
            [p["ns_per_param"] for p in pts],
            color=["#d62728" if P.ADAM_KERNEL_COLUMN.get(p["impl"]) == "grace-adam" else "#1f77b4" for p in pts],
        )
        ax1.set_xticks(range(len(pts)), labels, rotation=90, fontsize=6)
        ax1.set_ylabel("ns / parameter")
    # speed-up ratios: ours (best over threads per kernel) vs the paper's table
    ax2.set_title("Speed-up of GraceAdam: measured vs paper [V]", fontsize=9)
    best: dict[str, float] = {}
    for p in pts:
        key = P.ADAM_KERNEL_COLUMN.get(p["impl"])
        if key:
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
    legend_outside(ax2)
    fig.tight_layout()
    return fig


CAST_PATHS = ("grad_path", "param_path")


def cast_series(results: dict) -> dict[str, dict[str, list]]:
    """{"latency": {series: [(bytes, seconds)]}, "bandwidth": {series: [(bytes, GB/s)]}} of a valid
    cast_bench record: one latency series per casting path and policy, one bandwidth series per link
    direction and host memory."""
    out: dict[str, dict[str, list]] = {"latency": defaultdict(list), "bandwidth": defaultdict(list)}
    data = results["cast"].get("data")
    if not data:
        return out
    for r in data["link"]:
        out["bandwidth"][f"link: {r['direction']} {r['memory']}"].append((float(r["size_bytes"]), float(r["gbps"])))
    for name in CAST_PATHS:
        for r in data[name]:
            out["latency"][f"{name}: {r['path']} {r['policy']}"].append(
                (float(r["size_bytes"]), float(r["median_s"]))
            )
    return out


def cast(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = new_fig(2, width=10.0, height=3.8)
    series = cast_series(results)
    c = results["cast"]
    for ax, key, ylabel, title in (
        (ax1, "latency", "seconds (median)", "Cast + transfer paths (measured)"),
        (ax2, "bandwidth", "GB/s", "Host<->device copies (measured)"),
    ):
        ax.set_title(title, fontsize=9)
        if not series[key]:
            if c["status"] == "invalid":
                _unavailable(ax, "Cast microbenchmark", c)
            else:
                empty(ax, f"Cast microbenchmark: no {key} data ({c['status']}).\n{D.first_line(c.get('error'), 80)}")
            continue
        for label in sorted(series[key]):
            ax.plot(*zip(*sorted(series[key][label]), strict=True), label=label, **STYLE["measured"])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
        legend_outside(ax, 5)
    footnote(
        fig,
        "paper (blog Fig 4): on GH200, cast on the GPU then move fp32 is best [V]; its latencies "
        "are not published. On a CPU-only host the 'device' is the CPU, so this only checks the plumbing.",
    )
    return fig


def link_bandwidth(results: dict) -> plt.Figure:
    fig, (ax,) = new_fig()
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
    legend_outside(ax)
    ax.text(
        0.0,
        -0.22,
        "paper: C2C 450 GB/s per direction (vendor spec); '~64 MB buckets' [S]",
        transform=ax.transAxes,
        fontsize=7,
        color="#666666",
    )
    return fig
