"""The out-of-place step (double-buffered state) and the step that also returns gradient statistics:
same bits as the in-place step and as `grad_stats`, on every ISA, thread count and split."""

from __future__ import annotations

import pytest
import torch

import grace_adam
from grace_adam import _backend, _fallback
from grace_adam._hyper import adam_consts
from tests.grace_adam.test_exactness import HYPER, clone_all, make_state, requires_native

KW = dict(step=4, weight_decay=0.1, grad_scale=0.5, **HYPER)
SIZES = [1, 17, 16384, 16385, 3 * 16384 + 7]


def in_place(p, g, m, v, vm, amsgrad, lowp):
    p, m, v, vm = clone_all([p, m, v, vm])
    lo = torch.empty(p.numel(), dtype=lowp) if lowp is not None else None
    grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm if amsgrad else None, lowp_out=lo, **KW)
    return [p, m, v, vm] + ([lo] if lo is not None else [])


def out_of_place(p, g, m, v, vm, amsgrad, lowp, threads=None, splits=()):
    n = p.numel()
    ins = clone_all([p, m, v, vm])
    outs = [torch.full((n,), 7.0) for _ in range(4)]
    lo = torch.empty(n, dtype=lowp) if lowp is not None else None
    bounds = [0, *splits, n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        grace_adam.adam_step(ins[0][a:b], g[a:b], ins[1][a:b], ins[2][a:b],
                             max_exp_avg_sq=ins[3][a:b] if amsgrad else None, commit=False,
                             param_out=outs[0][a:b], exp_avg_out=outs[1][a:b], exp_avg_sq_out=outs[2][a:b],
                             max_exp_avg_sq_out=outs[3][a:b] if amsgrad else None,
                             lowp_out=lo[a:b] if lo is not None else None, threads=threads, **KW)
    for before, after in zip([p, m, v, vm], ins, strict=True):
        assert torch.equal(before, after), "the out-of-place step wrote an input"
    if not amsgrad:
        outs[3] = vm.clone()  # untouched either way
    return outs + ([lo] if lo is not None else [])


@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("lowp", [None, torch.bfloat16])
def test_out_of_place_equals_in_place_every_isa(gdt, amsgrad, lowp, isa_restore):
    n = 40_001
    p, g, m, v, vm = make_state(n, seed=5, gdt=gdt)
    ref = in_place(p, g, m, v, vm, amsgrad, lowp)
    for isa in grace_adam.available_isas() or ["torch"]:
        if isa != "torch":
            _backend._force_isa(isa)
            _backend._set_min_chunk(16)
        for threads, splits in [(1, ()), (3, (17, 4099)), (2, (n - 3,))]:
            got = out_of_place(p, g, m, v, vm, amsgrad, lowp, threads, splits)
            for r, o in zip(ref, got, strict=True):
                assert torch.equal(r, o), (isa, threads, splits)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16, torch.float16])
def test_step_stats_equal_grad_stats_and_plain_step(n, gdt, isa_restore):
    p, g, m, v, vm = make_state(n, seed=6, gdt=gdt)
    ref = in_place(p, g, m, v, vm, False, torch.bfloat16)
    ref_stats = grace_adam.grad_stats(g, grad_scale=KW["grad_scale"])
    for isa in grace_adam.available_isas() or ["torch"]:
        if isa != "torch":
            _backend._force_isa(isa)
            _backend._set_min_chunk(16)
        for threads in (1, 2, 4):
            pp, mm, vv = clone_all([p, m, v])
            lo = torch.empty(n, dtype=torch.bfloat16)
            stats = grace_adam.adam_step(pp, g, mm, vv, lowp_out=lo, return_stats=True, threads=threads, **KW)
            assert stats == ref_stats, (isa, threads)  # float == float: the same bits (never NaN here)
            for r, o in zip(ref, [pp, mm, vv, vm, lo], strict=True):
                assert torch.equal(r, o), (isa, threads)


def test_step_stats_flags_nonfinite_like_grad_stats():
    n = 50_000
    p, g, m, v, _ = make_state(n, seed=7)
    for bad, pos in ((float("nan"), 3), (float("inf"), n - 1), (-float("inf"), 20_000)):
        gg = g.clone()
        gg[pos] = bad
        o = [torch.empty(n) for _ in range(3)]
        got = grace_adam.adam_step(p, gg, m, v, commit=False, param_out=o[0], exp_avg_out=o[1], exp_avg_sq_out=o[2],
                                   return_stats=True, **KW)
        want = grace_adam.grad_stats(gg, grad_scale=KW["grad_scale"])
        assert got[1] is False and want[1] is False


@requires_native
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fallback_out_of_place_and_stats_match_native(amsgrad):
    n = 20_011
    p, g, m, v, vm = make_state(n, seed=8, gdt=torch.bfloat16)
    native = out_of_place(p, g, m, v, vm, amsgrad, torch.float16)
    c = adam_consts(step=KW["step"], lr=HYPER["lr"], beta1=HYPER["beta1"], beta2=HYPER["beta2"], eps=HYPER["eps"],
                    weight_decay=KW["weight_decay"], adamw=True, bias_correction=True, grad_scale=KW["grad_scale"])
    outs = [torch.empty(n) for _ in range(4)]
    lo = torch.empty(n, dtype=torch.float16)
    _fallback.adam_step(p, g, m, v, vm if amsgrad else None, c, False, outs[0], lo,
                        (outs[1], outs[2], outs[3] if amsgrad else None))
    if not amsgrad:
        outs[3] = vm.clone()
    for a, b in zip(native, outs + [lo], strict=True):
        assert torch.equal(a, b)
    assert _fallback.grad_stats(g, c.grad_scale, 16384) == grace_adam.grad_stats(g, grad_scale=KW["grad_scale"])


def test_out_of_place_argument_errors():
    n = 64
    p, g, m, v, vm = make_state(n)
    o = [torch.empty(n) for _ in range(4)]
    with pytest.raises(ValueError, match="commit=False"):
        grace_adam.adam_step(p, g, m, v, exp_avg_out=o[1], exp_avg_sq_out=o[2], param_out=o[0], **KW)
    with pytest.raises(ValueError, match="missing: \\['param_out'\\]"):
        grace_adam.adam_step(p, g, m, v, commit=False, exp_avg_out=o[1], exp_avg_sq_out=o[2], **KW)
    with pytest.raises(ValueError, match="max_exp_avg_sq_out"):
        grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm, commit=False, param_out=o[0], exp_avg_out=o[1],
                             exp_avg_sq_out=o[2], **KW)
    with pytest.raises(ValueError, match="overlap"):
        grace_adam.adam_step(p, g, m, v, commit=False, param_out=o[0], exp_avg_out=o[1], exp_avg_sq_out=m, **KW)
    with pytest.raises(ValueError, match="exp_avg_out and exp_avg_sq_out overlap"):
        grace_adam.adam_step(p, g, m, v, commit=False, param_out=o[0], exp_avg_out=o[1], exp_avg_sq_out=o[1], **KW)
