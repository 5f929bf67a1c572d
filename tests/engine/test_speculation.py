"""Speculation-then-validation: bit-identical to validate-then-step under clipping, NaN/Inf and fp16
overflow, with gradient accumulation and across a checkpoint resume."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import superoffload
from tests.engine.helpers import (
    OPT,
    Schedule,
    assert_state_equal,
    batches,
    device_kernels_on_host,
    make_model,
    make_schedule,
    run,
)


@pytest.mark.parametrize("steps", [40, pytest.param(200, marks=pytest.mark.slow)])
@pytest.mark.parametrize("precision,mode,slots", [("fp32", "deferred", 0), ("bf16", "deferred", 0),
                                                 ("fp16", "deferred", 0), ("bf16", "full_copy", 0),
                                                 ("bf16", "deferred", 2), ("fp32", "full_copy", 1)])
def test_200_steps_speculation_equals_validate_then_step(precision, mode, slots, steps):
    """Also through an upload ring (`upload_slots`), against validate-first with per-bucket buffers. CI runs 40
    steps (clipping on 6, five injections: Inf in the first and last bucket, NaN in the middle and tail one,
    one step with a NaN and an Inf); 200 is marked slow."""
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": precision, "bucket_size": 40_000, "device_tail_buckets": 1,
           "rollback_mode": mode}
    if precision == "fp16":  # the injections drive the scale to its minimum: keep skipping, do not raise
        cfg["loss_scale"] = {"init_scale": 2.0**8, "growth_interval": 20, "raise_at_min_scale": False}
    spec = run(make_model, {**cfg, "speculation": True, "upload_slots": slots,
                            "speculation_policy": {"max_rollback_rate": 1.0}}, steps, make_schedule(steps), data)
    ref = run(make_model, {**cfg, "speculation": False}, steps, make_schedule(steps), data)
    if slots:
        assert spec.upload_ring is not None and len(spec.upload_ring) == slots
    assert_state_equal(spec.state_dict(), ref.state_dict())
    for a, b in zip(spec.model.parameters(), ref.model.parameters(), strict=True):
        assert torch.equal(a, b)
    s, r = spec.stats["speculation"], ref.stats["speculation"]
    assert s["speculated"] == steps and r["validate_first"] == steps
    sched = make_schedule(steps)
    assert s["skipped"] == len(sched.inject)  # every injection skips the step
    assert s["clipped"] == len(set(sched.clip) - set(sched.inject))  # a skipped step is not also clipped
    assert s["rolled_back"] == s["clipped"] + s["skipped"]
    if precision == "fp16":
        assert spec.loss_scale.scale == ref.loss_scale.scale < 2.0**8 * 2 ** (steps // 20)


def test_speculation_exact_with_grad_accumulation():
    steps = 30
    data = batches(seq=16, batch=1, accum=2)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device_tail_buckets": 1}
    spec = run(make_model, {**cfg, "speculation_policy": {"max_rollback_rate": 1.0}}, steps, make_schedule(steps),
               data, accum=2)
    ref = run(make_model, {**cfg, "speculation": False}, steps, make_schedule(steps), data, accum=2)
    assert_state_equal(spec.state_dict(), ref.state_dict())
    assert spec.stats["speculation"]["rolled_back"] > 0


@pytest.mark.parametrize("device,first_slots,resumed_slots", [("host", 0, 0), ("sim", 2, 0), ("sim", 0, 3)])
def test_speculation_exact_across_resume(device, first_slots, resumed_slots):
    """Also across upload layouts: a checkpoint holds no transfer buffer, so a run saved with an upload
    ring resumes bit-exactly without one and the other way round."""
    steps, half = 30, 15
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000,
           "speculation_policy": {"max_rollback_rate": 1.0}}
    ref = run(make_model, {**cfg, "speculation": False}, steps, make_schedule(steps), data)
    first = run(make_model, {**cfg, "device": device, "upload_slots": first_slots}, half, make_schedule(steps), data)
    sd = first.state_dict()
    sched = make_schedule(steps)
    model = make_model(seed=5)
    sched.attach(model)
    resumed = superoffload.initialize(model, {**cfg, "device": device, "upload_slots": resumed_slots})
    resumed.load_state_dict(sd)
    for i in range(half, steps):
        sched.before_step(resumed, i)
        b = data.batch_at(i)
        resumed.backward(resumed(b.inputs[0], b.targets[0]))
        resumed.step()
    assert_state_equal(resumed.state_dict(), ref.state_dict())


class MLP(torch.nn.Module):
    def __init__(self, widths: list[int], seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))

    def forward(self, x):
        x = x.to(self.layers[0].weight.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x.float().square().mean()


class _XData:
    def __init__(self, width: int):
        self.width = width

    def batch_at(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(4, self.width, generator=g)

        class B:
            inputs = [x]
            targets = [None]

        return B


CASES = {"widths": st.lists(st.integers(1, 24), min_size=2, max_size=5),
         "bucket_size": st.integers(1, 800), "tail": st.integers(0, 2),
         "precision": st.sampled_from(["fp32", "bf16", "fp16"]), "accum": st.integers(1, 2),
         "mode": st.sampled_from(["deferred", "full_copy"]),
         "inject": st.dictionaries(st.integers(1, 9), st.lists(st.tuples(
             st.sampled_from(["first", "middle", "last", "tail"]), st.sampled_from([math.nan, math.inf, -math.inf])),
             max_size=2), max_size=3),
         "clip_steps": st.sets(st.integers(0, 9), max_size=4), "skip_nonfinite": st.booleans(),
         "device": st.sampled_from(["host", "sim"]), "slots": st.integers(0, 3)}


# derandomized so CI is reproducible; 600 random cases passed when this was written. CI draws 25 cases
# (7 s on a 2-core machine beside other jobs, where 100 took 28 s); the slow twin draws 100.
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_property_random_shapes_buckets_injections(widths, bucket_size, tail, precision, accum, mode, inject,
                                                  clip_steps, skip_nonfinite, device, slots):
    _check_random_case(widths, bucket_size, tail, precision, accum, mode, inject, clip_steps, skip_nonfinite,
                       device, slots)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(**CASES)
def test_property_random_shapes_buckets_injections_100_cases(widths, bucket_size, tail, precision, accum, mode,
                                                             inject, clip_steps, skip_nonfinite, device, slots):
    _check_random_case(widths, bucket_size, tail, precision, accum, mode, inject, clip_steps, skip_nonfinite,
                       device, slots)


def _check_random_case(widths: list[int], bucket_size: int, tail: int, precision: str, accum: int, mode: str,
                       inject: dict, clip_steps: set[int], skip_nonfinite: bool, device: str, slots: int) -> None:
    """Speculation on `device` equals validate-first on the CPU-only device, bit for bit (so on the
    simulated device it also checks that the CUDA code path computes exactly what the host path does),
    also with skip_nonfinite off, where a non-finite shard is committed by a redo, and through an upload
    ring of `slots` slots (0: per-bucket upload buffers) against per-bucket buffers."""
    cfg = {"optimizer": OPT, "precision": precision, "bucket_size": bucket_size, "device_tail_buckets": tail,
           "rollback_mode": mode, "grad_accum": accum, "skip_nonfinite": skip_nonfinite}

    def model_fn():
        return MLP(widths, seed=0)

    def sched():
        return Schedule({i: 1e-4 for i in clip_steps}, inject, base_clip=1e4)

    data = _XData(widths[0])
    spec = _run_mlp(model_fn, {**cfg, "device": device, "upload_slots": slots,
                               "speculation_policy": {"max_rollback_rate": 1.0}}, sched(), data)
    # on the simulated device the tail buckets run torch's fused AdamW (the CUDA kernels): the reference
    # host device runs them too, so the two differ only in the path a bucket takes
    kernels = device_kernels_on_host() if device == "sim" else contextlib.nullcontext()
    with kernels:
        ref = _run_mlp(model_fn, {**cfg, "device": "host", "speculation": False}, sched(), data)
    assert_state_equal(spec.state_dict(), ref.state_dict())
    spec.close()
    ref.close()


def _run_mlp(model_fn, cfg, sched: Schedule, data, steps: int = 10):
    model = model_fn()
    sched.attach(model)
    engine = superoffload.initialize(model, cfg)
    for i in range(steps):
        sched.before_step(engine, i)
        for micro in range(cfg.get("grad_accum", 1)):
            engine.backward(engine(data.batch_at(100 * i + micro).inputs[0]))
        engine.step()
    engine.synchronize()
    return engine


def test_nonfinite_bucket_is_never_stepped_and_step_is_skipped():
    data = batches(seq=16, batch=1)
    sched = Schedule({}, {2: [("middle", math.nan)]}, base_clip=0.0)
    engine = run(make_model, {"optimizer": OPT, "bucket_size": 40_000}, 4, sched, data)
    sd = engine.state_dict()
    assert {e["step"] for e in sd["params"].values()} == {3}  # 4 steps, one skipped everywhere
    assert engine.stats["speculation"]["skipped"] == 1
    assert all(torch.isfinite(p).all() for p in engine.model.parameters())


def test_warmup_policy_switches_to_validate_first_when_rollbacks_are_frequent():
    data = batches(seq=16, batch=1)
    sched = Schedule({i: 1e-4 for i in range(20)}, {}, base_clip=1e4)  # clipping fires every step
    engine = run(make_model, {"optimizer": OPT, "bucket_size": 40_000,
                              "speculation_policy": {"window": 4, "max_rollback_rate": 0.5}}, 20, sched, data)
    s = engine.stats["speculation"]
    # speculates until the window fills with rollbacks, then validates first for the rest
    assert s["speculated"] == 1 and s["validate_first"] == 19 and s["recent_rollback_rate"] == 1.0


@pytest.mark.parametrize("steps", [8, pytest.param(12, marks=pytest.mark.slow)])
@pytest.mark.parametrize("at_init,planned", [(0, 2), (3, 0)])
def test_upload_ring_changed_by_reconfigure_with_flowed_blocks(at_init, planned, steps):
    """A plan may change upload_slots after initialize (superoffload.AdamW reconfigures at the first step),
    when the flowed blocks' buckets are already built: they keep what they were built with (their own
    buffers, or a ring) and the rest follow the new value; the run equals validate-first bit for bit. CI
    runs 8 steps (clipping at 3, an Inf in the first bucket at 5, NaN and Inf in two at 4); 12 is marked
    slow."""
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 4096, "device": "sim", "flow_layers": [1, 2],
           "speculation_policy": {"max_rollback_rate": 1.0}}
    sched = make_schedule(steps)
    model = make_model()
    sched.attach(model)
    engine = superoffload.initialize(model, {**cfg, "upload_slots": at_init})
    engine.reconfigure({"upload_slots": planned})
    for i in range(steps):
        sched.before_step(engine, i)
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0], b.targets[0]))
        engine.step()
    engine.synchronize()
    ref = run(make_model, {**cfg, "speculation": False}, steps, make_schedule(steps), data)
    assert engine.upload_ring is not None
    assert_state_equal(engine.state_dict(), ref.state_dict())
    for a, b in zip(engine.model.parameters(), ref.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_rollback_rate_is_none_when_nothing_speculates():
    """With speculation off nothing is rolled back: the stats say None, and report apart how often the
    recent steps clipped or skipped (what a speculation would have redone)."""
    steps = 6
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "speculation": False, "grad_clip": 1e-6}
    engine = run(make_model, cfg, steps, Schedule({}, {}, base_clip=1e-6), data)
    s = engine.stats["speculation"]
    assert s["enabled"] is False and s["recent_rollback_rate"] is None
    assert s["recent_clip_or_skip_rate"] == 1.0 and s["validate_first"] == steps
    assert engine.stats["upload_slots"] == 0
