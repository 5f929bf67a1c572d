"""The superoffload system under the runner: the plan is used by default, options override, bad
options fail before work, and engine counters land in the record."""

import dataclasses

import pytest

from superoffload.engine import ConfigError
from superoffload.harness import record
from superoffload.harness.runner import run_benchmark, validate_run
from superoffload.harness.system import RunConfig
from superoffload.harness.systems.superoffload_system import engine_config
from superoffload.planner.plan import make_plan
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape


def _run(**kw):
    run = RunConfig(system="superoffload", model="gpt-tiny", seq=32, batch=2, steps=3, warmup=1, threads=1, **kw)
    rec = run_benchmark(run)
    record.validate(rec)
    assert rec["status"] == "ok", rec["error"]
    return rec


def test_plan_is_consumed_and_recorded():
    rec = _run()
    plan, st = rec["plan"], rec["system_stats"]
    # planned for this machine's CPU, and the record says with what
    assert plan["hardware"] == "this-cpu" and any(r.startswith("Hardware: this-cpu:") for r in plan["reasons"])
    assert st["bucket_size"] == plan["bucket_size"]
    assert st["config"]["host_optimizer"] == plan["host_optimizer"]
    assert st["buckets_device"] == min(plan["device_tail_buckets"], st["buckets_device"] + st["buckets_host"])
    # the engine runs the plan's speculation choice (priced on this machine's cores; it may go either way)
    if plan["speculation"]:
        assert rec["rollbacks"]["speculated"] == 4 and "speculation" not in plan["off"]
    else:
        assert rec["rollbacks"]["validate_first"] == 4
        assert "-o speculation=true" in plan["off"]["speculation"]["force"]
    # the record says why every technique is off and how to force it on, and the host the plan was made for
    assert {"device_tail_buckets", "flow_layers", "cast"} <= set(plan["off"])
    assert any(r.startswith("Off: bucketization repartitioning") and "device_tail_buckets=N" in r
               for r in plan["reasons"])
    assert plan["compute_threads"] == 1 and plan["cores_per_rank"] >= 1
    rec = _run(system_options={"speculation": True})
    assert rec["rollbacks"]["steps"] == 4 and rec["rollbacks"]["speculated"] == 4
    rec = _run(system_options={"speculation": False})
    assert rec["rollbacks"]["validate_first"] == 4


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


def _plan(**hw_fields):
    hw = dataclasses.replace(get_profile("gh200"), **hw_fields)
    return make_plan(get_shape("gpt-1b"), 1024, 2, hw)


def test_engine_config_is_the_plan_merged_over_the_defaults():
    """Every engine key the plan chose reaches the engine unchanged, the host kernel included."""
    plan = _plan()
    cfg = engine_config(RunConfig(system="superoffload", dtype="bf16", device="cpu"), plan).to_dict()
    for key, value in plan.engine_options(precision="bf16").items():
        assert cfg[key] == value, key


def test_a_plan_choosing_cpuadam_runs_cpuadam():
    gh = get_profile("gh200").host_adam_gbps
    plan = _plan(host_adam_gbps={**gh, "cpuadam": 2 * gh["grace"]})
    assert plan.host_optimizer == "cpuadam"
    run = RunConfig(system="superoffload", dtype="bf16", device="cpu")
    assert engine_config(run, plan).host_optimizer == "cpuadam"
    # an explicit option still wins over the plan
    run = RunConfig(system="superoffload", dtype="bf16", device="cpu", system_options={"host_optimizer": "grace"})
    assert engine_config(run, plan).host_optimizer == "grace"


def test_cast_policy_switch_sets_both_sides():
    plan = _plan()
    for side in ("device", "host"):
        run = RunConfig(system="superoffload", dtype="bf16", device="cpu", system_options={"cast_policy": side})
        cfg = engine_config(run, plan)
        assert (cfg.grad_cast, cfg.param_cast) == (side, side)
    run = RunConfig(system="superoffload", dtype="bf16", device="cpu",
                    system_options={"cast_policy": "host", "param_cast": "device"})
    assert (engine_config(run, plan).grad_cast, engine_config(run, plan).param_cast) == ("host", "device")
    with pytest.raises(ConfigError, match="cast_policy must be one of device, host"):
        engine_config(RunConfig(system="superoffload", dtype="bf16", system_options={"cast_policy": "gpu"}))
    with pytest.raises(ConfigError, match="use --dtype bf16 or fp16"):
        engine_config(RunConfig(system="superoffload", dtype="fp32", system_options={"cast_policy": "host"}))


def test_fp32_runs_keep_the_engine_casts():
    plan = _plan()
    cfg = engine_config(RunConfig(system="superoffload", dtype="fp32", device="cpu"), plan)
    assert (cfg.grad_cast, cfg.param_cast) == ("device", "host")  # nothing to cast; the engine's defaults


def test_the_optimizer_api_measures_the_same_training_as_the_engine_api():
    """bench run --api optimizer: superoffload.AdamW in a plain loop, the same engine config, the same bits."""
    opts = {"speculation": True, "bucket_size": 20_000, "speculation_policy": {"max_rollback_rate": 1.0}}
    native = _run(grad_accum=2, grad_clip=0.5, system_options=opts)
    plain = _run(grad_accum=2, grad_clip=0.5, system_options={**opts, "api": "optimizer"})
    assert plain["losses"] == native["losses"] and plain["run"]["system_options"]["api"] == "optimizer"
    assert plain["system_stats"]["plain_loop"]["predicted_passes"] == 2
    assert plain["rollbacks"]["speculated"] == 3 and plain["rollbacks"]["validate_first"] == 1
    with pytest.raises(ValueError, match="api must be one of engine, optimizer"):
        validate_run(RunConfig(system="superoffload", system_options={"api": "plain"}))
