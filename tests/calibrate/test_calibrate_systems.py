"""Calibration microbenchmarks: the framework-overhead constants, the degenerate-model step machinery of
each system and the fit of its coefficients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from superoffload.calibrate import machine as cal
from superoffload.calibrate import systems as cs
from superoffload.planner.presets import get_profile


def _noop() -> None:
    pass


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


def test_attention_curve_microbenchmark() -> None:
    curve = cal._attention_curve("cpu", torch.float32, True, _noop)
    assert len(curve.sizes) == 3 and all(g > 0 for g in curve.gbps)


def test_cold_matmul_microbenchmark() -> None:
    """The GEMM curve rotates through a pool of operand pairs (cold caches); tiny pool for speed."""
    assert cal._cold_matmul_flops("cpu", torch.float32, 32, 3, _noop, pool_bytes=1 << 16) > 0
    curve = cal._matmul_curve("cpu", torch.float32, True, _noop, pool_bytes=1 << 20)
    assert len(curve.sizes) == 3 and all(g > 0 for g in curve.gbps)
