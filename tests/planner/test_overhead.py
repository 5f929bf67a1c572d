"""Framework-overhead terms: structure counts, their calibrate microbenchmarks, and the cost-model
terms against hand-computed expectations on toy profiles."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from superoffload.harness.models import build_model, get_shape
from superoffload.planner import calibrate as cal
from superoffload.planner import calibrate_systems as cs
from superoffload.planner import overhead as ov
from superoffload.planner.costmodel import Workload, _Costs, predict
from superoffload.planner.hardware import HardwareProfile, LinkCurve
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options
from superoffload.shapes import ModelShape

TOY = ModelShape(name="toy", layers=2, hidden=64, heads=4, vocab=128, ffn_hidden=256, max_seq=32)


def _noop() -> None:
    pass


# ------------------------------------------------------------------------------- structure counts
@pytest.mark.parametrize("model,seq", [("gpt-tiny", 64), ("gpt-small", 128), ("llama-tiny", 32)])
def test_param_tensors_match_the_built_model(model: str, seq: int) -> None:
    shape = get_shape(model)
    built = build_model(shape, seq=seq, seed=0, device="meta")
    unique = {id(p) for p in built.parameters()}  # a tied head is one tensor
    assert ov.param_tensors(shape) == len(unique)


@pytest.mark.parametrize("model,bucket", [("gpt-tiny", 65536), ("gpt-small", 65536), ("gpt-small", 1 << 20),
                                          ("gpt-tiny", 1 << 24), ("llama-tiny", 65536)])
def test_packed_buckets_match_the_engine_layout(model: str, bucket: int) -> None:
    """The cost model's buckets are the engine's: same count and the same parameters in each, in arrival
    order (the model built with max_seq position rows, which is what the shape counts)."""
    from superoffload.engine.layout import ParamSlot, plan_buckets  # read-only use of the engine's packer
    from superoffload.planner.buckets import pack_buckets

    shape = get_shape(model)
    built = build_model(shape, seq=shape.max_seq, seed=0, device="meta")
    params = list({id(p): p for p in built.parameters()}.values())
    slots = [ParamSlot(i, p, str(i), 0, p.numel()) for i, p in enumerate(params)]
    engine = plan_buckets(slots, list(reversed(range(len(slots)))), bucket, 0)
    ours = pack_buckets(shape, bucket)
    assert [sum(n for _, n in b) for b in ours] == [b.numel for b in engine]
    assert ov.engine_buckets(shape, bucket) == len(engine)


# ------------------------------------------------------------------------------- cost-model terms
def _small_op_profile(**extra) -> HardwareProfile:
    base = get_profile("cpu")
    return dataclasses.replace(base, matmul_curve=LinkCurve([10**5, 10**9], [1.0, 100.0]),
                               elementwise_gbps=10.0, op_overhead_s=4e-6, attention_bwd_ratio=2.5, **extra)


def test_profiles_without_the_new_fields_predict_as_before() -> None:
    w = Workload(get_shape("gpt-tiny"), 128, 2, activation_checkpointing=False)
    hw = _small_op_profile()
    c = _Costs(w, hw)
    assert ov.block_forward_overhead_s(w.shape, hw) == 0.0 and ov.optimizer_overhead_s(w.shape, hw, True) == 0.0
    assert ov.gelu_seconds(w.shape, 256, hw) is None
    assert predict("zero_offload", w, hw).stage_s.keys() == predict("zero_offload", w, hw).stage_s.keys()
    assert "optimizer_overhead" not in predict("torch", w, hw).stage_s
    assert c.fwd_layer > 0


def test_module_and_gelu_terms_hand_computed() -> None:
    w = Workload(TOY, 32, 2, activation_checkpointing=False)
    before = _Costs(w, _small_op_profile())
    hw = _small_op_profile(module_call_s=1e-6, gelu_elems_per_s=1e8)
    after = _Costs(w, hw)
    tokens = 64
    gelu = tokens * TOY.ffn_hidden / 1e8
    traffic = tokens * 2 * TOY.ffn_hidden * 4 / (10.0 * 1e9)  # the activation's 2f elements, now in gelu
    python = 9 * 1e-6 + 7 * 4e-6  # 9 module calls + 7 view ops per GPT block
    assert after.fwd_layer == pytest.approx(before.fwd_layer - traffic + gelu / 3 + python, rel=1e-9)
    # backward doubles the traffic it lost, gets 2/3 of the activation, and no module calls
    assert after.bwd_layer == pytest.approx(before.bwd_layer - 2 * traffic + 2 * gelu / 3, rel=1e-9)
    assert after.fwd_head == pytest.approx(before.fwd_head + 5 * 1e-6, rel=1e-9)


def test_torch_optimizer_terms_hand_computed() -> None:
    w = Workload(TOY, 32, 2, activation_checkpointing=False)
    hw0 = _small_op_profile()
    hw = dataclasses.replace(hw0, optimizer_tensor_s=1e-4, clip_gbps=2.0)
    n = TOY.total_params()
    base = predict("torch", w, hw0, Options(clipping=True))
    new = predict("torch", w, hw, Options(clipping=True))
    noclip = predict("torch", w, hw, Options(clipping=False))
    tensors = 4 + 12 * TOY.layers  # wte, wpe, ln_f (2) + 12 per block
    assert ov.param_tensors(TOY) == tensors
    # the device is the host: torch AdamW at the measured host rate instead of the cast rate
    adam_delta = n * 28 / (hw.host_adam_gbps["torch"] * 1e9) - n * 28 / (hw.device_cast_gbps * 1e9)
    opt = tensors * 1e-4 + n * 12 / 2e9
    assert new.step_time_s - base.step_time_s == pytest.approx(adam_delta + opt, rel=1e-6)
    assert new.step_time_s - noclip.step_time_s == pytest.approx(n * 12 / 2e9, rel=1e-6)
    assert new.stage_s["optimizer_overhead"] == pytest.approx(opt, rel=1e-9)


def test_system_step_terms_hand_computed() -> None:
    w = Workload(get_shape("gpt-tiny"), 128, 2, activation_checkpointing=False)
    hw0 = _small_op_profile()
    coeffs = {"fixed_s": 1e-3, "per_layer_s": 2e-4, "per_tensor_s": 1e-5, "per_bucket_s": 3e-5}
    hw = dataclasses.replace(hw0, system_step_s={"zero_offload": coeffs, "superoffload": coeffs})
    zero = 1e-3 + 2e-4 * 4 + 1e-5 * 52  # gpt-tiny: 4 layers, 52 tensors; DeepSpeed has no engine buckets
    delta = predict("zero_offload", w, hw).step_time_s - predict("zero_offload", w, hw0).step_time_s
    assert delta == pytest.approx(zero, rel=1e-6)
    assert predict("zero_offload", w, hw).stage_s["system_overhead"] == pytest.approx(zero, rel=1e-9)
    opts = Options(speculation=False, bucket_size_params=65536, cast_policy="device")
    so = predict("superoffload", w, hw, opts).stage_s["system_overhead"]
    assert so == pytest.approx(zero + 3e-5 * 23, rel=1e-9)  # the engine packs gpt-tiny into 23 buckets
    per_param = dataclasses.replace(hw, system_step_s={"zero_offload": {**coeffs, "per_param_s": 1e-9}})
    delta = predict("zero_offload", w, per_param).step_time_s - predict("zero_offload", w, hw).step_time_s
    assert delta == pytest.approx(1e-9 * w.shape.total_params(), rel=1e-6)
    # a system the profile has no coefficients for is unchanged
    assert predict("fsdp_offload", w, hw).step_time_s == pytest.approx(predict("fsdp_offload", w, hw0).step_time_s)


def test_new_fields_round_trip(tmp_path) -> None:
    hw = _small_op_profile(gelu_elems_per_s=1e8, module_call_s=1e-6, optimizer_tensor_s=1e-5, clip_gbps=3.0,
                           system_step_s={"fsdp_offload": {"fixed_s": 1e-3, "per_layer_s": 0.0,
                                                           "per_tensor_s": 1e-5, "per_bucket_s": 0.0}})
    hw.save(tmp_path / "p.json")
    assert HardwareProfile.load(tmp_path / "p.json") == hw


# ------------------------------------------------------------------------- calibrate microbenchmarks
def test_overhead_microbenchmarks_are_positive() -> None:
    assert cal._gelu_rate("cpu", _noop, n=4096) > 0
    assert 0 < cal._module_call_s("cpu", _noop, n=20) < 1e-3
    assert cal._optimizer_tensor_s("cpu", _noop, tensors=4, elems=16) >= 0
    assert cal._clip_gbps("cpu", _noop, 4096) > 0
    notes: list[str] = []
    fields = cal._overhead_fields("cpu", quick=True, systems=True, sync=_noop, notes=notes)
    assert set(fields) == {"gelu_elems_per_s", "module_call_s", "optimizer_tensor_s", "clip_gbps"}
    assert any("not measured (--quick)" in n for n in notes)


def test_degenerate_model_counts_and_forward_backward() -> None:
    m = cs.DegenerateLM(3, 2)
    assert len(list(m.parameters())) == cs.param_tensors(3, 2)
    assert cs.forward_backward_s(1, 1, steps=2) > 0


def test_superoffload_step_machinery_on_the_degenerate_model() -> None:
    torch.set_num_threads(1)
    t, buckets = cs.system_step_s("superoffload", 2, 1, 32, steps=2)
    assert buckets > 2 and isinstance(t, float)


def test_fit_recovers_linear_coefficients(monkeypatch) -> None:
    """The fit's algebra on a synthetic system whose step is exactly fixed + per_layer*blocks +
    per_tensor*tensors + per_bucket*buckets (buckets: 1 for a large bucket, 10 for a small one)."""
    truth = {"fixed_s": 2e-3, "per_layer_s": 3e-4, "per_tensor_s": 5e-5, "per_bucket_s": 7e-5,
             "per_param_raw_s": 3e-9}

    def fake(system, blocks, per_block, bucket, steps=25, optimizer_tensor_s=0.0, width=cs.WIDTH):
        buckets = 1 if bucket > 1000 else 10
        t = (truth["fixed_s"] + truth["per_layer_s"] * blocks
             + truth["per_tensor_s"] * cs.param_tensors(blocks, per_block) + truth["per_bucket_s"] * buckets
             + truth["per_param_raw_s"] * cs.param_count(blocks, per_block, width))
        return t, buckets

    monkeypatch.setattr(cs, "system_step_s", fake)
    got = cs.fit("superoffload")
    assert got == pytest.approx(truth, rel=1e-9)
    assert cs.fit("zero_offload")["per_bucket_s"] == 0.0


def test_per_param_slope_is_net_of_what_the_model_charges() -> None:
    hw = dataclasses.replace(get_profile("cpu"), system_step_s={
        "zero_offload": {"fixed_s": 1e-3, "per_layer_s": 0.0, "per_tensor_s": 0.0, "per_bucket_s": 0.0,
                         "per_param_raw_s": 1e-7}})
    modelled = cs.modelled_per_param_s("zero_offload", hw)
    assert 0 < modelled < 1e-7  # D2H, CPU-Adam, the pageable return: a few ns per parameter
    net = cs.net_of_model(hw)["zero_offload"]
    assert net["per_param_s"] == pytest.approx(1e-7 - modelled) and net["per_param_raw_s"] == 1e-7
    assert net["fixed_s"] == 1e-3


def test_measure_reports_a_failing_system_in_the_notes() -> None:
    out, notes = cs.measure(("no_such_system",), timeout_s=60)
    assert out == {} and "no_such_system not measured" in notes[0]


def test_attention_curve_term_hand_computed() -> None:
    from superoffload.planner.costmodel import attention_seconds
    from superoffload.planner.flops import layer_forward_flops

    hw0 = _small_op_profile()
    hw = dataclasses.replace(hw0, attention_curve=LinkCurve([10**6, 10**8], [10.0, 50.0]))
    w = Workload(TOY, 32, 2, activation_checkpointing=False)
    flops = layer_forward_flops(TOY, 32, 2).attention  # 2·b·s²·h = 262144: below the curve, clamped
    assert attention_seconds(hw, flops) == pytest.approx(flops / 10e9)
    assert attention_seconds(hw0, flops) == pytest.approx(flops / (hw0.device_matmul_flops * hw0.attention_factor))
    before, after = _Costs(w, hw0), _Costs(w, hw)
    delta = flops / 10e9 - attention_seconds(hw0, flops)
    assert after.fwd_layer - before.fwd_layer == pytest.approx(delta, rel=1e-9)
    assert after.bwd_layer - before.bwd_layer == pytest.approx(2.5 * delta, rel=1e-9)  # attention_bwd_ratio


def test_attention_curve_microbenchmark() -> None:
    curve = cal._attention_curve("cpu", torch.float32, True, _noop)
    assert len(curve.sizes) == 3 and all(g > 0 for g in curve.gbps)


def test_cold_matmul_microbenchmark() -> None:
    """The GEMM curve rotates through a pool of operand pairs (cold caches); tiny pool for speed."""
    assert cal._cold_matmul_flops("cpu", torch.float32, 32, 3, _noop, pool_bytes=1 << 16) > 0
    curve = cal._matmul_curve("cpu", torch.float32, True, _noop, pool_bytes=1 << 20)
    assert len(curve.sizes) == 3 and all(g > 0 for g in curve.gbps)
