"""The noise block of a run record: load, other processes' CPU and the steps' spread, flagged past the
documented bounds, and shown by `bench compare`."""

from __future__ import annotations

import jsonschema

from superoffload.cli.bench_compare import compare_rows, format_table
from superoffload.harness import noise
from superoffload.harness.record import schema


def _sampler(monkeypatch, load: float, busy_share: float) -> noise.NoiseSampler:
    monkeypatch.setattr(noise.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(noise, "usable_cpus", lambda: 2)
    monkeypatch.setattr(noise, "_own_cpu_s", lambda: 0.0)  # this process used nothing: all busy time is others'
    ticks = iter([(0, 0)] + [(int(busy_share * 10_000), 10_000)] * 4)
    monkeypatch.setattr(noise, "_proc_stat_jiffies", lambda: next(ticks))
    return noise.NoiseSampler().start()


def test_a_quiet_run_has_no_flags(monkeypatch):
    out = _sampler(monkeypatch, load=0.3, busy_share=0.05).assess([1.0, 1.05, 1.1, 1.02, 0.98])
    assert out["flags"] == [] and abs(out["others_cpu_share"] - 0.05) < 1e-9
    assert 1.0 < out["p90_over_p10"] < noise.SPREAD_BOUND


def test_each_bound_flags_its_own_cause(monkeypatch):
    wide = [0.1, 0.1, 0.1, 1.0, 1.0]
    assert _sampler(monkeypatch, 0.3, 0.0).assess(wide)["flags"] == ["spread"]
    assert _sampler(monkeypatch, 0.3, 0.6).assess([1.0, 1.0])["flags"] == ["loaded"]
    # a high load average alone (a sweep's previous run) is not a flag where the others' share is known
    assert _sampler(monkeypatch, 3.5, 0.0).assess([1.0, 1.0])["flags"] == []
    s = _sampler(monkeypatch, 3.5, 0.0)  # 1.75 per CPU
    monkeypatch.setattr(noise, "_proc_stat_jiffies", lambda: None)
    assert s.assess([1.0, 1.0])["flags"] == ["loaded"] and s.assess([1.0, 1.0])["others_cpu_share"] is None
    # several ranks on the machine each use what this one does: they are not "others"
    monkeypatch.setattr(noise.os, "sysconf", lambda name: 100)
    s = _sampler(monkeypatch, 0.3, 0.5)
    monkeypatch.setattr(noise, "_own_cpu_s", lambda: 25.0)  # 2500 ticks by this rank, x2 ranks = 5000 of 10000
    assert s.assess([1.0, 1.0], ranks=2)["others_cpu_share"] == 0.0


def _record(system: str, tps: float, flags: list[str]) -> dict:
    return {"schema_version": 1, "status": "ok", "system": system,
            "model": {"name": "gpt-tiny", "params": 1, "layers": 1, "hidden": 1, "heads": 1, "vocab": 1},
            "run": {"seq": 32, "batch": 2, "global_batch": 2, "dtype": "fp32", "steps": 2, "warmup": 1, "seed": 0},
            "provenance": {}, "created_utc": "2026-12-01T00:00:00+00:00",
            "throughput": {"tokens_per_s": tps}, "memory": {},
            "noise": {"loadavg_before": [0.1] * 3, "loadavg_after": [0.2] * 3, "usable_cpus": 2,
                      "others_cpu_share": 0.0, "p90_over_p10": 2.0 if "spread" in flags else 1.1, "flags": flags}}


def test_bench_compare_shows_spread_and_flags():
    recs = [_record("torch", 100.0, []), _record("superoffload", 279.0, ["spread", "loaded"])]
    for r in recs:
        jsonschema.validate(r["noise"], schema("run")["properties"]["noise"])
    rows = compare_rows(recs, "torch")
    flagged = next(r for r in rows if r["system"] == "superoffload")
    assert flagged["flags"] == "spread,loaded" and flagged["p90_over_p10"] == 2.0
    table = format_table(rows, "torch")
    assert "p90_over_p10" in table and "1 of 2 runs flagged" in table and "spread,loaded" in table


def test_a_sampler_can_count_the_children_it_waited_for_as_its_own(monkeypatch) -> None:
    """calibrate's ranks and system timings are subprocesses: their CPU time is calibrate's, not other load."""
    import collections

    times = collections.namedtuple("times", "user system children_user children_system elapsed")
    monkeypatch.setattr(noise.os, "times", lambda: times(1.0, 0.5, 3.0, 1.0, 0.0))
    assert noise._own_cpu_s() == 1.5 and noise._own_cpu_s(True) == 5.5
    assert noise.NoiseSampler(children=True)._own() == 5.5 and noise.NoiseSampler()._own() == 1.5
