"""fp32 training (no casts, fp32 copies), the engine's separate param_cast, and SuperOffload on a device
that is the host (no link copies; the next forward waits for the in-place step)."""

from __future__ import annotations

import dataclasses

import pytest

from superoffload.planner.costmodel import Workload, _Builder, predict
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import SYSTEMS, Options, system_spec
from superoffload.shapes import get_shape

W = Workload(get_shape("gpt-1b"), 1024, 2, activation_checkpointing=True)


@pytest.mark.parametrize("system", [s for s in SYSTEMS if s != "torch"])
def test_fp32_has_no_cast_stages_and_moves_4_bytes(system: str) -> None:
    hw = get_profile("gh200")
    bf16 = predict(system, W, hw, Options())
    fp32 = predict(system, W, hw, Options(precision="fp32"))
    assert not {"device_cast", "host_cast"} & set(fp32.stage_s)
    assert {"device_cast", "host_cast"} & set(bf16.stage_s)  # the bf16 pipeline does cast somewhere
    spec = system_spec(system, Options(precision="fp32"), W.shape.total_params())
    assert spec.return_bytes in (0, 4) and spec.grad_d2h_bytes == 4 and spec.fused_cast_bytes == 0
    if system_spec(system, Options(), W.shape.total_params()).grad_device_cast:
        assert fp32.stage_s["device_copy"] > 0  # the device pass over the grads stays, as a copy


def test_fp32_device_copy_is_8_bytes_at_the_device_copy_rate() -> None:
    hw = get_profile("gh200")
    pred = predict("zero_offload", W, hw, Options(precision="fp32"))
    n = W.shape.total_params()
    assert pred.stage_s["device_copy"] == pytest.approx(n * 8 / (hw.device_hbm_gbps * 1e9), rel=1e-6)


def test_param_cast_host_with_grad_cast_device() -> None:
    """The engine's default without a plan: grads cast on the device, GraceAdam writes the bf16 upload."""
    mixed = system_spec("superoffload", Options(grad_cast="device", param_cast="host"), 10**9)
    assert mixed.grad_device_cast and mixed.grad_d2h_bytes == 4
    assert mixed.return_bytes == 2 and not mixed.return_device_cast and mixed.fused_cast_bytes == 2.0
    same = system_spec("superoffload", Options(grad_cast="device", param_cast="device"), 10**9)
    assert same.return_bytes == 4 and same.return_device_cast
    with pytest.raises(ValueError, match="param_cast"):
        Options(param_cast="gpu").validate()
    with pytest.raises(ValueError, match="precision"):
        Options(precision="fp8").validate()


def _depends_on(g, op: int, kind_prefix: str) -> bool:
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        for d in g.ops[o].deps:
            if d not in seen:
                seen.add(d)
                if g.ops[d].name.split(".")[1].startswith(kind_prefix):
                    return True
                todo.append(d)
    return False


def test_superoffload_on_a_host_device_has_no_link_copies_and_waits_for_the_step() -> None:
    cpu = get_profile("cpu")
    w = Workload(get_shape("gpt-tiny"), 128, 2, activation_checkpointing=False)
    opts = Options(speculation=False, bucket_size=65536, precision="fp32")
    so = predict("superoffload", w, cpu, opts)
    assert "d2h" not in so.stage_s and "h2d" not in so.stage_s
    assert "d2h" in predict("zero_offload", w, cpu, opts).stage_s  # DeepSpeed still copies on a CPU
    # the step writes the weights in place: the next iteration's first block waits for a host step
    b = _Builder(w, cpu, system_spec("superoffload", opts, w.shape.total_params()))
    g = b.build()
    fwd0 = next(i for i, op in enumerate(g.ops) if op.name == "it1.fwd0")
    assert _depends_on(g, fwd0, "hadam")
    # and on a real link the same system copies
    gh = predict("superoffload", w, get_profile("gh200"), dataclasses.replace(opts, precision="bf16"))
    assert gh.stage_s["d2h"] > 0 and gh.stage_s["h2d"] > 0


@pytest.mark.parametrize("host_optimizer", ["grace", "cpuadam"])
def test_gradients_cast_on_the_host_have_no_cast_pass_the_step_reads_them_as_they_land(host_optimizer: str) -> None:
    """grad_cast host: the engine hands the bf16 landing buffer to the host kernel (GraceAdam widens it in
    registers; the unfused kernels' gradient copy is `grad.float()`), so no host_cast op is charged and the
    step reads 2 B/param less than with fp32 gradients (grad_cast device), as the commit pass does."""
    hw = get_profile("gh200")
    n = W.shape.total_params()
    host = Options(grad_cast="host", param_cast="host", host_optimizer=host_optimizer, speculation=True,
                   rollback_mode="deferred", device_tail_buckets=0)
    device = dataclasses.replace(host, grad_cast="device")
    h, d = system_spec("superoffload", host, n), system_spec("superoffload", device, n)
    assert h.grad_host_cast and h.grad_d2h_bytes == 2 and d.grad_d2h_bytes == 4
    assert h.spec_extra_bytes == d.spec_extra_bytes - 2 and h.commit_bytes == d.commit_bytes - 2
    pred = predict("superoffload", W, hw, host)
    # the only host cast left is the unfused kernels' weights (`out.copy_(p)` into the bf16 upload); GraceAdam
    # writes that copy in its pass: no host cast at all
    returns = hw.cast_seconds(n, on_host=True) if host_optimizer != "grace" else 0.0
    assert pred.stage_s.get("host_cast", 0.0) == pytest.approx(returns, rel=1e-6)
    # the step's bytes are the kernel's with the 2-byte gradient read
    adam = hw.host_adam_seconds(n, host_optimizer, h.spec_extra_bytes) + hw.host_adam_seconds(
        n, host_optimizer, h.commit_bytes - 28)
    assert pred.stage_s["host_adam"] + pred.stage_s.get("host_commit", 0.0) == pytest.approx(adam, rel=0.02)
    # fp32 training lands fp32 gradients: the saving goes with the cast
    fp32 = system_spec("superoffload", dataclasses.replace(host, precision="fp32"), n)
    fp32_dev = system_spec("superoffload", dataclasses.replace(device, precision="fp32"), n)
    assert fp32.spec_extra_bytes == fp32_dev.spec_extra_bytes
    assert fp32.commit_bytes == fp32_dev.commit_bytes and fp32.lowp_grad_saving == 0
