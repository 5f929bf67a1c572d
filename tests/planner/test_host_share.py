"""The host a rank has is a planner input: its cores (a --bind-cores slice), the threads its compute runs on and the
host optimizer's threads price host Adam and decide whether the host worker's work (and, on a CPU, gloo's
collectives) overlaps the compute; the host kernel is priced as the engine runs it; and every technique the plan
turns off says why and how to force it on, in the reasons, in explain and in the record."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from superoffload.engine.config import SuperOffloadConfig
from superoffload.planner.costmodel import Workload, host_share, predict
from superoffload.planner.explain import explain, format_plan
from superoffload.planner.plan import Plan, best_host_optimizer, make_plan
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options, system_spec
from superoffload.shapes import get_shape
from tests.planner.test_plan_choices import _ring

SHAPE = get_shape("gpt-small")


def _cpu(cores: int = 2, **kw) -> object:
    return replace(get_profile("cpu"), host_cores=cores, collectives={"intra": _ring(100e-6, 1.0)}, **kw)


def test_the_worker_has_a_core_only_when_one_is_left_beside_the_compute_threads() -> None:
    hw = _cpu(2)
    one = Workload(SHAPE, 128, 2, False)
    assert host_share(one, hw).own_core  # 2 cores, compute on 1 (the default): the worker has the other
    assert not host_share(replace(one, compute_threads=2), hw).own_core  # torch takes both
    # two ranks bound to one core each (bench run --nproc 2 --bind-cores)
    assert not host_share(Workload(SHAPE, 128, 2, False, chips=2), hw).own_core
    four = host_share(Workload(SHAPE, 128, 2, False, chips=2, cores_per_rank=2, compute_threads=1), hw)
    assert four.own_core and four.cores == 2 and four.host_threads == 1
    # the host threads default to the cores left, as bench run --bind-cores sets them (slice minus one)
    assert host_share(Workload(SHAPE, 128, 2, False, cores_per_rank=8, compute_threads=2), hw).host_threads == 6
    # a profile measured at 2 compute threads stands for 2 unless the run says otherwise
    assert not host_share(one, replace(hw, compute_threads=2)).own_core
    # a GPU's host computes nothing: the worker always has its cores
    assert host_share(Workload(SHAPE, 128, 2, False, chips=4), get_profile("gh200")).own_core
    with pytest.raises(ValueError, match="compute_threads"):
        Workload(SHAPE, 128, 2, False, compute_threads=0)


def test_host_adam_is_priced_at_the_threads_the_worker_has() -> None:
    base = _cpu(8, host_adam_threads=1)
    slow = {k: v / 50 for k, v in base.host_adam_gbps.items()}  # so that host Adam shows in the step
    hw = replace(base, host_adam_gbps=slow,
                 host_adam_by_threads={"2": {k: 2 * v for k, v in slow.items()}, "4": {"grace": 3 * slow["grace"]}})
    assert hw.host_adam_rate("grace", 1) == slow["grace"] and hw.host_adam_rate("grace", 3) == 2 * slow["grace"]
    assert hw.host_adam_rate("grace", 64) == 3 * slow["grace"]  # never extrapolated past the largest measured
    assert hw.host_adam_rate("torch", 64) == 2 * slow["torch"]  # torch was not measured at 4
    assert get_profile("gh200").host_adam_rate("grace", 3) == get_profile("gh200").host_adam_gbps["grace"]
    opts = Options(bucket_size=1 << 20, precision="fp32", speculation=False)
    t1, t4 = (predict("superoffload", Workload(SHAPE, 128, 2, False, compute_threads=1, host_threads=h), hw, opts)
              for h in (1, 4))
    assert t4.stage_s["host_adam"] == pytest.approx(t1.stage_s["host_adam"] / 3, rel=0.02)


def test_without_a_core_of_its_own_host_work_and_collectives_add_to_the_step() -> None:
    hw = replace(_cpu(2), host_adam_gbps={k: v / 20 for k, v in get_profile("cpu").host_adam_gbps.items()})
    opts = Options(bucket_size=1 << 19, precision="fp32", speculation=False)
    shared = predict("superoffload", Workload(SHAPE, 128, 2, False, chips=2), hw, opts)
    apart = predict("superoffload", Workload(SHAPE, 128, 2, False, chips=2, cores_per_rank=2, compute_threads=1),
                    hw, opts)
    compute = shared.stage_s["forward"] + shared.stage_s["backward"]
    serial = sum(shared.stage_s.get(k, 0.0) for k in ("host_adam", "reduce_scatter", "all_gather", "all_reduce"))
    assert shared.step_time_s >= compute + serial - 1e-9
    assert apart.step_time_s < shared.step_time_s
    assert any("on the rank's compute core" in n for n in shared.notes)


def _backward_span(w: Workload, hw, opts: Options) -> tuple[float, dict]:
    """From the end of a steady-state forward to the end of its backward, and the iteration's stage times."""
    from superoffload.planner.costmodel import _Builder
    from superoffload.planner.schedule import simulate

    b = _Builder(w, hw, system_spec("superoffload", opts, w.shape.total_params(), world=w.chips))
    sched = simulate(b.build())
    m = b.marks[1]
    return sched.finish[m.last_backward] - sched.finish[m.last_forward], sched.kind_time(1)


