"""Bit-exactness: speculative vs commit, casts, ISA / thread / split invariance, native vs fallback."""

from __future__ import annotations

import itertools

import pytest
import torch

import grace_adam
from grace_adam import _backend, _fallback
from grace_adam._hyper import adam_consts

requires_native = pytest.mark.skipif(not grace_adam.native_available(),
                                     reason=f"native kernel unavailable: {_backend.UNAVAILABLE_REASON}")
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)


def make_state(n: int, seed: int = 0, gdt: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen)
    g = (torch.randn(n, generator=gen) * 3).to(gdt)
    m = torch.randn(n, generator=gen) * 0.1
    v = torch.rand(n, generator=gen) * 0.01
    vm = v * torch.rand(n, generator=gen) * 2
    return p, g, m, v, vm


def clone_all(ts):
    return [t.clone() for t in ts]


@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lowp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_speculative_then_commit_equals_direct_commit(gdt, lowp, amsgrad):
    n = 10_007
    p, g, m, v, vm = make_state(n, gdt=gdt)
    kw = dict(step=7, weight_decay=0.1, grad_scale=0.5, **HYPER)
    sp, sm, sv, svm = clone_all([p, m, v, vm])
    spec_p, spec_l = torch.empty(n), torch.empty(n, dtype=lowp)
    grace_adam.adam_step(sp, g, sm, sv, max_exp_avg_sq=svm if amsgrad else None, commit=False,
                         param_out=spec_p, lowp_out=spec_l, **kw)
    # the speculative pass must not touch the state
    for before, after in ((p, sp), (m, sm), (v, sv), (vm, svm)):
        assert torch.equal(before, after)
    out_l = torch.empty(n, dtype=lowp)
    grace_adam.adam_step(sp, g, sm, sv, max_exp_avg_sq=svm if amsgrad else None, commit=True, lowp_out=out_l,
                         **kw)
    dp, dm, dv, dvm = clone_all([p, m, v, vm])
    grace_adam.adam_step(dp, g, dm, dv, max_exp_avg_sq=dvm if amsgrad else None, **kw)
    assert torch.equal(spec_p, dp) and torch.equal(sp, dp)
    assert torch.equal(sm, dm) and torch.equal(sv, dv) and torch.equal(svm, dvm)
    assert torch.equal(spec_l, out_l) and torch.equal(spec_l, dp.to(lowp))


def random_finite_floats(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    x = x[torch.isfinite(x)]
    special = torch.tensor([0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, -65520.0, 6.0e-8, 2.0**-25, 2.0**-24,
                            3 * 2.0**-26, 2.0**-14, 1e-40, -1e-45, 3.3895314e38, 1.0 + 2**-8,
                            1.0 + 3 * 2**-9])
    # values exactly halfway between two bf16 numbers, odd and even below
    ties = (torch.arange(-500, 500, dtype=torch.int32) * 65536 + 0x3F800000 + 32768).view(torch.float32)
    return torch.cat([x, special, ties])


@pytest.mark.parametrize("lowp", [torch.bfloat16, torch.float16])
def test_lowp_out_is_torch_rne_cast(lowp, isa_restore):
    # lr = 0 leaves p unchanged (p - 0 * m / den == p), so lowp_out is exactly the cast of p
    p = random_finite_floats(200_003, seed=1)
    n = p.numel()
    g, m, v = torch.randn(n), torch.zeros(n), torch.ones(n)
    for isa in grace_adam.available_isas() or ["torch"]:
        if isa != "torch":
            _backend._force_isa(isa)
        out = torch.empty(n, dtype=lowp)
        pp = p.clone()
        grace_adam.adam_step(pp, g, m.clone(), v.clone(), step=1, lr=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
                             commit=False, lowp_out=out)
        assert torch.equal(out, p.to(lowp)), isa


CONFIGS = list(itertools.product(
    [torch.float32, torch.bfloat16, torch.float16],   # grad dtype
    [None, torch.bfloat16, torch.float16],             # lowp_out
    [(True, 0.1), (False, 0.1), (True, 0.0)],          # adamw, weight decay
    [False, True],                                     # amsgrad
))


def run_bucket(state, g, *, gdt_lowp, adamw, wd, amsgrad, threads, splits, step=3, grad_scale=0.75):
    p, m, v, vm = clone_all(state)
    n = p.numel()
    lowp = torch.zeros(n, dtype=gdt_lowp) if gdt_lowp is not None else None
    pout = torch.zeros(n)
    bounds = [0, *splits, n]
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):
        grace_adam.adam_step(p[a:b], g[a:b], m[a:b], v[a:b], step=step, weight_decay=wd, adamw=adamw,
                             grad_scale=grad_scale, max_exp_avg_sq=vm[a:b] if amsgrad else None,
                             param_out=pout[a:b], lowp_out=lowp[a:b] if lowp is not None else None,
                             threads=threads, **HYPER)
    return [p, m, v, vm, pout] + ([lowp] if lowp is not None else [])


