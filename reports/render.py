"""Render a results folder: deterministic SVG figures, and one self-contained HTML report.

    python reports/render.py figures --results results/cpu_smoke --out results/cpu_smoke/figures
    python reports/render.py html --results results/cpu_smoke --figures results/cpu_smoke/figures \
        --out results/cpu_smoke/report.html
    python reports/render.py nightly --store results/history/nightly.sqlite --out results/history/nightly.html \
        [--suite training|microbench|all] [--fingerprint KEY] [the rule flags of `superoffload nightly check`]

`nightly` renders the nightly history (superoffload.nightly) as one page: the newest night's verdict first
(labels, the rows that are not ok with their commit ranges, the bisect commands), the change points, a trend
figure per judged case and metric (reports/figures/nightly.py), the text metrics' recent values, and the
fingerprints of the history. A suite without nights says so.

Templates: reports/templates/*.html.j2, rendered with Jinja2 and StrictUndefined (a missing key is an
error, never a silent blank). Figures are embedded as base64 SVG data URIs, so the HTML is one file.
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jinja2  # noqa: E402

from reports import data as D  # noqa: E402
from reports import figures as F  # noqa: E402
from reports import formatting  # noqa: E402
from reports.context import build_context  # noqa: E402,F401  (tests and callers build the context here)

TEMPLATES = Path(__file__).with_name("templates")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(formatting.FILTERS)
    return env


def render_html(results_dir: str | Path, figures_dir: str | Path, out: str | Path) -> Path:
    results = D.load_results(results_dir)
    figs = {p.stem: p for p in sorted(Path(figures_dir).glob("*.svg"))} if Path(figures_dir).is_dir() else {}
    html = environment().get_template("report.html.j2").render(**build_context(results, figs))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    return out


# --- the nightly page ------------------------------------------------------------------------------------
NIGHTLY_SUITES = ("training", "microbench")
STRIP_NIGHTS = 14  # nights shown in the table of the text metrics (status, loss hash)
LABEL_CLASS = {  # the badge of each label on the nightly page (nightly.html.j2's styles)
    "correctness regression": "lab-bad", "regression": "lab-bad", "suspicious": "lab-warn",
    "improvement": "lab-good", "possible improvement": "lab-good", "recovered": "lab-good",
    "nondeterministic": "lab-odd", "baseline reset": "lab-odd", "missing": "lab-grey",
    "insufficient data": "lab-grey", "ok": "lab-ok",
}


def _svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _text_cell(j: Any) -> dict[str, str]:
    v = "–" if j.value is None else str(j.value)
    return {"text": v if len(v) <= 10 else v[:8] + "…", "title": f"{v} ({j.label})",
            "cls": LABEL_CLASS.get(j.label, "lab-grey")}


def nightly_suite(h: Any, suite: str, fp_want: str | None, cfg: Any, repo: str | None) -> dict[str, Any]:
    """The page section of one suite: newest night's verdict, change points, figures, text metrics,
    fingerprints. A suite without nights (or without the wanted fingerprint) is a section that says so."""
    from reports.figures import nightly as NF
    from superoffload.nightly import cli as NC
    from superoffload.nightly import fingerprint as FP
    from superoffload.nightly import rules as NR
    from superoffload.nightly import summary as NS

    section: dict[str, Any] = {"suite": suite, "message": "", "fingerprints": []}
    fps = h.fingerprints(suite)
    got = NC.pick_fingerprint(h, suite, fp_want) if fps else None  # ValueError: no such fingerprint
    if got is None:
        section["message"] = f"No {suite} nights in the history yet: `superoffload nightly record` adds them."
        return section
    key, fields = got
    section["fingerprints"] = [
        {"key": k, "description": FP.describe(f), "nights": n, "latest": last, "shown": k == key}
        for k, f, n, last in fps
    ]
    section["fingerprint"] = {"key": key, "description": FP.describe(fields)}
    judged = NR.judge(h, suite, key, cfg, repo=repo)
    if not judged:
        section["message"] = f"The {suite} nights on fingerprint {key} hold no judged metric."
        return section
    catalog = NF.SUITES[suite]
    _, verdict = NC.check(h, suite, cfg, key, repo=repo)
    commits = {(r["case"], r["metric"]): r.get("commits") or "" for r in verdict["rows"]}
    nights = {n.id: n for n in h.nights(suite, key)}
    target = max(s[-1].night.id for s in judged.values())
    night = nights[target]
    rows = NR.latest(judged, target)
    counts: dict[str, int] = {}
    for j in rows:
        counts[j.label] = counts.get(j.label, 0) + 1
    waiting = [j for j in rows if j.label == NR.INSUFFICIENT]
    section.update(
        night={"id": night.id, "utc": night.utc, "commit": night.commit or "unknown", "short": night.short_commit,
               "cases": len({j.case for j in rows})},
        regression=bool(verdict["regression"]),
        regressed=verdict["regressed"],
        counts=[{"label": lab, "n": counts[lab], "cls": LABEL_CLASS.get(lab, "lab-grey")}
                for lab in NR.SEVERITY if lab in counts],
        rows=[
            {"case": j.case, "metric": j.metric, "baseline": NS.fmt_value(j.baseline, catalog.get(j.metric)),
             "now": NS.fmt_value(j.value, catalog.get(j.metric)), "change": NS.fmt_change(j, catalog.get(j.metric)),
             "allowed": NS.fmt_allowed(j, catalog.get(j.metric)), "label": j.label,
             "cls": LABEL_CLASS.get(j.label, "lab-grey"), "alert": j.alert,
             "commits": commits.get((j.case, j.metric), ""), "note": j.note}
            for j in rows if j.label not in (NR.OK, NR.INSUFFICIENT)
        ],
        waiting={"count": len(waiting), "note": waiting[0].note if waiting else ""},
        bisect=list(verdict["bisect"]),
    )
    trends = NF.trends(h, suite, key, cfg, repo=repo, judged=judged)
    section["changes"] = [
        {"case": c.case, "metric": c.metric, "before": NS.fmt_value(c.before, t.metric),
         "after": NS.fmt_value(c.after, t.metric), "change": NF.change_text(c, t.metric),
         "commits": c.commit_range, "night": c.bad.id, "utc": c.bad.utc}
        for t in trends for c in t.changes
    ]
    cases: dict[str, list[dict[str, Any]]] = {}
    for t in trends:
        if not t.numeric:
            continue
        j = t.latest
        cases.setdefault(t.case, []).append({
            "metric": t.metric.name, "what": t.metric.what, "uri": _svg_uri(NF.trend_svg(t)),
            "label": j.label, "cls": LABEL_CLASS.get(j.label, "lab-grey"), "nights": len(t.series),
            "changes": len(t.changes),
        })
    section["cases"] = [{"name": c, "figures": figs} for c, figs in cases.items()]
    texts = [t for t in trends if not t.numeric]
    recent = sorted(nights.values(), key=lambda n: (n.utc, n.id))[-STRIP_NIGHTS:]
    section["strip"] = {
        "shown": len(recent), "total": len(nights),
        "nights": [{"id": n.id, "commit": (n.commit or "unknown")[:7], "date": n.utc[:10]} for n in recent],
        "rows": [
            {"case": t.case, "metric": t.metric.name,
             "cells": [_text_cell(by[n.id]) if n.id in by else None for n in recent],
             "distinct": len({str(j.value) for j in t.series if j.value is not None})}
            for t in texts for by in [{j.night.id: j for j in t.series}]
        ],
    }
    return section


def nightly_context(store: str | Path, suites: list[str], fp_want: str | None, cfg: Any,
                    repo: str | None) -> dict[str, Any]:
    from superoffload.nightly.store import History

    sections = []
    with History(store) as h:
        for suite in suites:
            try:
                sections.append(nightly_suite(h, suite, fp_want, cfg, repo))
            except ValueError as e:  # the wanted fingerprint is not one of this suite's
                if len(suites) == 1:
                    raise
                sections.append({"suite": suite, "message": str(e), "fingerprints": []})
    return {"title": f"SuperOffload nightly: {Path(store).name}", "store": str(store), "sections": sections,
            "alerts": [{"suite": s["suite"], "regressed": s["regressed"]} for s in sections if s.get("regression")]}


def render_nightly(store: str | Path, out: str | Path, suite: str = "all", fingerprint: str | None = None,
                   cfg: Any = None, repo: str | None = None) -> Path:
    """Render the nightly page of the history ``store`` to ``out`` (written atomically)."""
    from superoffload.harness.record import write_text_atomic
    from superoffload.nightly.rules import RuleConfig

    if not Path(store).is_file():
        raise FileNotFoundError(f"no nightly history at {store}")
    suites = list(NIGHTLY_SUITES) if suite == "all" else [suite]
    ctx = nightly_context(store, suites, fingerprint, cfg or RuleConfig(), repo)
    html = environment().get_template("nightly.html.j2").render(**ctx)
    write_text_atomic(out, html)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("figures", help="write every figure as SVG")
    f.add_argument("--results", required=True)
    f.add_argument("--out", required=True)
    one = sub.add_parser("figure", help="write one figure as SVG")
    one.add_argument("name", choices=sorted(F.FIGURES))
    one.add_argument("--results", required=True)
    one.add_argument("--out", required=True, help="the SVG file to write")
    h = sub.add_parser("html", help="render the HTML report (embeds the SVGs of --figures)")
    h.add_argument("--results", required=True)
    h.add_argument("--figures", required=True)
    h.add_argument("--out", required=True)
    n = sub.add_parser("nightly", help="render the nightly history as one HTML page")
    n.add_argument("--store", required=True, help="the history file (results/history/nightly.sqlite)")
    n.add_argument("--out", required=True, help="the HTML page to write")
    n.add_argument("--suite", default="all", choices=(*NIGHTLY_SUITES, "all"), help="default: all (one section each)")
    n.add_argument("--fingerprint", default=None, help="fingerprint key (prefix); default the newest night's")
    n.add_argument("--repo", default=str(ROOT), help="git repository the commits are in (default: this one)")
    from superoffload.nightly import cli as NC

    NC.rules_args(n)  # judged as `superoffload nightly check` judges, with the same flags
    a = p.parse_args(argv)
    if a.cmd == "figures":
        paths = F.render_all(D.load_results(a.results), a.out)
        print(f"wrote {len(paths)} figures to {a.out}")
    elif a.cmd == "figure":
        print(f"wrote {F.render_one(D.load_results(a.results), a.name, a.out)}")
    elif a.cmd == "nightly":
        try:
            page = render_nightly(a.store, a.out, a.suite, a.fingerprint, NC.rule_config(a), a.repo)
        except (OSError, ValueError, RuntimeError) as e:
            print(f"render nightly: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {page}")
    else:
        print(f"wrote {render_html(a.results, a.figures, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
