"""Parity with torch.optim.Adam / AdamW (foreach=False, the single-tensor reference).

Documented bound (docs/grace_adam.md): after k steps every parameter is within ULP_PER_STEP units for k = 1
and within 8 * sqrt(k) units for k > 1, a unit being the fp32 spacing at max(|p|, lr). The differences
come from torch itself: its fp32 sqrt (MKL VML) is not correctly rounded, and its fused lerp / add-alpha
paths use FMA; ours rounds every operation (see test_exactness.py for bit-exactness).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import grace_adam
from grace_adam._hyper import f32
from grace_adam.testing import ulp_units

ULP_PER_STEP = 2.0
LR = 1e-3


def bound(steps: int) -> float:
    return ULP_PER_STEP if steps == 1 else 8.0 * math.sqrt(steps)


def torch_ops_step(p, g, m, v, vmax, *, step, lr, beta1, beta2, eps, wd, adamw, bias_correction):
    """torch's _single_tensor_adam op sequence, with optional bias correction (torch has no switch)."""
    if wd != 0:
        if adamw:
            p.mul_(1 - lr * wd)
        else:
            g = g.add(p, alpha=wd)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = 1 - beta2**step if bias_correction else 1.0
    src = v
    if vmax is not None:
        torch.maximum(vmax, v, out=vmax)
        src = vmax
    denom = (src.sqrt() / bc2**0.5).add_(eps)
    p.addcdiv_(m, denom, value=-(lr / bc1))


def run_pair(n, steps, gdt, *, adamw, wd, amsgrad, bias_correction=True, grad_scale=1.0, seed=0,
             betas=(0.9, 0.999)):
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.randn(n, generator=gen)
    pt = p0.clone().requires_grad_(bias_correction)
    if bias_correction:
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        opt = cls([pt], lr=LR, betas=betas, weight_decay=wd, amsgrad=amsgrad, foreach=False)
    else:
        mt, vt = torch.zeros(n), torch.zeros(n)
        vmt = torch.zeros(n) if amsgrad else None
    pg, mg, vg = p0.clone(), torch.zeros(n), torch.zeros(n)
    vmg = torch.zeros(n) if amsgrad else None
    worst = 0.0
    for k in range(1, steps + 1):
        g = (torch.randn(n, generator=gen) * 10).to(gdt)
        # torch sees the same fp32 gradient the kernel computes: float32(g) * float32(grad_scale)
        gt = g.float() * torch.tensor(f32(grad_scale))
        if bias_correction:
            pt.grad = gt
            opt.step()
        else:
            torch_ops_step(pt, gt, mt, vt, vmt, step=k, lr=LR, beta1=betas[0], beta2=betas[1], eps=1e-8,
                           wd=wd, adamw=adamw, bias_correction=False)
        grace_adam.adam_step(pg, g, mg, vg, step=k, lr=LR, beta1=betas[0], beta2=betas[1], eps=1e-8,
                             weight_decay=wd, adamw=adamw, bias_correction=bias_correction,
                             grad_scale=grad_scale, max_exp_avg_sq=vmg)
        worst = max(worst, ulp_units(pt.detach(), pg, LR))
    return worst


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 1000, 1003, 65537])
@pytest.mark.parametrize("adamw,wd", [(True, 0.0), (True, 0.1), (False, 0.1)])
def test_sizes_one_step(n, adamw, wd):
    assert run_pair(n, 1, torch.float32, adamw=adamw, wd=wd, amsgrad=False) <= bound(1)


GRADS = [(torch.float32, 1.0), (torch.bfloat16, 0.25), (torch.float16, 1 / 3)]
VARIANTS = list(itertools.product([True, False], [0.0, 0.1], [False, True]))


@pytest.mark.parametrize("gdt,grad_scale", GRADS)
@pytest.mark.parametrize("adamw,wd,amsgrad", VARIANTS)
def test_hyperparameters_ten_steps(gdt, grad_scale, adamw, wd, amsgrad):
    assert run_pair(1003, 10, gdt, adamw=adamw, wd=wd, amsgrad=amsgrad, grad_scale=grad_scale) <= bound(10)


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("adamw", [False, True])
def test_no_bias_correction(adamw, amsgrad):
    worst = run_pair(1003, 10, torch.float32, adamw=adamw, wd=0.1, amsgrad=amsgrad, bias_correction=False)
    assert worst <= bound(10)


def test_high_lerp_weight_branch():
    # beta1 < 0.5 makes torch's lerp weight >= 0.5, which selects its other formula
    worst = run_pair(1003, 10, torch.float32, adamw=True, wd=0.0, amsgrad=False, betas=(0.3, 0.999))
    assert worst <= bound(10)


@pytest.mark.parametrize("gdt", [torch.float32, torch.bfloat16])
def test_thousand_steps(gdt):
    assert run_pair(257, 1000, gdt, adamw=True, wd=0.1, amsgrad=False) <= bound(1000)


def test_large_tensor_one_step():
    n = (1 << 24) + 3
    assert run_pair(n, 1, torch.float32, adamw=True, wd=0.1, amsgrad=False) <= bound(1)
