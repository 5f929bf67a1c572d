"""The nightly's outputs: a Markdown summary to post, and the verdict file a scheduler reads."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from superoffload.nightly.changes import ChangePoint
from superoffload.nightly.fingerprint import describe
from superoffload.nightly.metrics import Metric
from superoffload.nightly.rules import ALERTS, INSUFFICIENT, OK, Judgement
from superoffload.nightly.store import Night


def newest(rows: list[Judgement]) -> Night:
    """The night judged (a ``missing`` row carries the older night its case last ran in)."""
    return max((j.night for j in rows), key=lambda n: n.id)


def fmt_value(v: Any, m: Metric | None) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v if len(v) <= 18 else v[:16] + "…"
    unit = m.unit if m else ""
    if unit == "B":
        return f"{v / 2**20:,.1f} MiB"
    if unit == "s":
        return f"{v * 1e3:,.2f} ms" if v < 10 else f"{v:,.1f} s"
    if unit == "tokens/s":
        return f"{v:,.0f}"
    return f"{v:.4g}"


def fmt_change(j: Judgement, m: Metric | None) -> str:
    if j.change is None or not math.isfinite(j.change):
        return "–"
    if m is not None and m.rule == "bounded":
        return f"{j.change:+.3f}"
    return f"{100 * j.change:+.1f} %"


def fmt_allowed(j: Judgement, m: Metric | None) -> str:
    if j.allowed is None:
        return "–"
    if m is not None and m.rule == "bounded":
        return f"±{j.allowed:.3f}"
    return f"±{100 * j.allowed:.1f} %"


@dataclass(frozen=True)
class Checked:
    """What `nightly check` found for the newest night of a suite on one fingerprint."""

    suite: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    rows: list[Judgement]  # the newest night's judgement per case and metric, most severe first
    ranges: dict[tuple[str, str], str]  # (case, metric) -> the commit range of its violation
    changes: list[ChangePoint]
    bisect_cmds: list[str]


def markdown(c: Checked, catalog: dict[str, Metric]) -> str:
    suite, fingerprint, rows, ranges, changes, bisect_cmds = (c.suite, c.fingerprint, c.rows, c.ranges, c.changes,
                                                              c.bisect_cmds)
    if not rows:
        return f"# Nightly {suite}: no nights recorded\n"
    night = newest(rows)
    counts: dict[str, int] = {}
    for j in rows:
        counts[j.label] = counts.get(j.label, 0) + 1
    alerts = [j for j in rows if j.alert]
    head = "**" + (f"{len(alerts)} regression{'s' if len(alerts) != 1 else ''}" if alerts else "no regression") + "**"
    others = ", ".join(f"{n} {label}" for label, n in counts.items() if label not in (*ALERTS, OK))
    lines = [
        f"# Nightly {suite}: {night.utc}, commit {night.short_commit}",
        "",
        f"{head}{'; ' + others if others else ''}; {counts.get(OK, 0)} ok, over {len({j.case for j in rows})} "
        f"cases. Fingerprint `{night.fingerprint}`: {describe(fingerprint)}.",
        "",
    ]
    notable = [j for j in rows if j.label not in (OK, INSUFFICIENT)]
    waiting = [j for j in rows if j.label == INSUFFICIENT]
    if waiting:
        lines += [f"{len(waiting)} series have too little history on this fingerprint to be judged "
                  f"({waiting[0].note}).", ""]
    if notable:
        lines += ["| case | metric | baseline | now | change | allowed | label | commits |",
                  "|---|---|---|---|---|---|---|---|"]
        for j in notable:
            m = catalog.get(j.metric)
            lines.append(
                f"| {j.case} | {j.metric} | {fmt_value(j.baseline, m)} | {fmt_value(j.value, m)} | "
                f"{fmt_change(j, m)} | {fmt_allowed(j, m)} | {'**' + j.label + '**' if j.alert else j.label} | "
                f"{ranges.get((j.case, j.metric), '')} |"
            )
        lines.append("")
    if changes:
        lines += ["Change points over the whole history (PELT):", "",
                  "| case | metric | before → after | change | commits | first night |", "|---|---|---|---|---|---|"]
        for cp in changes:
            m = catalog.get(cp.metric)
            lines.append(f"| {cp.case} | {cp.metric} | {fmt_value(cp.before, m)} → {fmt_value(cp.after, m)} | "
                         f"{100 * cp.change:+.1f} % | {cp.commit_range} | {cp.bad.utc} |")
        lines.append("")
    if bisect_cmds:
        lines += ["To find the commit:", "", "```", *bisect_cmds, "```", ""]
    return "\n".join(lines)


def verdict(c: Checked) -> dict[str, Any]:
    rows, ranges, changes = c.rows, c.ranges, c.changes
    alerts = [j for j in rows if j.alert]
    night = newest(rows) if rows else None
    return {
        "suite": c.suite,
        "fingerprint": c.fingerprint_key,
        "fingerprint_fields": c.fingerprint,
        "night": night.id if night else None,
        "commit": night.commit if night else None,
        "rows": [{**j.as_dict(), "commits": ranges.get((j.case, j.metric))} for j in rows],
        "change_points": [
            {"case": cp.case, "metric": cp.metric, "before": cp.before, "after": cp.after, "change": cp.change,
             "commits": cp.commit_range, "night": cp.bad.id, "utc": cp.bad.utc}
            for cp in changes
        ],
        "regression": bool(alerts),
        "regressed": sorted({f"{j.case}:{j.metric}" for j in alerts}),
        "bisect": c.bisect_cmds,
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