def test_a_cpu_rank_leaves_its_reduce_scatters_in_flight_until_backward_ends() -> None:
    """engine._launch leaves each bucket's reduce-scatter in flight on a CPU (the thread waits only to reuse a
    staging slot, and for them all when backward ends); on CUDA the wait is a stream's. With a core of its own
    for gloo a CPU rank's reduce-scatters run beside backward, which ends once the last is done."""
    opts = Options(bucket_size=1 << 18, precision="fp32", speculation=False)
    w = Workload(SHAPE, 128, 2, False, chips=2, compute_threads=1)
    hw = replace(_cpu(4), collectives={"intra": _ring(2e-3, 20.0)})
    assert host_share(w, hw).own_core
    span, stages = _backward_span(w, hw, opts)
    assert stages["reduce_scatter"] > stages["backward"]
    assert stages["reduce_scatter"] - 1e-9 <= span < stages["backward"] + stages["reduce_scatter"]
    # one reduce-scatter shorter than a layer's backward: only the last one is left when backward ends
    quick = replace(hw, collectives={"intra": _ring(1e-6, 1e3)})
    span_q, stages_q = _backward_span(w, quick, opts)
    assert stages_q["reduce_scatter"] < stages_q["backward"] / 4 and span_q < stages_q["backward"] * 1.25
    # the same ring on a GPU: the reduce-scatters run beside backward
    gpu = replace(get_profile("h100-pcie"), collectives={"intra": _ring(2e-3, 20.0)})
    span, stages = _backward_span(replace(w, compute_threads=None), gpu, replace(opts, precision="bf16"))
    assert stages["reduce_scatter"] > stages["backward"] and span < stages["backward"] + stages["reduce_scatter"]


def test_the_host_kernel_is_priced_as_the_engine_runs_it() -> None:
    cpu = get_profile("cpu")
    g = cpu.host_adam_gbps["grace"]
    # a kernel a hair faster by a calibration's kernel rate runs unfused in the engine: GraceAdam stays
    near = replace(cpu, host_adam_gbps={"grace": g, "cpuadam": 1.014 * g, "torch": 0.8 * g})
    assert best_host_optimizer(near) == "grace"
    spec = system_spec("superoffload", Options(host_optimizer="cpuadam", precision="fp32", speculation=False), 1000)
    assert spec.spec_extra_bytes == 16.0  # the gradient copy and the fp32 output copy
    assert system_spec("superoffload", Options(precision="fp32", speculation=False), 1000).spec_extra_bytes == 0.0
    plan = make_plan(get_shape("gpt-tiny"), 128, 2, near, activation_checkpointing=False)
    alt = plan.alternatives["host_optimizer"]
    assert (alt["chosen"], alt["runner_up"]) == ("grace", "cpuadam")
    assert alt["runner_up_step_s"] == predict("superoffload", plan.workload(get_shape("gpt-tiny")), near,
                                              replace(plan.options(), host_optimizer="cpuadam",
                                                      speculation=plan.speculation)).step_time_s
    # much faster even with its copies: taken, and GraceAdam's absence is a technique turned off
    fast = replace(cpu, host_adam_gbps={"grace": g, "cpuadam": 3 * g})
    plan = make_plan(get_shape("gpt-tiny"), 128, 2, fast, activation_checkpointing=False)
    assert plan.host_optimizer == "cpuadam" and "host_optimizer=grace" in plan.off["host_optimizer"]["force"]


