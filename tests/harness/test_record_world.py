"""The run record's multi-rank fields: world_size at the top level (a record without it ran on one rank, so
records written before it stay valid), every rank's entry, the aggregate throughput, the placement."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from superoffload.harness import record
from superoffload.harness.record import error_record
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig


@pytest.fixture(scope="module")
def rec() -> dict:
    return run_benchmark(RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2, steps=3, warmup=1, threads=1))


def test_a_one_rank_record_has_world_size_1_and_its_own_entry(rec: dict) -> None:
    assert rec["status"] == "ok" and rec["world_size"] == 1
    (mine,) = rec["ranks"]
    assert mine["rank"] == 0 and mine["median_step_s"] == rec["timing"]["median_s"]
    assert mine["tokens_per_s"] == pytest.approx(rec["throughput"]["tokens_per_s"])
    tp = rec["throughput"]
    assert tp["aggregate_tokens_per_s"] == pytest.approx(tp["tokens_per_s"])
    assert rec["placement"]["bound"] is False and rec["placement"]["cores"]


def test_records_without_the_new_fields_stay_valid(rec: dict) -> None:
    old = copy.deepcopy(rec)
    for key in ("world_size", "ranks", "placement"):
        del old[key]
    for key in ("aggregate_tokens_per_s", "aggregate_model_tflops"):
        del old["throughput"][key]
    for key in ("world_size", "rank", "bind_cores", "host_threads"):
        old["run"].pop(key, None)
    record.validate(old)


@pytest.mark.parametrize(("path", "value"), [
    (("world_size",), 0),
    (("ranks",), [{"rank": 0, "status": "fine", "median_step_s": 1.0, "tokens_per_s": 1.0}]),
    (("ranks",), [{"rank": 0, "status": "ok"}]),
    (("placement", "cores"), ["0"]),
    (("throughput", "aggregate_tokens_per_s"), "fast"),
])
def test_bad_multi_rank_fields_are_rejected(rec: dict, path: tuple, value) -> None:
    bad = copy.deepcopy(rec)
    d = bad
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        record.validate(bad)


def test_error_record_for_ranks_that_left_none() -> None:
    run = RunConfig(system="superoffload", model="gpt-tiny", world=4)
    rec = error_record(run, "4 ranks exited with 1 without writing a record")
    record.validate(rec)
    assert rec["status"] == "error" and rec["world_size"] == 4 and rec["run"]["global_batch"] == 4 * 2
    # RunConfig.world in code; the record keeps the key it was born with
    assert rec["run"]["world_size"] == 4 and "world" not in rec["run"]


def test_bench_compare_keys_on_world_size(rec: dict) -> None:
    from superoffload.cli.bench_compare import compare_rows, format_table

    two = copy.deepcopy(rec)
    two.update(world_size=2, system="superoffload")
    two["run"]["global_batch"] = rec["run"]["global_batch"]  # the same global batch, on two ranks
    two["throughput"]["aggregate_tokens_per_s"] = 2 * rec["throughput"]["tokens_per_s"]
    old = copy.deepcopy(rec)
    del old["world_size"]  # an older record: one rank
    rows = compare_rows([rec, two, old], "torch")
    by = {(r["system"], r["world"]): r for r in rows}
    assert by[("superoffload", 2)]["ratio"] is None  # no torch record on two ranks to compare with
    assert by[("superoffload", 2)]["aggregate_tokens_per_s"] == 2 * rec["throughput"]["tokens_per_s"]
    assert [r["world"] for r in rows if r["system"] == "torch"] == [1, 1]
    assert "aggregate_tokens_per_s" in format_table(rows, "torch")
