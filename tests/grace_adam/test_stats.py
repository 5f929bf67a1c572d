"""grad_stats: fp64 norm² of grad * grad_scale and the all-finite flag, deterministic for any threads/ISA."""

from __future__ import annotations

import math

import pytest
import torch

import grace_adam
from grace_adam import _backend, _fallback
from grace_adam._hyper import f32
from grace_adam.functional import STATS_BLOCK

requires_native = pytest.mark.skipif(not grace_adam.native_available(),
                                     reason=f"native kernel unavailable: {_backend.UNAVAILABLE_REASON}")


@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [0, 1, 17, 16384, 16385, 100_003])
def test_matches_torch_fp64(gdt, n):
    g = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 5).to(gdt)
    norm2, finite = grace_adam.grad_stats(g, grad_scale=0.3)
    ref = float(((g.float() * torch.tensor(f32(0.3))).double() ** 2).sum())
    assert finite
    assert math.isclose(norm2, ref, rel_tol=1e-12, abs_tol=0.0)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_flag(bad):
    g = torch.randn(50_000)
    g[31_337] = bad
    norm2, finite = grace_adam.grad_stats(g)
    assert not finite and not math.isfinite(norm2)


def test_overflow_after_scaling_is_not_finite():
    g = torch.full((100,), 3e38)
    assert grace_adam.grad_stats(g)[1]
    assert not grace_adam.grad_stats(g, grad_scale=10.0)[1]


@requires_native
@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16])
def test_identical_for_any_threads_and_isa(gdt, isa_restore):
    g = torch.randn(5 * STATS_BLOCK + 123).to(gdt)
    _backend._set_min_chunk(16)
    results = set()
    for isa in grace_adam.available_isas():
        _backend._force_isa(isa)
        for threads in (1, 2, 3, 4, 7):
            results.add(grace_adam.grad_stats(g, grad_scale=1.7, threads=threads))
    results.add(_fallback.grad_stats(g, f32(1.7), STATS_BLOCK))
    assert len(results) == 1
