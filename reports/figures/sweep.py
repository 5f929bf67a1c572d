"""Figures of the sweep's run records and the cost model's GH200 predictions, beside the paper's values:
throughput vs model size (Fig 10), MFU vs sequence length, the largest trainable model (Fig 13), and
predicted / paper for every comparable point."""

from __future__ import annotations

from collections import defaultdict

from reports import data as D
from reports import paper as P
from reports.figures.common import (
    STYLE,
    empty,
    footnote,
    new_fig,
    params_of,
    plt,
    pred_rows,
    status_note,
    sys_sorted,
    system_color,
)


def throughput_vs_size(results: dict) -> plt.Figure:
    """Model TFLOPS per device vs parameters, per system (the Fig 10 shape): measured on this hardware
    (left) and the cost model's prediction for one GH200 (right; different hardware, so its own axes)."""
    fig, (ax, axp) = new_fig(2, width=10.0, height=3.8)
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
        for system in sys_sorted({r["system"] for r in sel}):
            pts = sorted((r["params"], r["tflops"]) for r in sel if r["system"] == system and r["tflops"])
            if pts:
                ax.plot(*zip(*pts, strict=True), color=system_color(system), label=system, **STYLE["measured"])
                drew = True
            bad = sorted(r["params"] for r in sel if r["system"] == system and r["status"] != "ok")
            if bad:
                ax.scatter(
                    bad,
                    [0] * len(bad),
                    marker="x",
                    color=system_color(system),
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
        empty(ax, "No measured throughput: no run records.\n" + status_note(results["runs"]))
    pred: dict[str, list] = defaultdict(list)
    for r in pred_rows(results, "fig10"):
        if r.get("metric") != "model_tflops" or " " not in str(r.get("point")):
            continue
        model, system = str(r["point"]).split(" ", 1)
        params = params_of(model)
        if params and D.num(r.get("predicted")) is not None:
            pred[system].append((params, r["predicted"]))
    axp.set_title("Predicted: one GH200 (cost model; Fig 10 setting)", fontsize=9)
    if pred:
        for system in sys_sorted(pred):
            pts = sorted(pred[system])
            axp.plot(*zip(*pts, strict=True), color=system_color(system), label=system, **STYLE["predicted"])
        axp.set_xscale("log")
        axp.set_xlabel("parameters")
        axp.set_ylabel("model TFLOPS per device")
        axp.legend(fontsize=6)
    else:
        pc = results["paper_comparison"]
        empty(axp, f"No predictions ({pc['status']}).\n" + D.first_line(pc.get("error"), 80))
    footnote(
        fig,
        "paper (Fig 10): per-size values are not in the sources we could read ([MISSING]); "
        "missing models on the right = predicted not to fit",
    )
    return fig


def mfu_vs_seq(results: dict) -> plt.Figure:
    fig, (ax,) = new_fig()
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
            + status_note(results["runs"]),
        )
        ax.set_title("MFU vs sequence length", fontsize=10)
        return fig
    model, batch = best[0]
    sel = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
    drew = False
    for system in sys_sorted({r["system"] for r in sel}):
        pts = sorted((r["seq"], 100 * r["mfu"]) for r in sel if r["system"] == system and r["mfu"] is not None)
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                color=system_color(system),
                label=f"{system} (measured)",
                **STYLE["measured"],
            )
            drew = True
        bad = sorted(r["seq"] for r in sel if r["system"] == system and r["status"] != "ok")
        if bad:
            ax.scatter(bad, [0] * len(bad), marker="x", color=system_color(system), label=f"{system} oom/error")
            drew = True
    if not drew:
        empty(ax, f"No ok records for {model} batch {batch}. " + status_note(sel))
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
    fig, (ax,) = new_fig()
    measured: dict[str, float] = {}
    for r in map(D.record_row, results["runs"]):
        if r["status"] == "ok" and r["params"]:
            measured[r["system"]] = max(measured.get(r["system"], 0.0), r["params"] / 1e9)
    predicted: dict[str, float] = {}
    for r in pred_rows(results, "fig13"):
        system = str(r.get("point", "")).split(" ")[-1]
        if D.num(r.get("predicted")) is not None:
            predicted[system] = float(r["predicted"])
    systems = sys_sorted(set(measured) | set(predicted) | set(P.LARGEST_MODEL_B))
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
                color=system_color(system),
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


def paper_comparison(results: dict) -> plt.Figure:
    """predicted / paper for every paper_comparison row that has both (1.0 = the cost model agrees)."""
    fig, (ax,) = new_fig(width=7.0, height=4.0)
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
