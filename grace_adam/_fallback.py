"""Pure-torch implementation of the kernel, used when the native library is unavailable.

It performs the same fp32 operations in the same order as csrc/ga_scalar.c (each torch op rounds once;
none of the ops used here fuses a multiply-add), so it returns the same bits for finite inputs. It is
several passes over memory instead of one, so it is slower.
"""

from __future__ import annotations

import torch

from grace_adam._hyper import AdamConsts


def _s(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


@torch.no_grad()
def adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
              max_exp_avg_sq: torch.Tensor | None, c: AdamConsts, commit: bool,
              param_out: torch.Tensor | None, lowp_out: torch.Tensor | None,
              state_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None) -> None:
    """`state_out` = (exp_avg_out, exp_avg_sq_out, max_exp_avg_sq_out): the out-of-place step's new state."""
    p0, m0, v0 = param.reshape(-1), exp_avg.reshape(-1), exp_avg_sq.reshape(-1)
    g = grad.reshape(-1).to(torch.float32) * _s(c.grad_scale)
    if c.l2:
        g = g + p0 * _s(c.weight_decay)
    p = p0 * _s(c.decay) if c.decoupled else p0.clone()
    d = g - m0
    m = (g if c.lerp_hi else m0) + d * _s(c.lerp_c)
    v = v0 * _s(c.beta2) + (_s(c.one_minus_beta2) * g) * g
    vu = v
    vm = None
    if max_exp_avg_sq is not None:
        vm0 = max_exp_avg_sq.reshape(-1)
        vm = torch.where((v > vm0) | torch.isnan(v), v, vm0)
        vu = vm
    # torch.sqrt on fp32 is not correctly rounded (MKL VML); an fp64 sqrt rounded to fp32 is (53 >= 2*24+2).
    den = torch.sqrt(vu.to(torch.float64)).to(torch.float32) / _s(c.bias_correction2_sqrt) + _s(c.eps)
    p = p - (_s(c.step_size) * m) / den
    if commit:
        p0.copy_(p)
        m0.copy_(m)
        v0.copy_(v)
        if vm is not None and max_exp_avg_sq is not None:
            max_exp_avg_sq.reshape(-1).copy_(vm)
    if state_out is not None:
        state_out[0].reshape(-1).copy_(m)
        state_out[1].reshape(-1).copy_(v)
        if vm is not None and state_out[2] is not None:
            state_out[2].reshape(-1).copy_(vm)
    if param_out is not None:
        param_out.reshape(-1).copy_(p)
    if lowp_out is not None:
        lowp_out.reshape(-1).copy_(p)  # copy_ casts with round-to-nearest-even


@torch.no_grad()
def grad_stats(grad: torch.Tensor, grad_scale: float, block: int) -> tuple[float, bool]:
    """Same blocked, 16-lane fp64 summation as the native kernel, hence the same bits."""
    g = grad.reshape(-1).to(torch.float32) * _s(grad_scale)
    x = g.to(torch.float64)
    sq = x * x
    n = sq.numel()
    if n == 0:
        return 0.0, True
    nblocks = (n + block - 1) // block
    padded = torch.zeros(nblocks * block, dtype=torch.float64)
    padded[:n] = sq
    lanes = padded.view(nblocks, block // 16, 16)
    acc = torch.zeros(nblocks, 16, dtype=torch.float64)
    for j in range(block // 16):  # sequential per lane, as the kernel accumulates
        acc += lanes[:, j, :]
    r8 = acc[:, :8] + acc[:, 8:]
    r4 = r8[:, :4] + r8[:, 4:]
    r2 = r4[:, :2] + r4[:, 2:]
    sums = (r2[:, 0] + r2[:, 1]).tolist()
    total = 0.0
    for s in sums:
        total += s
    return total, total - total == 0.0
