"""Non-finite runs are loud: a run that skips its steps raises or ends non-ok, NaN weights and states are
refused before any work, and records tell a NaN loss from a step without a learned token."""

from __future__ import annotations

import math

import pytest
import torch

import superoffload
from superoffload.engine import NonFiniteError
from superoffload.harness import record
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig
from tests.engine.test_misuse import OPT, TinyLM, batch


def _engine(model=None, **cfg):
    return superoffload.initialize(model or TinyLM(), {"optimizer": OPT, "bucket_size": 3000, "device": "host",
                                                       "speculation_policy": {"max_rollback_rate": 1.0}, **cfg})


def _poison(model, on: list[bool]) -> None:
    """A NaN gradient in the head while on[0] is true (registered first: runs before the engine's hook)."""
    def hook(p: torch.Tensor) -> None:
        if on[0]:
            p.grad.view(-1)[0] = math.nan

    model.head.weight.register_post_accumulate_grad_hook(hook)


@pytest.mark.parametrize("device", ["host", "sim"])
def test_steps_skipped_in_a_row_raise_and_the_engine_stays_usable(device):
    model, on = TinyLM(), [True]
    _poison(model, on)
    engine = _engine(model, max_consecutive_skips=3, device=device)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for i in range(2):
        engine.backward(engine(*batch(i)))
        assert engine.step() is False and engine.last_step_applied is False
    engine.backward(engine(*batch(2)))
    with pytest.raises(NonFiniteError, match="3 consecutive optimizer steps .* were skipped"):
        engine.step()
    engine.synchronize()
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing was applied
    on[0] = False
    engine.backward(engine(*batch(3)))
    assert engine.step() is True  # the skipped step completed: training goes on
    assert engine.stats["speculation"]["skipped"] == 3


def test_fp16_overflow_at_the_minimum_loss_scale_raises():
    model, on = TinyLM(), [True]
    _poison(model, on)
    engine = _engine(model, precision="fp16", loss_scale={"init_scale": 2.0, "min_scale": 1.0})
    engine.backward(engine(*batch(0)))
    assert engine.step() is False  # 2 -> 1: the scale can still back off
    engine.backward(engine(*batch(1)))
    with pytest.raises(NonFiniteError, match="loss scale at its minimum"):
        engine.step()
    quiet = _engine(TinyLM(), precision="fp16", loss_scale={"init_scale": 1.0, "raise_at_min_scale": False})
    _poison(quiet.model, [True])
    quiet.backward(quiet(*batch(0)))
    assert quiet.step() is False  # asked to keep skipping


def test_non_finite_weights_and_states_are_refused_before_any_work():
    model = TinyLM()
    with torch.no_grad():
        model.blocks[0][1].weight[0, 0] = math.inf
    with pytest.raises(ValueError, match=r"non-finite weights .* blocks\.0\.1\.weight \(1 of"):
        _engine(model)
    engine = _engine()
    engine.backward(engine(*batch(0)))
    engine.step()
    sd = engine.state_dict()
    for key, value in (("master", math.nan), ("exp_avg_sq", -1.0)):
        bad = {**sd, "params": {n: dict(e) for n, e in sd["params"].items()}}
        t = bad["params"]["head.weight"][key].clone()
        t.view(-1)[3] = value
        bad["params"]["head.weight"][key] = t
        with pytest.raises(ValueError, match=f"head.weight .* {key} value"):
            _engine().load_state_dict(bad)


def test_a_run_record_marks_nan_losses_and_skipped_steps_and_is_not_ok():
    """fp16 at lr 1000 under torch's GradScaler: the loss turns NaN and most steps are skipped (the
    reliability report's 5e: an ok record, then a crash printing it)."""
    from superoffload.cli.bench_run import summary_line

    run = RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2, steps=6, warmup=1, threads=1, dtype="fp16",
                    lr=1000.0)
    rec = run_benchmark(run)
    record.validate(rec)
    assert rec["status"] == "error" and rec["error"].startswith("non-finite:")
    assert len(rec["step_skipped"]) == 7 and sum(rec["step_skipped"]) > 3
    assert any(rec["loss_nonfinite"]) and all(v is None for v, bad in zip(rec["losses"], rec["loss_nonfinite"],
                                                                            strict=True) if bad)
    assert "ERROR: non-finite" in summary_line(rec)


def test_the_verdict_needs_most_steps_skipped():
    assert record.nonfinite_verdict([True, False, True, False]) is None
    assert record.nonfinite_verdict([True, True, True]) is None  # too few steps to say
    assert "3 of 4 optimizer steps" in record.nonfinite_verdict([True, True, False, True])
    assert record.nonfinite_verdict(None) is None
