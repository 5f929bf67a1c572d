"""Framework-overhead terms: structure counts, their calibrate microbenchmarks, and the cost-model
terms against hand-computed expectations on toy profiles."""

from __future__ import annotations

import dataclasses

import pytest

from superoffload.models import build_model
from superoffload.planner import overhead as ov
from superoffload.planner.costmodel import Workload, _Costs, predict
from superoffload.planner.hardware import Curve, HardwareProfile
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options
from superoffload.shapes import ModelShape, get_shape

TOY = ModelShape(name="toy", layers=2, hidden=64, heads=4, vocab=128, ffn_hidden=256, max_seq=32)


# ------------------------------------------------------------------------------- structure counts
@pytest.mark.parametrize("model,seq", [("gpt-tiny", 64), ("gpt-small", 128), ("llama-tiny", 32)])
def test_param_tensors_match_the_built_model(model: str, seq: int) -> None:
    shape = get_shape(model)
    built = build_model(shape, seq=seq, seed=0, device="meta")
    unique = {id(p) for p in built.parameters()}  # a tied head is one tensor
    assert ov.param_tensors(shape) == len(unique)
    # the shape's tensor list is the built model's, tensor by tensor, in registration order (with
    # position rows for max_seq, which is what the shape counts)
    full = build_model(shape, seq=shape.max_seq, seed=0, device="meta")
    assert [n for _, n in shape.param_tensors()] == [p.numel() for p in {id(p): p for p in full.parameters()}.values()]


@pytest.mark.parametrize("model,bucket", [("gpt-tiny", 65536), ("gpt-small", 65536), ("gpt-small", 1 << 20),
                                          ("gpt-tiny", 1 << 24), ("llama-tiny", 65536)])
def test_packed_buckets_match_the_engine_layout(model: str, bucket: int) -> None:
    """The cost model's buckets are the engine's: same count and the same parameters in each, in arrival
    order (the model built with max_seq position rows, which is what the shape counts)."""
    from superoffload.engine.layout import ParamSlot, plan_buckets  # the engine's own packing, read-only
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
    return dataclasses.replace(base, matmul_curve=Curve([10**5, 10**9], [1.0, 100.0]),
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
    base = predict("torch", w, hw0, Options(grad_clip=1.0))
    new = predict("torch", w, hw, Options(grad_clip=1.0))
    noclip = predict("torch", w, hw, Options(grad_clip=0.0))
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
    opts = Options(speculation=False, bucket_size=65536, grad_cast="device", param_cast="device")
    so = predict("superoffload", w, hw, opts).stage_s["system_overhead"]
    # the engine packs gpt-tiny into 25 buckets: its two 131,072-element embedding tables split in two each
    assert so == pytest.approx(zero + 3e-5 * 25, rel=1e-9)
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


def test_attention_curve_term_hand_computed() -> None:
    from superoffload.planner.costmodel import attention_seconds
    from superoffload.planner.flops import layer_forward_flops

    hw0 = _small_op_profile()
    hw = dataclasses.replace(hw0, attention_curve=Curve([10**6, 10**8], [10.0, 50.0]))
    w = Workload(TOY, 32, 2, activation_checkpointing=False)
    flops = layer_forward_flops(TOY, 32, 2).attention  # 2·b·s²·h = 262144: below the curve, clamped
    assert attention_seconds(hw, flops) == pytest.approx(flops / 10e9)
    assert attention_seconds(hw0, flops) == pytest.approx(flops / (hw0.device_matmul_flops * hw0.attention_factor))
    before, after = _Costs(w, hw0), _Costs(w, hw)
    delta = flops / 10e9 - attention_seconds(hw0, flops)
    assert after.fwd_layer - before.fwd_layer == pytest.approx(delta, rel=1e-9)
    assert after.bwd_layer - before.bwd_layer == pytest.approx(2.5 * delta, rel=1e-9)  # attention_bwd_ratio
