"""The nightly history: an append-only SQLite file (the standard library's sqlite3, no server).

Why SQLite: one file that a scheduler, a laptop and CI can all open; transactions, so a night is
recorded whole or not at all even when the process is killed; a query (``the last N nights of this case
on this fingerprint``) is one indexed SELECT; and triggers make past rows immutable, which a directory
of JSON files cannot promise. Parquet/DuckDB would be faster for analytics but a nightly history is a
few thousand rows a year, and a dependency more for every user.

Tables (schema version in ``meta``):
    nights       one row per nightly per suite ('training', 'microbench'): UTC time, git commit and
                 dirty flag, fingerprint (key and fields), source (the folder or file it came from; unique)
    samples      the raw values: (night, case, repeat, metric) -> a number or a text (a hash, a status)
    annotations  accepted baselines and intended changes (they move the baseline, never rewrite a night)
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nights (
    id INTEGER PRIMARY KEY,
    suite TEXT NOT NULL,
    utc TEXT NOT NULL,
    git_commit TEXT,
    git_dirty INTEGER,
    fingerprint TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    source TEXT NOT NULL UNIQUE,
    recorded_utc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS nights_by_fp ON nights (suite, fingerprint, utc);
CREATE TABLE IF NOT EXISTS samples (
    night INTEGER NOT NULL REFERENCES nights (id),
    case_name TEXT NOT NULL,
    rep INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    text TEXT,
    PRIMARY KEY (night, case_name, rep, metric)
);
CREATE TABLE IF NOT EXISTS annotations (
    id INTEGER PRIMARY KEY,
    utc TEXT NOT NULL,
    suite TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    case_name TEXT NOT NULL,
    metric TEXT,
    kind TEXT NOT NULL CHECK (kind IN ('accept', 'intended')),
    from_night INTEGER REFERENCES nights (id),
    git_commit TEXT,
    note TEXT NOT NULL
);
"""
_APPEND_ONLY = [
    f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op.lower()} BEFORE {op} ON {t} "
    f"BEGIN SELECT RAISE(ABORT, 'the nightly history is append-only: {t} rows are never changed'); END;"
    for t in ("nights", "samples", "annotations")
    for op in ("UPDATE", "DELETE")
]


@dataclass(frozen=True)
class Night:
    id: int
    suite: str
    utc: str
    commit: str | None
    dirty: bool | None
    fingerprint: str
    fingerprint_fields: dict[str, Any]
    source: str

    @property
    def short_commit(self) -> str:
        return (self.commit or "unknown")[:10] + ("+dirty" if self.dirty else "")


@dataclass(frozen=True)
class Sample:
    case: str
    rep: int
    metric: str
    value: float | None = None
    text: str | None = None


@dataclass(frozen=True)
class Annotation:
    id: int
    utc: str
    suite: str
    fingerprint: str
    case: str
    metric: str | None
    kind: str
    from_night: int | None
    commit: str | None
    note: str

    def covers(self, case: str, metric: str) -> bool:
        return self.case in (case, "*") and self.metric in (None, metric)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class History:
    """The store at ``path`` (created with its schema when missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=60)
        self.db.execute("PRAGMA foreign_keys = ON")
        with self.db:
            self.db.executescript(_SCHEMA)
            for stmt in _APPEND_ONLY:
                self.db.execute(stmt)
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} has history schema {row[0]}, newer than this code's {SCHEMA_VERSION}: "
                    "update superoffload, or point --store at another file"
                )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing: one transaction per night ---------------------------------------------------------------
    def has_source(self, source: str) -> bool:
        return self.db.execute("SELECT 1 FROM nights WHERE source = ?", (source,)).fetchone() is not None

    def add_night(
        self,
        suite: str,
        utc: str,
        commit: str | None,
        dirty: bool | None,
        fingerprint: dict[str, Any],
        source: str,
        samples: Iterable[Sample],
    ) -> int:
        from superoffload.nightly.fingerprint import key

        with self.db:  # all rows of the night or none
            cur = self.db.execute(
                "INSERT INTO nights (suite, utc, git_commit, git_dirty, fingerprint, fingerprint_json, source, "
                "recorded_utc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (suite, utc, commit, None if dirty is None else int(dirty), key(fingerprint),
                 json.dumps(fingerprint, sort_keys=True), source, _now()),
            )
            night = int(cur.lastrowid or 0)
            self.db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?)",
                [(night, s.case, s.rep, s.metric, s.value, s.text) for s in samples],
            )
        return night

    def annotate(
        self,
        kind: str,
        suite: str,
        fingerprint: str,
        case: str,
        note: str,
        metric: str | None = None,
        from_night: int | None = None,
        commit: str | None = None,
    ) -> int:
        with self.db:
            cur = self.db.execute(
                "INSERT INTO annotations (utc, suite, fingerprint, case_name, metric, kind, from_night, git_commit,"
                " note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (_now(), suite, fingerprint, case, metric, kind, from_night, commit, note),
            )
        return int(cur.lastrowid or 0)

    # --- reading ------------------------------------------------------------------------------------------
    def nights(self, suite: str, fingerprint: str | None = None) -> list[Night]:
        """Nights of a suite (on one fingerprint), oldest first (by measured time, then insertion)."""
        q = "SELECT id, suite, utc, git_commit, git_dirty, fingerprint, fingerprint_json, source FROM nights " \
            "WHERE suite = ?" + (" AND fingerprint = ?" if fingerprint else "") + " ORDER BY utc, id"
        args = (suite, fingerprint) if fingerprint else (suite,)
        return [
            Night(r[0], r[1], r[2], r[3], None if r[4] is None else bool(r[4]), r[5], json.loads(r[6]), r[7])
            for r in self.db.execute(q, args)
        ]

    def samples(self, night: int) -> list[Sample]:
        rows = self.db.execute(
            "SELECT case_name, rep, metric, value, text FROM samples WHERE night = ? ORDER BY case_name, metric, rep",
            (night,),
        )
        return [Sample(*r) for r in rows]

    def values(self, nights: list[Night]) -> dict[int, dict[tuple[str, str], list[Sample]]]:
        """night id -> (case, metric) -> its samples in repeat order."""
        out: dict[int, dict[tuple[str, str], list[Sample]]] = {}
        for n in nights:
            per: dict[tuple[str, str], list[Sample]] = {}
            for s in self.samples(n.id):
                per.setdefault((s.case, s.metric), []).append(s)
            out[n.id] = per
        return out

    def annotations(self, suite: str, fingerprint: str) -> list[Annotation]:
        rows = self.db.execute(
            "SELECT id, utc, suite, fingerprint, case_name, metric, kind, from_night, git_commit, note "
            "FROM annotations WHERE suite = ? AND fingerprint = ? ORDER BY id",
            (suite, fingerprint),
        )
        return [Annotation(*r) for r in rows]

    def fingerprints(self, suite: str) -> list[tuple[str, dict[str, Any], int, str]]:
        """(key, fields, nights, latest utc) per fingerprint of a suite, the most recent first."""
        rows = self.db.execute(
            "SELECT fingerprint, fingerprint_json, COUNT(*), MAX(utc) FROM nights WHERE suite = ? "
            "GROUP BY fingerprint ORDER BY MAX(utc) DESC",
            (suite,),
        )
        return [(r[0], json.loads(r[1]), int(r[2]), r[3]) for r in rows]
