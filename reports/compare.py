"""Two rendered reports side by side: does a change render the same report?

    python reports/compare.py RESULTS_BEFORE RESULTS_AFTER [-v]

Each argument is a sweep's results folder (`results/<sweep>`, holding `report.html`, `figures/` and the
result files). Compared: the headings in order, the collapsible sections' titles (numbers masked), the
figures (section and alt text) and figure files, every table's section and header, each table's row keys
in order (system, model, seq, batch, chips, ... columns) and how many cells changed (and whether only
numbers did), the list of result files, and the deterministic prediction files key by key. Measured
numbers differ between any two runs; the tool counts them and leaves judging them to ratios over repeats.
Prints SAME / DIFFERENT per part and exits 1 when the structure (headings, figures, tables, row keys,
files) differs. Written for issue 27's moves (docs/results.md, eighth session).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

KEY_HEADERS = {"system", "model", "seq", "batch", "chips", "ranks", "world", "sp"}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
PREDICTION_FILES = ("predictions/paper_comparison.json", "predictions/validation.json", "sweep.json",
                    "ablation/variants.json")


class ReportOutline(HTMLParser):
    """Headings, section titles, figures and tables (header, rows of (tag, class, text) cells) of a report."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.headings: list[str] = []
        self.summaries: list[str] = []
        self.figures: list[tuple[str, str]] = []
        self.tables: list[dict[str, Any]] = []
        self._heading: list[str] | None = None
        self._section = ""
        self._in_summary = False
        self._table: dict[str, Any] | None = None
        self._row: list[tuple[str, str, str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = [tag, ""]
        elif tag == "summary":
            self._in_summary = True
            self.summaries.append("")
        elif tag == "table":
            self._table = {"section": self._section, "header": [], "rows": []}
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = [tag, a.get("class") or "", ""]
        elif tag == "img":
            self.figures.append((self._section, a.get("alt") or ""))

    def handle_endtag(self, tag: str) -> None:
        if re.fullmatch(r"h[1-6]", tag) and self._heading:
            text = " ".join(self._heading[1].split())
            self.headings.append(f"{self._heading[0]} {text}")
            self._section, self._heading = text, None
        elif tag == "summary":
            self._in_summary = False
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append((self._cell[0], self._cell[1], " ".join(self._cell[2].split())))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if self._row and all(c[0] == "th" for c in self._row) and not self._table["header"]:
                self._table["header"] = [c[2] for c in self._row]
            else:
                self._table["rows"].append(self._row)
            self._row = None
        elif tag == "table" and self._table is not None:
            self.tables.append(self._table)
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading[1] += data
        if self._cell is not None:
            self._cell[2] += data
        if self._in_summary:
            self.summaries[-1] += data


def outline(path: Path) -> ReportOutline:
    o = ReportOutline()
    o.feed(path.read_text())
    return o


def row_key(table: dict[str, Any], row: list[tuple[str, str, str]]) -> tuple[str, ...]:
    """A row's identity: its cells of class 'k', else those under a key header, else its first cell."""
    keys = tuple(c[2] for c in row if "k" in c[1].split())
    if keys:
        return keys
    idx = [i for i, h in enumerate(table["header"]) if h.lower().split(" ")[0] in KEY_HEADERS]
    if idx:
        return tuple(row[i][2] for i in idx if i < len(row))
    return (row[0][2],) if row else ()


def same(label: str, before: list[str], after: list[str]) -> bool:
    d = list(difflib.unified_diff(before, after, "before", "after", lineterm="", n=0))
    print(f"== {label}: {'SAME' if not d else 'DIFFERENT'} ({len(before)} vs {len(after)})")
    for line in d[2:]:
        print("   ", line[:220])
    return not d


def flatten(o: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(o, dict):
        for k, v in o.items():
            yield from flatten(v, f"{prefix}.{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, o


def compare_tables(b: ReportOutline, a: ReportOutline, verbose: bool) -> bool:
    ok = True
    print(f"== table row keys and cells ({len(b.tables)} vs {len(a.tables)} tables)")
    for i, (tb, ta) in enumerate(zip(b.tables, a.tables, strict=False)):
        kb, ka = [row_key(tb, r) for r in tb["rows"]], [row_key(ta, r) for r in ta["rows"]]
        changed = []
        for rb, ra, k in zip(tb["rows"], ta["rows"], kb, strict=False):
            for j, (cb, ca) in enumerate(zip(rb, ra, strict=False)):
                if cb[2] != ca[2]:
                    col = tb["header"][j] if j < len(tb["header"]) else f"column {j}"
                    changed.append((k, col, cb[2], ca[2], NUMBER.sub("#", cb[2]) == NUMBER.sub("#", ca[2])))
        print(f"  T{i:02d} [{tb['section'][:60]}] rows {len(kb)}/{len(ka)} keys {'same' if kb == ka else 'DIFFERENT'};"
              f" cells changed {len(changed)} (numbers only: {sum(c[4] for c in changed)})")
        if kb != ka:
            ok = False
            for line in list(difflib.unified_diff([str(k) for k in kb], [str(k) for k in ka], lineterm="", n=0))[2:]:
                print("      ", line[:200])
        if verbose:
            for k, col, cb, ca, numbers in changed[:40]:
                print(f"      {'num' if numbers else 'TXT'} {k} / {col[:40]}: {cb[:90]!r} -> {ca[:90]!r}")
    return ok


def compare_files(rb: Path, ra: Path, verbose: bool) -> bool:
    def listing(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not str(p.relative_to(root)).startswith(("logs", "benchmarks")))

    ok = same("result files (logs and benchmarks excluded)", listing(rb), listing(ra))
    for rel in PREDICTION_FILES:
        if not (rb / rel).exists() or not (ra / rel).exists():
            continue
        fb, fa = dict(flatten(json.loads((rb / rel).read_text()))), dict(flatten(json.loads((ra / rel).read_text())))
        differing = [k for k in fb if k in fa and fb[k] != fa[k]]
        print(f"  {rel}: keys {len(fb)}/{len(fa)}, only before {len(set(fb) - set(fa))}, only after "
              f"{len(set(fa) - set(fb))}, values differing {len(differing)}")
        if verbose:
            for k in differing[:60]:
                print(f"      {k}: {str(fb[k])[:80]} -> {str(fa[k])[:80]}")
    return ok


def main(argv: list[str]) -> int:
    paths = [a for a in argv if not a.startswith("-")]
    if len(paths) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    rb, ra = Path(paths[0]), Path(paths[1])
    for r in (rb, ra):
        if not (r / "report.html").is_file():
            print(f"{r}: no report.html (give a sweep's results folder, e.g. results/cpu_smoke)", file=sys.stderr)
            return 2
    verbose = "-v" in argv
    b, a = outline(rb / "report.html"), outline(ra / "report.html")
    ok = same("headings (order)", b.headings, a.headings)
    same("section titles (numbers masked)", [NUMBER.sub("#", s.strip()) for s in b.summaries],
         [NUMBER.sub("#", s.strip()) for s in a.summaries])
    ok &= same("figures (section | alt)", [f"{s} | {alt}" for s, alt in b.figures],
               [f"{s} | {alt}" for s, alt in a.figures])
    figs = [sorted(p.name for p in (r / "figures").glob("*")) for r in (rb, ra)]
    ok &= same("figure files", figs[0], figs[1])
    ok &= same("tables (section | header)", [f"{t['section']} | {t['header']}" for t in b.tables],
               [f"{t['section']} | {t['header']}" for t in a.tables])
    ok &= compare_tables(b, a, verbose)
    ok &= compare_files(rb, ra, verbose)
    print("structure: " + ("the same" if ok else "DIFFERENT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
