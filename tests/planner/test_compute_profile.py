"""Profiled compute in the cost model: an entry of `compute_profiles` applies only to a workload whose
shape signature and dtype match; the op-level terms otherwise."""

from __future__ import annotations

import dataclasses

from superoffload.planner.costmodel import Workload, _Costs, predict
from superoffload.planner.hardware import HardwareProfile, shape_signature, workload_key
from superoffload.planner.presets import get_profile
from superoffload.shapes import ModelShape

TOY = ModelShape(name="gpt-tiny", layers=3, hidden=32, heads=2, vocab=64, ffn_hidden=128, max_seq=64)


def _entry(shape: ModelShape, dtype: str = "fp32", **over: float) -> dict:
    return {"shape": shape_signature(shape), "dtype": dtype, "device": "cpu", "block_fwd_s": 0.01,
            "block_bwd_s": 0.03, "top_fwd_s": 0.005, "top_bwd_s": 0.007, **over}


def test_cost_model_uses_a_matching_entry_only() -> None:
    base = get_profile("cpu")
    hw = dataclasses.replace(base, compute_profiles={workload_key("gpt-tiny", 16, 2): _entry(TOY)})
    c = _Costs(Workload(TOY, 16, 2, False, dtype="fp32"), hw)
    assert (c.fwd_layer, c.bwd_layer, c.fwd_head, c.bwd_head) == (0.01, 0.03, 0.005, 0.007)
    op = _Costs(Workload(TOY, 16, 2, False), base)
    for w in (Workload(TOY, 16, 2, False, dtype="bf16"),  # other dtype
              Workload(TOY, 32, 2, False),  # other sequence
              Workload(dataclasses.replace(TOY, hidden=64), 16, 2, False)):  # same name, other width
        c = _Costs(w, hw)
        assert c.profiled is None
        if w.shape is TOY and w.seq == 16:
            assert c.fwd_layer == op.fwd_layer
    # the torch step is forward + backward of every block and the top, plus the optimizer: at these
    # (deliberately large) profiled costs the step is at least their sum and the prediction says so
    pred = predict("torch", Workload(TOY, 16, 2, False, dtype="fp32"), hw)
    assert pred.options["compute"] == "profiled"
    assert pred.step_time_s >= TOY.layers * (0.01 + 0.03) + 0.005 + 0.007
    assert predict("torch", Workload(TOY, 16, 2, False), base).options["compute"] == "op-model"


def test_a_profile_holds_each_precision_and_a_workload_gets_its_own() -> None:
    base = get_profile("cpu")
    fp32, bf16 = _entry(TOY), _entry(TOY, dtype="bf16", block_fwd_s=0.002)
    hw = dataclasses.replace(base, compute_profiles={workload_key("gpt-tiny", 16, 2): fp32,
                                                     workload_key("gpt-tiny", 16, 2, "bf16"): bf16})
    assert _Costs(Workload(TOY, 16, 2, False, precision="fp32"), hw).profiled is fp32
    assert _Costs(Workload(TOY, 16, 2, False, precision="bf16"), hw).profiled is bf16
    assert _Costs(Workload(TOY, 16, 2, False, precision="fp16"), hw).profiled is None
    # a profile written before keys named the precision: its one entry, under the plain key, still applies
    # to the precision it was measured in
    old = dataclasses.replace(base, compute_profiles={workload_key("gpt-tiny", 16, 2): _entry(TOY, dtype="bf16")})
    assert _Costs(Workload(TOY, 16, 2, False, precision="bf16"), old).profiled is not None
    assert _Costs(Workload(TOY, 16, 2, False, precision="fp32"), old).profiled is None


def test_a_plan_is_priced_on_the_entry_of_its_own_precision() -> None:
    """make_plan and Plan.workload carry the precision: a bf16 plan on a profile holding both entries is priced on
    the bf16 compute, never on the fp32 entry under the plain key."""
    from superoffload.planner.plan import make_plan

    base = get_profile("cpu")
    slow, fast = _entry(TOY, block_fwd_s=0.05, block_bwd_s=0.1), _entry(TOY, dtype="bf16")
    hw = dataclasses.replace(base, compute_profiles={workload_key("gpt-tiny", 16, 2): slow,
                                                     workload_key("gpt-tiny", 16, 2, "bf16"): fast})
    steps = {}
    for precision in ("fp32", "bf16"):
        plan = make_plan(TOY, 16, 2, hw, activation_checkpointing=False, precision=precision)
        w = plan.workload(TOY)
        assert w.precision == precision
        assert _Costs(w, hw).profiled is (slow if precision == "fp32" else fast)
        assert plan.predicted.options["compute"] == "profiled"
        steps[precision] = plan.predicted.step_time_s
    # the fp32 entry's blocks cost 0.1 s more per block, forward and backward, than the bf16 entry's
    assert steps["fp32"] > steps["bf16"] + TOY.layers * 0.1


def test_profiles_round_trip(tmp_path) -> None:
    hw = dataclasses.replace(get_profile("cpu"), compute_profiles={"gpt-tiny:s16:b2": _entry(TOY)})
    hw.save(tmp_path / "p.json")
    assert HardwareProfile.load(tmp_path / "p.json").compute_profiles == hw.compute_profiles