@requires_native
@pytest.mark.parametrize("gdt,lowp,hyper,amsgrad", CONFIGS)
def test_isa_thread_split_invariance(gdt, lowp, hyper, amsgrad, isa_restore):
    n = 4099
    p, g, m, v, vm = make_state(n, seed=2, gdt=gdt)
    adamw, wd = hyper
    _backend._set_min_chunk(16)  # split even small buckets across threads
    _backend._force_isa("scalar")
    ref = run_bucket([p, m, v, vm], g, gdt_lowp=lowp, adamw=adamw, wd=wd, amsgrad=amsgrad, threads=1,
                     splits=[])
    for isa in grace_adam.available_isas():
        _backend._force_isa(isa)
        for threads, splits in [(1, []), (2, [1]), (3, [17, 2048]), (4, [n - 5]), (4, [])]:
            got = run_bucket([p, m, v, vm], g, gdt_lowp=lowp, adamw=adamw, wd=wd, amsgrad=amsgrad,
                             threads=threads, splits=splits)
            for r, o in zip(ref, got, strict=False):
                assert torch.equal(r, o), (isa, threads, splits)


@requires_native
@pytest.mark.parametrize("gdt,lowp,hyper,amsgrad", CONFIGS[::5])
def test_fallback_is_bit_identical_to_native(gdt, lowp, hyper, amsgrad):
    n = 3001
    p, g, m, v, vm = make_state(n, seed=3, gdt=gdt)
    adamw, wd = hyper
    c = adam_consts(step=5, weight_decay=wd, adamw=adamw, bias_correction=True, grad_scale=0.3, **HYPER)
    outs = []
    for native in (True, False):
        pp, mm, vv, vvm = clone_all([p, m, v, vm])
        lo = torch.zeros(n, dtype=lowp) if lowp is not None else None
        if native:
            grace_adam.adam_step(pp, g, mm, vv, step=5, weight_decay=wd, adamw=adamw, grad_scale=0.3,
                                 max_exp_avg_sq=vvm if amsgrad else None, lowp_out=lo, **HYPER)
        else:
            _fallback.adam_step(pp, g, mm, vv, vvm if amsgrad else None, c, True, None, lo)
        outs.append([pp, mm, vv, vvm] + ([lo] if lo is not None else []))
    for a, b in zip(*outs, strict=False):
        assert torch.equal(a, b)


@requires_native
def test_caller_flush_denormal_mode_does_not_matter():
    # the kernel runs in the default IEEE environment whatever the caller's FTZ/DAZ setting
    n = 4096
    p, g, m, v, _ = make_state(n, seed=4)
    p[::3] = 1e-39
    g[::5] = 1e-40
    outs = []
    for flush in (False, True):
        if not torch.set_flush_denormal(flush) and flush:
            pytest.skip("this CPU cannot flush denormals")
        try:
            pp, mm, vv = clone_all([p, m, v])
            grace_adam.adam_step(pp, g, mm, vv, step=2, weight_decay=0.1, **HYPER)
            outs.append((pp, mm, vv))
        finally:
            torch.set_flush_denormal(False)
    for a, b in zip(*outs, strict=False):
        assert torch.equal(a, b)
