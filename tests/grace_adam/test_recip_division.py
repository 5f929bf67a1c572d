"""Division by sqrt(1 - beta2^t) through its reciprocal (docs/grace_adam.md, "Exactness"): taken for Adam's
divisors, checked the way the library checks it (the inputs near a rounding midpoint), and the same bits
as the divide instruction on every SIMD path, special values included."""

from __future__ import annotations

import pytest
import torch

import grace_adam
from grace_adam import _backend
from grace_adam._hyper import adam_consts

SIMD = [name for name in grace_adam.available_isas() if name in ("avx2", "avx512", "neon", "sve")]
requires_simd = pytest.mark.skipif(not SIMD, reason="no SIMD path of the native kernel here")


def bc2s(step: int, beta2: float) -> float:
    """sqrt(1 - beta2^step) as the kernel receives it (fp32, computed as torch computes it)."""
    return adam_consts(step=step, lr=1e-3, beta1=0.9, beta2=beta2, eps=1e-8, weight_decay=0.0, adamw=True,
                       bias_correction=True, grad_scale=1.0).bias_correction2_sqrt


def f32(x: float) -> float:
    """x rounded to fp32 (the divisor and reciprocal the kernel sees)."""
    return torch.tensor(x, dtype=torch.float32).item()


def ulps_off(r: float, k: int) -> float:
    """r moved k fp32 ulps (towards 0 for k < 0)."""
    t = torch.tensor(r, dtype=torch.float32)
    target = torch.tensor(0.0 if k < 0 else float("inf"), dtype=torch.float32)
    for _ in range(abs(k)):
        t = torch.nextafter(t, target)
    return t.item()


ADAM_DIVISORS = sorted({bc2s(t, b2) for b2 in (0.999, 0.99, 0.95, 0.9999) for t in (1, 2, 3, 7, 10, 100, 1000, 10**5)})


@requires_simd
@pytest.mark.parametrize("isa_name", SIMD)
def test_reciprocal_is_taken_for_adams_divisors(isa_name, isa_restore):
    _backend._force_isa(isa_name)
    for c in ADAM_DIVISORS + [1.0, f32(0.7071068)]:
        assert _backend.divisor_recip(c) == f32(1.0 / c), c
    # outside [2^-20, 1] the kernels divide (the proof's range)
    assert _backend.divisor_recip(2.0) == 0.0
    assert _backend.divisor_recip(2.0**-21) == 0.0


def test_scalar_path_always_divides(isa_restore):
    if not grace_adam.native_available():
        pytest.skip("native kernel unavailable")
    _backend._force_isa("scalar")
    assert _backend.divisor_recip(0.0447) == 0.0
    with pytest.raises(ValueError, match="GA_EUNSUPPORTED"):
        _backend.divisor_check(0.0447, 1 / 0.0447, isa_name="scalar")


@requires_simd
@pytest.mark.parametrize("isa_name", SIMD)
def test_exhaustive_check_agrees_for_the_true_reciprocal(isa_name):
    for c in (bc2s(1, 0.999), bc2s(2, 0.999), bc2s(3, 0.99), f32(0.7071068), f32(0.999999)):
        r = f32(1.0 / c)
        assert _backend.divisor_check(c, r, exhaustive=True, isa_name=isa_name, threads=2) == 0, c
        assert _backend.divisor_check(c, r, isa_name=isa_name) == 0, c


def _near_equals_exhaustive(isa_name: str, divisors: list[float], offsets: tuple[int, ...]) -> int:
    """For reciprocals a few ulps off (wrong for some inputs, but within the proof's reach), the
    near-midpoint check must count exactly the inputs the exhaustive check finds wrong."""
    failures = 0
    for c in divisors:
        for k in offsets:
            r = ulps_off(f32(1.0 / c), k)
            every = _backend.divisor_check(c, r, exhaustive=True, isa_name=isa_name, threads=2)
            near = _backend.divisor_check(c, r, isa_name=isa_name)
            assert near == every, (c, k, near, every)
            failures += every
    return failures


