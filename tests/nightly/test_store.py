"""The history store: append-only, versioned, one transaction per night."""

from __future__ import annotations

import sqlite3

import pytest

from superoffload.nightly import fingerprint as F
from superoffload.nightly.store import SCHEMA_VERSION, History, Sample

from .history_helpers import FP, add_night, history


def test_nights_and_samples_round_trip(tmp_path):
    with history(tmp_path) as h:
        n = add_night(h, 0, [100.0, 110.0])
        assert h.has_source(f"night-{'superoffload_gpt-tiny_s128_b2'}-0")
        [night] = h.nights("training")
        assert night.id == n and night.fingerprint == F.key(FP) and night.fingerprint_fields == FP
        vals = h.values([night])[n]
        assert [s.value for s in vals[("superoffload_gpt-tiny_s128_b2", "tokens_per_s")]] == [100.0, 110.0]


@pytest.mark.parametrize("stmt", ["UPDATE samples SET value = 1", "DELETE FROM nights", "DELETE FROM samples",
                                  "UPDATE annotations SET note = 'x'"])
def test_past_rows_cannot_be_rewritten(tmp_path, stmt):
    with history(tmp_path) as h:
        add_night(h, 0, [100.0])
        h.annotate("accept", "training", F.key(FP), "c", "note", from_night=1)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"), h.db:
            h.db.execute(stmt)
        assert len(h.nights("training")) == 1


def test_a_night_is_all_or_nothing(tmp_path):
    with history(tmp_path) as h:
        add_night(h, 0, [100.0])
        dup = [Sample("c", 0, "tokens_per_s", value=1.0), Sample("c", 0, "tokens_per_s", value=2.0)]
        with pytest.raises(sqlite3.IntegrityError):
            h.add_night("training", "2026-11-02T00:00:00+00:00", "abc", False, FP, "other", dup)
        assert len(h.nights("training")) == 1  # the failed night left no row
        with pytest.raises(sqlite3.IntegrityError):  # a source is recorded once
            add_night(h, 0, [100.0])


def test_schema_version_is_stored_and_a_newer_store_is_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    History(path).close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    db.execute("DROP TRIGGER IF EXISTS meta_guard")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="newer than this code"):
        History(path)


def test_fingerprint_key_is_stable_and_sensitive():
    assert F.key(FP) == F.key(dict(reversed(list(FP.items()))))
    assert F.key(FP) != F.key({**FP, "torch": "2.14.0"})
    assert F.merge([FP, {**FP, "threads": 2}])["threads"] == [1, 2]
    assert "Test CPU x2" in F.describe(FP) and "torch 2.13.0" in F.describe(FP)


def test_fingerprint_of_a_gpu_run_names_the_gpu_and_driver():
    rec = {"provenance": {"device": "NVIDIA H200", "cuda": "12.8", "driver": "570.86", "cpu": "x", "torch": "2.13.0"},
           "run": {"threads": None, "bind_cores": True, "dtype": "bf16"}}
    fp = F.from_record(rec)
    assert (fp["device"], fp["gpu"], fp["driver"], fp["cuda"]) == ("cuda", "NVIDIA H200", "570.86", "12.8")
    assert "NVIDIA H200" in F.describe(fp) and "driver 570.86" in F.describe(fp)
    sim = F.from_record({"provenance": {"device": "sim (simulated discrete device on the CPU)", "cuda": None}})
    assert (sim["device"], sim["gpu"]) == ("sim", None)
