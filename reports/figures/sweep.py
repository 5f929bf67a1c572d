"""Figures of the sweep's run records and the cost model's GH200 predictions, beside the paper's values:
throughput vs model size (Fig 10), MFU vs sequence length, the largest trainable model (Fig 13, also vs
chips), throughput on several ranks (measured) and chips (predicted, Fig 11), and predicted / paper for
every comparable point."""

from __future__ import annotations

from collections import defaultdict

from reports import data as D
from reports import paper as P
from reports.figures.common import (
    STYLE,
    empty,
    footnote,
    legend_outside,
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
        legend_outside(ax)
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
        legend_outside(axp)
    else:
        pc = results["paper_comparison"]
        empty(axp, f"No predictions ({pc['status']}).\n" + D.first_line(pc.get("error"), 80))
    footnote(
        fig,
        "paper (Fig 10): per-size values are not in the sources we could read; "
        "models absent on the right are predicted not to fit",
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
        legend_outside(ax)
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


def _chips(row: dict) -> int:
    c = row.get("chips")
    return c if isinstance(c, int) and c >= 1 else 1


def _chip_axis(ax, chips: set[int]) -> None:
    """A log2 chip-count axis labelled with the counts themselves."""
    ax.set_xscale("log", base=2)
    ticks = sorted(chips)
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.minorticks_off()


def _largest_predicted(results: dict) -> dict[str, dict[int, tuple[float, str]]]:
    """system -> chips -> (billions of parameters, the memory that binds it): the predictions file's
    largest-model rows (by whole blocks, workflows/scripts/binding.py), else its Fig 13 zoo-label rows."""
    out: dict[str, dict[int, tuple[float, str]]] = defaultdict(dict)
    data = results["paper_comparison"].get("data") or {}
    for r in data.get("largest") or []:
        if isinstance(r, dict) and r.get("params") and isinstance(r.get("chips"), int):
            memory = (r.get("binding") or {}).get("memory") or ""
            out[r["system"]][r["chips"]] = (r["params"] / 1e9, "" if memory == "none" else memory)
    if out:
        return out
    for r in pred_rows(results, "fig13"):
        if r.get("metric") == "largest_model_B" and D.num(r.get("predicted")) is not None:
            out[str(r.get("point", "")).split(" ")[-1]][_chips(r)] = (float(r["predicted"]), "")
    return out


def largest_model(results: dict) -> plt.Figure:
    """Left: the largest trainable model on one GH200 per system, predicted (grown by whole blocks while it
    fits; each bar says which memory binds it), the paper's value beside it, and on a GH200 the largest
    model measured here; one row per system, so no label can collide. Right: the predicted largest model
    against the chip count (Fig 13: 1, 4, 16 GH200), and measured points where the sweep ran several chips."""
    fig, (ax, axc) = new_fig(2, width=10.0, height=4.0)
    pred = _largest_predicted(results)
    measured: dict[str, float] = {}
    if D.on_gh200(results):  # on other hardware the largest model that ran says nothing about a GH200
        for r in map(D.record_row, results["runs"]):
            n = D.model_params(r["model"], r["params"])
            if r["status"] == "ok" and n:
                measured[r["system"]] = max(measured.get(r["system"], 0.0), n / 1e9)
    systems = sys_sorted({s for s in pred if 1 in pred[s]} | set(measured) | set(P.LARGEST_MODEL_B))[::-1]
    height = 0.26
    top = max([v[1][0] for v in ((s, pred[s].get(1, (0, ""))) for s in pred)] + [v[0] for v in
              P.LARGEST_MODEL_B.values()] + list(measured.values()) + [1.0])
    for i, system in enumerate(systems):
        bars = (("predicted", pred.get(system, {}).get(1)), ("paper", P.LARGEST_MODEL_B.get(system)),
                ("measured", (measured[system], "") if system in measured else None))
        for j, (kind, val) in enumerate(bars):
            if val is None:
                continue
            y = i + (1 - j) * height
            ax.barh(y, val[0], height, color=system_color(system), alpha=(0.55, 0.25, 1.0)[j],
                    hatch=("//", "..", "")[j], edgecolor="black", linewidth=0.5)
            label = {"predicted": f"{val[0]:.3g}B predicted" + (f", {val[1]} memory binds" if val[1] else ""),
                     "paper": f"{val[0]:.3g}B paper [{val[1]}]", "measured": f"{val[0]:.3g}B measured"}[kind]
            ax.text(val[0] + top * 0.01, y, label, va="center", ha="left", fontsize=6)
    ax.set_yticks(range(len(systems)), systems, fontsize=7)
    ax.set_xlim(0, top * 1.6)  # room for the labels right of the longest bar
    ax.set_xlabel("largest trainable model (billions of parameters)")
    ax.set_title("One GH200: predicted (hatched) and the paper's (dotted)", fontsize=9)
    if not systems:
        empty(ax, "No largest-model predictions: run the predictions (`snakemake all`).")
    multi: dict[str, dict[int, float]] = defaultdict(dict)
    for rec in results.get("multi_runs", []) if D.on_gh200(results) else []:
        r = D.record_row(rec)
        n = D.model_params(r["model"], r["params"])
        if r["status"] == "ok" and n:
            w = D.world_of(rec)
            multi[r["system"]][w] = max(multi[r["system"]].get(w, 0.0), n / 1e9)
    drew = False
    for system in sys_sorted(set(pred) | set(multi)):
        if len(pred.get(system, {})) > 1:
            xs = sorted(pred[system])
            axc.plot(xs, [pred[system][x][0] for x in xs], color=system_color(system), label=f"{system} (P)",
                     **STYLE["predicted"])
            drew = True
        if len(multi.get(system, {})) > 1:
            xs = sorted(multi[system])
            axc.plot(xs, [multi[system][x] for x in xs], color=system_color(system), label=f"{system} (M)",
                     **STYLE["measured"])
            drew = True
    axc.set_title("Predicted largest model vs chips (seq 2048, micro-batch 1)", fontsize=9)
    if drew:
        _chip_axis(axc, {c for pts in (*pred.values(), *multi.values()) for c in pts})
        axc.set_yscale("log")
        axc.set_xlabel("chips")
        axc.set_ylabel("billions of parameters")
        legend_outside(axc)
    else:
        empty(axc, "No multi-chip predictions: run the predictions (`snakemake all`).")
    footnote(fig, "predicted: the cost model on the gh200 preset, the largest zoo model grown by whole blocks while "
             "it fits (P); paper: 1 chip only (25B [V], 15B / 3.5B [S]); M: measured on GH200 chips")
    return fig


def scaling(results: dict) -> plt.Figure:
    """Several ranks. Left: this sweep's multi-rank records, tokens/s per device and aggregate, beside the
    same system's one-rank run. Right: predicted model TFLOPS per GH200 against the chip count for one
    model (the artifact's settings per count: 1 chip seq 1024 micro-batch 8; 4 chips seq 1024, 4 per chip;
    16 chips seq 2048, 1 per chip)."""
    fig, (ax, axp) = new_fig(2, width=10.0, height=3.8)
    rows = D.multi_rank_rows(results.get("multi_runs", []), results["runs"])
    # data parallelism only: sequence-parallel runs (sp > 1) are the seqlen figure's
    ok = [r for r in rows if r["status"] == "ok" and r["tokens_per_s"] and r["sp"] == 1]
    if ok:
        labels = []
        for x, r in enumerate(ok):
            one = r["one_rank_tokens_per_s"]
            bars = [("1 rank", one, 0.35), (f"W={r['world']} per device", r["tokens_per_s"], 0.7),
                    (f"W={r['world']} aggregate", r["aggregate_tokens_per_s"], 1.0)]
            for j, (_, val, alpha) in enumerate(bars):
                if val:
                    ax.bar(x + (j - 1) * 0.27, val, 0.27, color=system_color(r["system"]), alpha=alpha,
                           edgecolor="black", linewidth=0.5, hatch=("..", "", "//")[j])
            labels.append(f"{r['system']}\nW={r['world']}")
        ax.set_xticks(range(len(labels)), labels, fontsize=6)
        ax.set_ylabel("tokens/s")
        m = ok[0]
        ax.set_title(f"Measured: {m['model']} seq {m['seq']}, batch {m['batch_per_rank']}/rank\n"
                     "(dotted: 1 rank, plain: per device, hatched: aggregate)", fontsize=8)
    else:
        empty(ax, "No multi-rank records in this sweep.\n" + status_note(results.get("multi_runs", [])))
        ax.set_title("Measured: several ranks", fontsize=9)
    model = "gpt-13b"
    pred: dict[str, dict[int, float]] = defaultdict(dict)
    for fig_name in ("fig10", "fig11"):
        for r in pred_rows(results, fig_name):
            if r.get("metric") != "model_tflops" or D.num(r.get("predicted")) is None:
                continue
            m, _, system = str(r.get("point", "")).partition(" ")
            if m == model:
                pred[system][_chips(r)] = float(r["predicted"])
    axp.set_title(f"Predicted: {model}, TFLOPS per GH200 vs chips (cost model)", fontsize=9)
    if any(len(v) > 1 for v in pred.values()):
        for system in sys_sorted(pred):
            xs = sorted(pred[system])
            axp.plot(xs, [pred[system][c] for c in xs], color=system_color(system), label=system,
                     **STYLE["predicted"])
        _chip_axis(axp, {c for pts in pred.values() for c in pts})
        axp.set_xlabel("chips")
        axp.set_ylabel("model TFLOPS per chip")
        legend_outside(axp)
    else:
        empty(axp, "No multi-chip predictions (paper_comparison has no fig11 rows).")
    footnote(fig, "paper (Fig 11): per-size values not published in the sources read; claims: 2.5x ZeRO-Offload on "
             "average, up to +83% / +46% / +37% over Megatron / ZeRO-2 / ZeRO-3 [S]")
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
