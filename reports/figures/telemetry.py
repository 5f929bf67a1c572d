"""Figures of what the run records observed while training: utilization timelines and speculation
rollback counters."""

from __future__ import annotations

from pathlib import Path

from reports import data as D
from reports import paper as P
from reports.figures.common import empty, new_fig, plt, sys_sorted, system_color


def gpu_timeline(results: dict) -> plt.Figure:
    """Utilization over time of one record per system (the largest config with a timeline)."""
    fig, (ax,) = new_fig()
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
    for system in sys_sorted(best):
        _, row, tl = best[system]
        metric = "gpu_util_pct" if any("gpu_util_pct" in s for s in tl) else "host_cpu_pct"
        host_only |= metric == "host_cpu_pct"
        pts = [(s["t"], s[metric]) for s in tl if D.num(s.get(metric)) is not None and D.num(s.get("t")) is not None]
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                color=system_color(system),
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
        ax.axhline(100 * val, color=system_color(system), linestyle=":", linewidth=0.8)
        ax.text(0, 100 * val, f" paper {system} {100 * val:.0f}% [V]", fontsize=6, va="bottom")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("utilization (%)" + (" - host CPU, no GPU telemetry" if host_only else ""))
    ax.set_ylim(0, 105 if not host_only else None)
    ax.legend(fontsize=6)
    return fig


ROLLBACK_KEYS = ("steps", "speculated", "validate_first", "rolled_back", "clipped", "skipped", "committed")


def rollbacks(results: dict) -> plt.Figure:
    fig, (ax,) = new_fig()
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