def test_speculation_follows_the_cores_the_worker_has() -> None:
    shape = get_shape("gpt-tiny")
    hw = _cpu(2)
    shared = make_plan(shape, 128, 2, hw, activation_checkpointing=False, chips=2, precision="fp32")
    assert not shared.speculation and "no core beside the compute" in shared.off["speculation"]["reason"]
    assert any(r.startswith("Host cores") and "nothing it does overlaps" in r for r in shared.reasons)
    # the bucket the plan keeps was priced validating first
    assert any(r.startswith("Bucket priced validating first") for r in shared.reasons)
    # a GPU with an idle host speculates
    assert make_plan(get_shape("gpt-1b"), 1024, 2, get_profile("gh200")).speculation


def _force_keys(text: str) -> list[str]:
    """The `-o KEY=VALUE` keys a force text names."""
    return re.findall(r"-o (\w+)=", text)


@pytest.mark.parametrize("model, seq, hardware, chips, precision", [
    ("gpt-tiny", 128, "cpu", 2, "fp32"),
    ("gpt-small", 128, "cpu", 1, "bf16"),
    ("gpt-8b", 1024, "gh200", 4, "bf16"),
])
def test_every_technique_turned_off_says_why_and_how_to_turn_it_on(model, seq, hardware, chips, precision) -> None:
    shape = get_shape(model)
    plan = make_plan(shape, seq, 2, get_profile(hardware), activation_checkpointing=hardware != "cpu", chips=chips,
                     precision=precision)
    expected = {"cast", "loss_tile"}
    expected |= {"speculation"} if not plan.speculation else set()
    expected |= {"device_tail_buckets"} if plan.device_tail_buckets == 0 else set()
    expected |= {"flow_layers"} if not plan.flow_layers else set()
    expected |= {"sp"} if chips > 1 else set()
    expected |= {"offload_checkpoints"} if plan.activation_checkpointing else set()
    assert set(plan.off) == expected
    engine_keys = set(SuperOffloadConfig().to_dict()) | {"cast_policy"}
    for key, o in plan.off.items():
        assert o["technique"] and o["reason"] and o["force"], key
        # every `-o KEY=...` the text names is a real engine key
        assert set(_force_keys(o["force"])) <= engine_keys, (key, o["force"])
        if key != "speculation":  # speculation's own reason line says how to turn it on
            assert any(r.startswith(f"Off: {o['technique']}") and "To turn it on" in r for r in plan.reasons), key
    assert any("speculation=true" in r for r in plan.reasons) or plan.speculation
    text = format_plan(plan, shape)
    assert "Turned off (why; how to turn it on):" in text
    for o in plan.off.values():
        assert o["force"] in text
    # JSON as the record holds it, and back
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).off == plan.off


def test_explain_takes_the_host_of_a_rank() -> None:
    text = explain("gpt-tiny", 128, 2, "cpu", activation_checkpointing=False, precision="fp32", compute_threads=8)
    assert "compute on 8 thread(s)" in text and "nothing it does overlaps" in text
    apart = explain("gpt-tiny", 128, 2, "cpu", activation_checkpointing=False, precision="fp32", compute_threads=1,
                    host_threads=4)
    assert "4 optimizer thread(s)" in apart and "its own core(s)" in apart