@requires_simd
@pytest.mark.parametrize("isa_name", SIMD)
def test_near_midpoint_check_finds_every_failure_of_a_wrong_reciprocal(isa_name):
    divisors = [bc2s(t, 0.999) for t in (1, 3, 10)] + [f32(0.7071068)]
    assert _near_equals_exhaustive(isa_name, divisors, (-4, -1, 2, 8)) > 0  # the check can fail


@pytest.mark.slow
@requires_simd
@pytest.mark.parametrize("isa_name", SIMD)
def test_near_midpoint_check_wide_sweep(isa_name):
    gen = torch.Generator().manual_seed(7)
    mants = (1 + torch.rand(150, generator=gen, dtype=torch.float64)).tolist()
    exps = torch.randint(-20, 0, (150,), generator=gen).tolist()
    randoms = [f32(m * 2.0**e) for m, e in zip(mants, exps, strict=True)]  # in [2^-20, 1)
    divisors = [bc2s(t, b2) for b2 in (0.999, 0.95) for t in range(1, 60)] + randoms
    assert _near_equals_exhaustive(isa_name, divisors, (-8, -3, -1, 1, 2, 5, 8)) > 0
    for c in divisors:
        assert _backend.divisor_check(c, f32(1.0 / c), exhaustive=True, isa_name=isa_name, threads=2) == 0


def _special_state(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Adam state whose sqrt(v) covers +-0, subnormal-born, huge, +inf and NaN."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen)
    m = torch.randn(n, generator=gen) * 0.1
    v = torch.rand(n, generator=gen) * 0.01
    specials = torch.tensor([0.0, float("inf"), 1e-45, 1e-40, 3.4e38, float("nan"), 1e-30])
    v[: 7 * (n // 14)] = specials.repeat(n // 14)
    m[::5] = 0.0
    g[::4] = 0.0
    vm = torch.where(torch.arange(n) % 3 == 0, torch.tensor(-0.0), v)
    return p, g, m, v, vm


@requires_simd
@pytest.mark.parametrize("isa_name", SIMD)
@pytest.mark.parametrize("eps", [1e-8, -0.0])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_same_bits_as_dividing(isa_name, eps, amsgrad, isa_restore):
    """Reciprocal vs divide instruction vs the scalar reference, over several steps (a new divisor each),
    bf16 upload copy included; bits compared as integers (NaN positions and payloads too)."""
    n = 1_003
    results = {}
    for mode in ("reciprocal", "divide", "scalar"):
        _backend._force_isa("scalar" if mode == "scalar" else isa_name)
        _backend._set_div_by_recip(mode == "reciprocal")
        try:
            p, g, m, v, vm = _special_state(n, seed=3)
            low = torch.empty(n, dtype=torch.bfloat16)
            for step in range(1, 6):
                grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm if amsgrad else None, step=step, lr=1e-3,
                                     beta1=0.9, beta2=0.999 if step % 2 else 0.0, eps=eps, lowp_out=low)
        finally:
            _backend._set_div_by_recip(True)
        results[mode] = [t.view(torch.int32) for t in (p, m, v, vm)] + [low.view(torch.int16)]
    for a, b, c in zip(results["reciprocal"], results["divide"], results["scalar"], strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


FORK_SCRIPT = """
import os, torch, grace_adam
from grace_adam import _backend

def step():
    gen = torch.Generator().manual_seed(0)
    p, g, m, v = (torch.rand(1 << 16, generator=gen) for _ in range(4))
    grace_adam.adam_step(p, g, m, v, step=3, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, threads=2)
    return p

ref, mode = step(), _backend.division_mode()   # the parent's verdict cache and pool exist now
pid = os.fork()
if pid == 0:
    os._exit(0 if torch.equal(step(), ref) and _backend.division_mode() == mode else 1)
_, status = os.waitpid(pid, 0)
print(mode, "ok" if os.waitstatus_to_exitcode(status) == 0 else "the child differs")
"""


@requires_simd
def test_a_forked_child_divides_as_its_parent():
    """After fork() the child starts its divisor verdicts afresh (the lock and a half-written entry of a
    thread that does not exist there) and steps to the parent's bits."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["reciprocal", "ok"]
