"""Long sequences (the paper's Fig 12, `snakemake seqlen`): MFU per device against the global sequence length,
per system and chip count (Ulysses SP = the chip count in the paper's setting).

Left: the sweep's sequence-parallel records, measured on this machine (any status; OOM / error marked at
the bottom). Right: the cost model's Fig 12 predictions for GH200 (gpt-13b, 8K..1M tokens, 4 and 8 chips;
dashed, OOM marked), the paper's one published point (55 % MFU at 1M tokens on 8 GH200, [V]) as a
labelled star, and, when this sweep ran on GH200, its measured points on the same axes."""

from __future__ import annotations

from collections import defaultdict

from reports import data as D
from reports.figures.common import STYLE, empty, legend_outside, new_fig, plt, status_note, sys_key, system_color

CHIP_MARKERS = {2: "o", 4: "s", 8: "^", 16: "D"}


def _marker(chips: int) -> str:
    return CHIP_MARKERS.get(chips, "v")


def _cross(ax, seq: int, text: str, color: str, stack: dict[int, int]) -> None:
    """An x at MFU 0 with its label written upwards; labels at the same sequence length stand side by side
    (a rotated label is one line high, so neighbours never overlap)."""
    n = stack.get(seq, 0)
    stack[seq] = n + 1
    ax.scatter([seq], [0], marker="x", color=color, zorder=5)
    ax.annotate(text, (seq, 0), textcoords="offset points", xytext=(-4 + 8 * n, 6), ha="center", va="bottom",
                rotation=90, fontsize=6, color=color)


def _draw_measured(ax, rows: list[dict], label_suffix: str = "", stack: dict[int, int] | None = None) -> bool:
    """Measured lines per (system, chips); oom / error points as crosses at 0. True when anything was drawn."""
    stack = {} if stack is None else stack
    drew = False
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        if r["seq"]:  # a point needs its sequence length
            groups[(r["system"], r["chips"])].append(r)
    for (system, chips) in sorted(groups, key=lambda k: (sys_key(k[0]), k[1])):
        pts = sorted((r["seq"], 100 * r["mfu"]) for r in groups[(system, chips)]
                     if r["status"] == "ok" and r["mfu"] is not None)
        style = {**STYLE["measured"], "marker": _marker(chips)}
        if pts:
            ax.plot(*zip(*pts, strict=True), color=system_color(system),
                    label=f"{system}, {chips} chips (measured{label_suffix})", **style)
            drew = True
        bad = sorted((r["seq"], r["status"]) for r in groups[(system, chips)] if r["status"] in ("oom", "error"))
        for seq, status in bad:
            _cross(ax, seq, f"{status.upper()} {chips}", system_color(system), stack)
            drew = True
    return drew


def seqlen(results: dict) -> plt.Figure:
    fig, (ax, axp) = new_fig(2, width=10.5, height=4.0)
    rows = D.seqlen_rows(results)
    measured = [r for r in rows if r["kind"] == "measured"]
    models = sorted({r["model"] for r in measured})
    ax.set_title("Measured here: MFU/device vs sequence length" + (f" ({', '.join(models)})" if models else ""),
                 fontsize=9)
    if _draw_measured(ax, measured):
        ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1] * 1.1))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global sequence length (tokens; split over the SP ranks)")
        ax.set_ylabel("MFU per device (%)")
        legend_outside(ax)
    else:
        multi = [r for r in results.get("multi_runs", []) if D.sp_of(r) > 1]
        empty(ax, "No sequence-parallel records in this sweep (a matrix with `sp`).\n" + status_note(multi))

    preds = D.fig12_predictions(results.get("paper_comparison") or {})
    axp.set_title("GH200: predicted (cost model, Fig 12 settings)" + (" and measured" if D.on_gh200(results) else ""),
                  fontsize=9)
    drew = False
    stack: dict[int, int] = {}
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for p in preds:
        groups[(p["system"], p["chips"])].append(p)
    for (system, chips) in sorted(groups, key=lambda k: (sys_key(k[0]), k[1])):
        pts = sorted((p["seq"], 100 * p["mfu"]) for p in groups[(system, chips)] if p["mfu"] is not None)
        style = {**STYLE["predicted"], "marker": _marker(chips), "markerfacecolor": "none"}
        if pts:
            axp.plot(*zip(*pts, strict=True), color=system_color(system),
                     label=f"{system}, {chips} chips (predicted)", **style)
            drew = True
        for p in sorted(groups[(system, chips)], key=lambda q: q["seq"]):
            if p["mfu"] is None:
                _cross(axp, p["seq"], f"OOM {chips}", system_color(system), stack)
                drew = True
    if D.on_gh200(results):
        drew = _draw_measured(axp, [r for r in measured if r["model"] == D.FIG12_PAPER["model"]], ", GH200",
                              stack) or drew
    if drew:
        ref = D.FIG12_PAPER
        axp.scatter([ref["seq"]], [100 * ref["mfu"]], marker="*", s=120, color="black", zorder=6,
                    label="paper, 8 chips [V]")
        axp.annotate("paper: 55% MFU\n1M tokens, 8 GH200 [V]", (ref["seq"], 100 * ref["mfu"]),
                     textcoords="offset points", xytext=(-8, -4), ha="right", va="top", fontsize=6)
        axp.set_xscale("log", base=2)
        axp.set_xlabel("global sequence length (tokens)")
        axp.set_ylabel("MFU per chip (%)")
        axp.set_ylim(bottom=-3, top=max(65.0, axp.get_ylim()[1]))
        legend_outside(axp)
    else:
        pc = results.get("paper_comparison") or {}
        empty(axp, f"No Fig 12 predictions (paper_comparison: {pc.get('status', 'missing')}).\n"
              + D.first_line(pc.get("error"), 80))
    note = ("MFU = model FLOPs (6N + causal attention over the global sequence, no recompute) per device / peak; "
            "Ulysses SP = chips, micro-batch 1; predicted: gh200 preset.\nx = OOM (predicted; 'OOM <chips>') or "
            "oom / error (measured). The paper does not state its MFU formula (the artifact prints Megatron's, "
            "which counts recompute).")
    fig.text(0.01, 0.01, note, fontsize=7, color="#666666")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig
