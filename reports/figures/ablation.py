"""The ablation figure: the superoffload system with its techniques switched on one by one (cumulative)
and off one at a time (leave-one-out), beside the cost model's and the paper's per-technique factors."""

from __future__ import annotations

from pathlib import Path

from reports import data as D
from reports import paper as P
from reports.figures.common import empty, footnote, legend_outside, new_fig, plt, pred_rows, status_note

PRED_ABLATION = {
    "+GraceAdam": "host_optimizer",
    "+casting": "cast_policy",
    "+STV": "speculation",
    "+repartitioning": "device_tail_buckets",
}


def _predicted_ablation(results: dict) -> dict[str, float]:
    """technique -> the cost model's per-technique factor (paper_comparison 'ablation' rows)."""
    out = {}
    for r in pred_rows(results, "ablation"):
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
    return cum_rows, loo_rows, status_note(results["ablation"])


def ablation(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = new_fig(2, width=9.0, height=3.8)
    cum, loo, note = _ablation_data(results)
    for ax, rows, title, ylabel in (
        (ax1, cum, "Cumulative (speed-up vs baseline)", "throughput / baseline"),
        (ax2, loo, "Leave-one-out (all-on / without it)", "slow-down without the technique"),
    ):
        ax.set_title(title, fontsize=9)
        if not rows:
            empty(ax, "Ablation not run: `snakemake ablation` (part of `snakemake all`).")
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
                    # upright labels on 0.27-wide bars would run into their neighbours: written upwards
                    ax.text(i + (j - 1) * w, v, f" {v:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
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
        ax.set_ylim(0, max([v for r in rows for v in (r.get("measured"), r.get("predicted"), r.get("paper"))
                            if v is not None] + [1.0]) * 1.25)  # room for the labels above the bars
        ax.set_xticks(list(x), [r["label"] for r in rows], rotation=25, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        legend_outside(ax)
    footnote(
        fig,
        f"ablation records: {note}; paper factors 1.104 / 1.127 / 1.45 / 1.141 "
        f"(total {P.ABLATION_TOTAL}x, stacking order unknown)",
    )
    return fig
