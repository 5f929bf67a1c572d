"""Tables that show only what has data: a column whose every cell is empty is left out, and so is a row
with nothing in its data columns; the table says how many of each it left out (and which columns), so
nothing disappears silently. Cells are formatted here (reports.formatting), so a template never prints a
raw float, `None` or `nan`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reports import formatting as fm


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] = fm.text  # the cell's text from the row's value
    left: bool = False  # text columns align left, numbers right
    key_column: bool = False  # says which row it is (system, model): never decides whether a row has data
    badge: bool = False  # a status: drawn as a badge
    title: str = ""  # the header's tooltip: what the column means


@dataclass
class Cell:
    text: str
    left: bool = False
    key: bool = False  # a key column's text cell (system, model, claim): wraps only between words
    badge: str = ""  # badge class ("" = a plain cell)
    title: str = ""
    strong: bool = False


@dataclass
class Table:
    columns: list[Column]
    rows: list[list[Cell]]
    row_classes: list[str]
    left_out_columns: list[str] = field(default_factory=list)
    left_out_rows: int = 0
    row_noun: str = "rows"

    @property
    def left_out(self) -> str:
        """One sentence on what was left out, or ""."""
        parts = []
        if self.left_out_columns:
            n = len(self.left_out_columns)
            parts.append(f"{n} column{'s' if n > 1 else ''} without data ({', '.join(self.left_out_columns)})")
        if self.left_out_rows:
            parts.append(f"{self.left_out_rows} {self.row_noun} without data")
        return ("Left out: " + "; ".join(parts) + ".") if parts else ""


BADGES = {"ok": "ok", "holds": "ok", "measured": "ok", "oom": "oomb", "does not hold": "errb", "error": "errb",
          "invalid": "errb", "predicted": "predb", "does not fit": "nab", "missing": "nab",
          "not measured here": "nab", "no prediction": "nab", "unavailable": "nab"}


def badge_class(status: str) -> str:
    """The badge style of a status word: a neutral grey for anything not known to be good or bad."""
    for word, cls in BADGES.items():
        if status == word or status.startswith(word + " "):
            return cls
    return "nab"


def empty(text: str) -> bool:
    return text in ("", fm.DASH)


def build(rows: Iterable[dict[str, Any]], columns: list[Column], *, row_class: Callable[[dict], str] | None = None,
          strong: Callable[[dict, str], bool] | None = None, titles: Callable[[dict, str], str] | None = None,
          keep_empty_rows: bool = False, row_noun: str = "rows") -> Table:
    """A table of ``rows`` (dicts) in ``columns``, without the empty columns and data-less rows.
    ``row_class``: a CSS class per row (its status); ``strong``: cells to emphasise (row, key);
    ``titles``: a tooltip per cell (the full text behind a shortened one)."""
    rows = list(rows)
    texts = [[c.fmt(r.get(c.key)) for c in columns] for r in rows]
    data_cols = [j for j, c in enumerate(columns) if not c.key_column]
    kept_rows = [i for i, t in enumerate(texts)
                 if keep_empty_rows or not data_cols or any(not empty(t[j]) for j in data_cols)]
    kept_cols = [j for j, c in enumerate(columns) if any(not empty(texts[i][j]) for i in kept_rows)]
    table = Table(
        columns=[columns[j] for j in kept_cols],
        rows=[[Cell(texts[i][j], columns[j].left, columns[j].key_column and columns[j].left,
                    badge=badge_class(texts[i][j]) if columns[j].badge and not empty(texts[i][j]) else "",
                    title=titles(rows[i], columns[j].key) if titles else "",
                    strong=bool(strong and strong(rows[i], columns[j].key)))
               for j in kept_cols] for i in kept_rows],
        row_classes=[row_class(rows[i]) if row_class else "" for i in kept_rows],
        left_out_columns=[columns[j].header for j in range(len(columns)) if j not in kept_cols and kept_rows],
        left_out_rows=len(rows) - len(kept_rows),
        row_noun=row_noun,
    )
    return table
