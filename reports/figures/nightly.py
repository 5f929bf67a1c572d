"""Trend figures of the nightly history (superoffload.nightly): one per judged (case, metric) of a suite on
one fingerprint, for the nightly page (``reports/render.py nightly``); not part of the sweep report's FIGURES.

Each figure: x = the nights the case ran, oldest first (ticks: short commit and date, thinned); y = the metric
in human units (tokens/s, ms or µs for seconds, MiB for bytes). Drawn: every repeat as a small grey dot, the
night median as a line, the baseline band of each judged night (what the rule allowed around the baseline's
median; its bad side a red dotted edge), change points (superoffload.nightly.changes) as dashed vertical lines
labelled with the change and the commit range, and the rules' labels as markers (regression red, suspicious
orange, improvement green, insufficient data grey hollow). Text metrics (status, loss hash) have no figure:
the page shows them as a table. SVGs are byte-stable as every report figure's (reports.figures.common.RC,
reports.figures.svg_bytes: no date, fixed hash salt, text as text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import matplotlib

from reports.figures import svg_bytes
from reports.figures.common import RC, empty, plt
from superoffload.nightly import rules as R
from superoffload.nightly.changes import ChangePoint, detect
from superoffload.nightly.metrics import SUITES, Metric
from superoffload.nightly.store import History, Night, Sample

CATEGORICAL = ("status", "identical")  # rules whose values are texts: a table on the page, no figure
MAX_TICKS = 10

# label -> (colour, filled, marker); a label not here (ok) is drawn as the median line's own small dot
LABEL_STYLE: dict[str, tuple[str, bool, str]] = {
    R.CORRECTNESS: ("#d62728", True, "o"),
    R.REGRESSION: ("#d62728", True, "o"),
    R.SUSPICIOUS: ("#ff7f0e", True, "o"),
    R.IMPROVEMENT: ("#2ca02c", True, "o"),
    R.POSSIBLE_IMPROVEMENT: ("#2ca02c", False, "o"),
    R.RECOVERED: ("#2ca02c", True, "o"),
    R.NONDETERMINISTIC: ("#9467bd", True, "s"),
    R.INTENDED: ("#9467bd", True, "D"),
    R.INSUFFICIENT: ("#999999", False, "o"),
}
LINE = "#1f77b4"
BAND = "#1f77b4"
BAD_EDGE = "#d62728"
LEGEND_ORDER = ["repeats", "night median", "baseline median", "allowed band", "alarm edge", "change point",
                "missing"]


@dataclass
class Trend:
    """One (case, metric) series of the page: its judgements, samples per night and change points."""

    case: str
    metric: Metric
    series: list[R.Judgement]
    samples: list[list[Sample]]
    changes: list[ChangePoint] = field(default_factory=list)

    @property
    def numeric(self) -> bool:
        return self.metric.rule not in CATEGORICAL

    @property
    def latest(self) -> R.Judgement:
        return self.series[-1]


def scale(metric: Metric, values: list[float]) -> tuple[float, str]:
    """(factor, unit) that turns the stored SI value into the unit the axis shows."""
    if metric.unit == "B":
        return 1 / 2**20, "MiB"
    if metric.unit == "s":
        return (1e6, "µs") if values and max(abs(v) for v in values) < 1e-3 else (1e3, "ms")
    return 1.0, metric.unit


def band(j: R.Judgement, metric: Metric) -> tuple[float, float] | None:
    """(low, high) of the values the rule let pass on this night, around the baseline's median; None when the
    night had no numeric baseline (insufficient data, missing). Relative metrics are judged on a log scale
    (rules._violation), so their band is baseline / (1 + allowed) .. baseline x (1 + allowed)."""
    b, a = j.baseline, j.allowed
    if not isinstance(b, float) or a is None or not math.isfinite(a):
        return None
    if metric.rule == "bounded":
        return b - a, b + a
    if metric.rule == "relative" and b > 0:
        return b / (1 + a), b * (1 + a)
    return b * (1 - a), b * (1 + a)


def tick_positions(n: int, max_ticks: int = MAX_TICKS) -> list[int]:
    """At most ``max_ticks`` evenly spaced night indices, always the newest night."""
    if n <= 0:
        return []
    step = max(1, math.ceil(n / max_ticks))
    ticks = list(range(0, n, step))
    ticks[-1] = n - 1  # the newest night instead of the last multiple: still at least `step` from the one before
    return ticks


def tick_label(night: Night) -> str:
    commit = (night.commit or "unknown")[:7] + ("+" if night.dirty else "")
    return f"{commit}\n{night.utc[5:10]}"


def short_range(cp: ChangePoint) -> str:
    return f"{(cp.good.commit or 'unknown')[:7]}..{(cp.bad.commit or 'unknown')[:7]}"


def change_text(cp: ChangePoint, metric: Metric) -> str:
    """The change of a change point: relative, or absolute for a rate (as the rules judge it)."""
    if metric.rule == "bounded":
        return f"{cp.after - cp.before:+.3f}"
    return f"{100 * cp.change:+.1f} %" if math.isfinite(cp.change) else "new"


def trend(t: Trend) -> plt.Figure:
    """The trend figure of one numeric series (call under matplotlib.rc_context(RC), as trend_svg does)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.3))
    m = t.metric
    nights = [j.night for j in t.series]
    xs_of = {n.id: i for i, n in enumerate(nights)}
    raw = [v for s in t.samples for v in (x.value for x in s) if v is not None]
    factor, unit = scale(m, raw)
    ax.set_title(f"{t.case}: {m.name}", fontsize=9, loc="left")
    if not raw:
        empty(ax, f"{m.name}: no values in {len(nights)} nights (the case ran, the metric was not recorded)")
        return fig
    # the baseline band, per judged night: what the rule let pass, its bad side marked
    bad_low = m.better == "higher"
    drew_band = False
    for i, j in enumerate(t.series):
        got = band(j, m)
        if got is None:
            continue
        lo, hi = got[0] * factor, got[1] * factor
        ax.bar(i, hi - lo, bottom=lo, width=1.0, color=BAND, alpha=0.12, linewidth=0,
               label="allowed band" if not drew_band else None, zorder=1)
        ax.hlines(float(j.baseline) * factor, i - 0.5, i + 0.5, colors=BAND, linewidth=0.6, alpha=0.6,
                  linestyles="-", label="baseline median" if not drew_band else None, zorder=2)
        ax.hlines(lo if bad_low else hi, i - 0.5, i + 0.5, colors=BAD_EDGE, linewidth=0.9, linestyles=":",
                  label="alarm edge" if not drew_band else None, zorder=2)
        drew_band = True
    # every repeat, then the night medians
    rep_x, rep_y = [], []
    for i, samples in enumerate(t.samples):
        vals = [s.value for s in samples if s.value is not None]
        for k, v in enumerate(vals):
            rep_x.append(i + (0.0 if len(vals) == 1 else -0.15 + 0.3 * k / (len(vals) - 1)))
            rep_y.append(v * factor)
    ax.scatter(rep_x, rep_y, s=5, color="#7f7f7f", alpha=0.7, linewidths=0, label="repeats", zorder=3)
    med = [(i, j.value * factor) for i, j in enumerate(t.series) if isinstance(j.value, float)]
    ax.plot([x for x, _ in med], [y for _, y in med], color=LINE, lw=1.2, marker="o", ms=2.5,
            label="night median", zorder=4)
    # the labels: a marker per night that is not plain ok
    for label, (color, filled, marker) in LABEL_STYLE.items():
        pts = [(i, j.value * factor) for i, j in enumerate(t.series) if j.label == label and isinstance(j.value, float)]
        if pts:
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=34, marker=marker, zorder=5, linewidths=1.1,
                       facecolors=color if filled else "none", edgecolors=color, label=label)
    missing = [i for i, j in enumerate(t.series) if not isinstance(j.value, float)]
    if missing:
        ax.scatter(missing, [0.03] * len(missing), marker="x", s=18, color="#999999",
                   transform=ax.get_xaxis_transform(), label="missing", zorder=5)
    # change points: a dashed line between the last good and the first bad night, labelled away from the
    # level after the change (a drop is labelled at the top, a rise at the bottom), staggered when close
    placed: list[tuple[float, bool]] = []
    for cp in t.changes:
        if cp.good.id not in xs_of or cp.bad.id not in xs_of:
            continue
        x = (xs_of[cp.good.id] + xs_of[cp.bad.id]) / 2
        ax.axvline(x, color="#444444", lw=0.9, ls="--", zorder=2,
                   label="change point" if not placed else None)
        top = cp.after < cp.before
        level = sum(1 for px, ptop in placed if ptop == top and abs(px - x) < 0.18 * len(nights))
        y = (0.97 - 0.13 * level) if top else (0.03 + 0.13 * level)
        right = x > 0.7 * len(nights)  # near the newest night: the label on the line's left, inside the axes
        ax.text(x - 0.15 if right else x + 0.15, y, f"{change_text(cp, m)}\n{short_range(cp)}",
                transform=ax.get_xaxis_transform(), ha="right" if right else "left", va="top" if top else "bottom",
                fontsize=6.5, color="#222222", zorder=6,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#bbbbbb", alpha=0.85, lw=0.5))
        placed.append((x, top))
    lo_y, hi_y = ax.get_ylim()
    span = (hi_y - lo_y) or abs(hi_y) or 1.0
    pad_top = 0.30 if any(top for _, top in placed) else 0.05
    pad_bottom = 0.30 if any(not top for _, top in placed) else 0.05
    ax.set_ylim(lo_y - pad_bottom * span, hi_y + pad_top * span)
    ticks = tick_positions(len(nights))
    ax.set_xticks(ticks)
    ax.set_xticklabels([tick_label(nights[i]) for i in ticks], fontsize=6.5)
    ax.set_xlim(-0.6, len(nights) - 0.4)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_ylabel(f"{m.name} ({unit})" if unit else m.name, fontsize=8)
    better = {"higher": "higher is better", "lower": "lower is better"}.get(m.better, "")
    ax.set_xlabel(f"night (commit, UTC date); {m.rule} rule{', ' + better if better else ''}", fontsize=7)
    # the legend below the axes (never over the data); bbox_inches="tight" keeps it in the SVG
    handles, labels = ax.get_legend_handles_labels()
    order = [*LEGEND_ORDER, *LABEL_STYLE]
    pairs = sorted(zip(handles, labels, strict=True), key=lambda hl: order.index(hl[1]) if hl[1] in order else 99)
    ax.legend([h for h, _ in pairs], [lab for _, lab in pairs], loc="upper center", bbox_to_anchor=(0.5, -0.24),
              ncol=5, fontsize=6.5, frameon=False, handletextpad=0.4, columnspacing=1.2)
    return fig


def trend_svg(t: Trend) -> str:
    """The trend figure of one series as SVG text, byte-identical for the same history."""
    with matplotlib.rc_context(RC):
        return svg_bytes(trend(t)).decode()


def trends(history: History, suite: str, fingerprint: str, cfg: R.RuleConfig, repo: str | None = None,
           judged: dict[tuple[str, str], list[R.Judgement]] | None = None) -> list[Trend]:
    """Every judged (case, metric) series of a suite on one fingerprint, sorted by case then the catalog's
    metric order, with its change points (numeric series only)."""
    catalog = SUITES[suite]
    judged = R.judge(history, suite, fingerprint, cfg, repo=repo) if judged is None else judged
    order = list(catalog)
    values = history.values(history.nights(suite, fingerprint))  # once: each series is a subset of these nights
    out = []
    for (case, metric), series in sorted(judged.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        nights = [j.night for j in series]
        samples = [values.get(n.id, {}).get((case, metric), []) for n in nights]
        t = Trend(case, catalog[metric], series, samples)
        if t.numeric:
            t.changes = detect(case, catalog[metric], nights, samples, cfg)
        out.append(t)
    return out
