"""Figures of what the run records observed while training: utilization timelines and speculation
rollback counters."""

from __future__ import annotations

from pathlib import Path

from reports import data as D
from reports import paper as P
from reports.figures.common import empty, legend_outside, new_fig, plt, sys_sorted, system_color


def _timelines(results: dict) -> dict[str, tuple]:
    """system -> (key, row, timeline) of its largest ok configuration with a telemetry timeline."""
    best: dict[str, tuple] = {}
    for rec in results["runs"]:
        tl = (rec.get("telemetry") or {}).get("timeline") or []
        if rec.get("status") != "ok" or not tl:
            continue
        row = D.record_row(rec)
        key = (row["params"] or 0, row["seq"] or 0, row["batch"] or 0)
        if rec["system"] not in best or key > best[rec["system"]][0]:
            best[rec["system"]] = (key, row, tl)
    return best


def _on_device(results: dict) -> bool:
    """Whether any timeline the figure draws has the GPU's utilization (else it shows the host CPU's)."""
    return any(any("gpu_util_pct" in s for s in tl) for _, _, tl in _timelines(results).values())


def utilization_title(results: dict) -> str:
    if not _timelines(results):
        return "Utilization over time"
    return "GPU utilization over time" if _on_device(results) else "Host CPU utilization over time (no GPU telemetry)"


def utilization(results: dict) -> plt.Figure:
    """Utilization over time of one record per system (the largest config with a timeline): the GPU's where
    the records have GPU telemetry, else the host CPU's, and the title says which."""
    fig, (ax,) = new_fig()
    best = _timelines(results)
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
                label=f"{system} {row['model']} s{row['seq']}",
            )
            drew = True
    ax.set_title(utilization_title(results) + ", measured", fontsize=10)
    if not drew:
        empty(ax, "No telemetry timeline in the ok records: runs of more steps give the sampler time to record one.")
        return fig
    for system, val in P.GPU_UTIL.items() if not host_only else ():
        ax.axhline(100 * val, color=system_color(system), linestyle=":", linewidth=0.8)
        ax.text(0, 100 * val, f" paper {system} {100 * val:.0f}% [V]", fontsize=6, va="bottom")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("host CPU utilization (%, all cores)" if host_only else "GPU utilization (%)")
    ax.set_ylim(0, 105 if not host_only else None)
    # the legend beside the axes, never over the lines
    legend_outside(ax)
    return fig


ROLLBACK_KEYS = ("steps", "speculated", "validate_first", "rolled_back", "clipped", "skipped", "committed")


def rollbacks(results: dict) -> plt.Figure:
    """Speculation counters per run that carries them (bars per counter); the legend beside the axes."""
    fig, (ax,) = new_fig(width=7.4)
    bars = []
    for rec in sorted(results["runs"] + results["ablation"], key=lambda r: r.get("_path", "")):
        counts = D.rollback_counts(rec)
        if counts:
            row = D.record_row(rec)
            kind = Path(rec.get("_path", "")).parent.name  # the system's folder, or "ablation"
            name = Path(rec.get("_path", "")).stem
            bars.append((f"{row['system']} {row['model']} s{row['seq']}" if kind != "ablation" else name, counts))
    ax.set_title("Speculation rollbacks per run (from records' `rollbacks`)", fontsize=10)
    if not bars:
        empty(ax, "No record carries rollback counters: a superoffload run (speculation on) that ends ok adds them.")
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
    ax.set_xticks(range(len(bars)), [b for b, _ in bars], rotation=90, fontsize=6)
    ax.set_ylabel("count (measured)")
    legend_outside(ax)
    ax.set_title(
        f"Speculation rollbacks per run (records' `rollbacks`); paper: {100 * P.ROLLBACK_RATE:.2f}% of "
        "steps after warm-up (BLOOM) [V]",
        fontsize=8,
    )
    return fig
