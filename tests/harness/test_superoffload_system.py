"""The superoffload system under the runner: the plan is used by default, options override, bad
options fail before work, and engine counters land in the record."""

import pytest

from superoffload.harness import record
from superoffload.harness.runner import run_benchmark, validate_run
from superoffload.harness.system import RunConfig


def _run(**kw):
    run = RunConfig(system="superoffload", model="gpt-tiny", seq=32, batch=2, steps=3, warmup=1, threads=1, **kw)
    rec = run_benchmark(run)
    record.validate(rec)
    assert rec["status"] == "ok", rec["error"]
    return rec


def test_plan_is_consumed_and_recorded():
    rec = _run()
    plan, st = rec["plan"], rec["system_stats"]
    assert plan["hardware"] == "cpu" and plan["reasons"]
    assert st["bucket_size"] == plan["bucket_size_params"]
    assert st["buckets_device"] == min(plan["device_tail_buckets"], st["buckets_device"] + st["buckets_host"])
    # CPU-only: the planner turns speculation off (no idle host to overlap with)
    assert plan["speculation"] is False and rec["rollbacks"]["validate_first"] == 4
    rec = _run(system_options={"speculation": True})
    assert rec["rollbacks"]["steps"] == 4 and rec["rollbacks"]["speculated"] == 4


def test_options_override_the_plan():
    rec = _run(system_options={"bucket_size": 5000, "device_tail_buckets": 0, "speculation": False})
    st = rec["system_stats"]
    assert st["bucket_size"] == 5000 and st["buckets_device"] == 0
    assert rec["rollbacks"]["validate_first"] == 4


def test_plan_off_uses_engine_defaults():
    rec = _run(system_options={"plan": False})
    assert rec["plan"] is None and rec["system_stats"]["bucket_size"] == 1 << 24


@pytest.mark.parametrize("opts,msg", [({"bucket_sise": 1}, "unknown config key"),
                                      ({"rollback_mode": "approx"}, "rollback_mode")])
def test_bad_options_fail_before_work(opts, msg):
    with pytest.raises(ValueError, match=msg):
        validate_run(RunConfig(system="superoffload", system_options=opts))
