"""Per-call Adam constants, computed once on the host in double exactly as torch.optim.Adam does and then
rounded to fp32, so every thread, ISA and the torch fallback use identical values."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass


def f32(x: float) -> float:
    """Round a Python float (double) to the nearest fp32 value (ties to even), as a C cast does."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class AdamConsts:
    grad_scale: float
    weight_decay: float
    decay: float
    lerp_hi: bool
    lerp_c: float
    beta2: float
    one_minus_beta2: float
    step_size: float
    bias_correction2_sqrt: float
    eps: float
    decoupled: bool
    l2: bool


def adam_consts(*, step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                adamw: bool, bias_correction: bool, grad_scale: float) -> AdamConsts:
    """Validate the hyper-parameters and derive the kernel's fp32 constants.

    Mirrors torch's single-tensor Adam: ``step_size = lr / (1 - beta1**step)``,
    ``bias_correction2_sqrt = (1 - beta2**step) ** 0.5``, ``exp_avg.lerp_(grad, 1 - beta1)`` (whose float
    weight selects one of two lerp formulas), ``param.mul_(1 - lr * weight_decay)`` for AdamW.
    """
    if isinstance(step, bool) or not float(step).is_integer() or step < 1:
        raise ValueError(f"step must be the 1-based step count after increment (int >= 1), got {step!r}")
    for name, val in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay), ("grad_scale", grad_scale)):
        if not math.isfinite(val):
            raise ValueError(f"{name} must be finite, got {val!r}")
    if lr < 0.0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    if eps < 0.0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if not 0.0 <= beta1 < 1.0 or not 0.0 <= beta2 < 1.0:
        raise ValueError(f"betas must be in [0, 1), got ({beta1!r}, {beta2!r})")
    t = float(step)  # torch reads the step from a float tensor
    if bias_correction:
        bc1 = 1 - beta1**t
        bc2 = 1 - beta2**t
    else:
        bc1 = bc2 = 1.0
    w = f32(1 - beta1)
    lerp_hi = not abs(w) < 0.5
    # torch's lerp: start + w * (end - start) if |w| < 0.5 else end - (end - start) * (1 - w);
    # 1 - w is exact in fp32 here (Sterbenz), and end - x*(1-w) == end + x*(-(1-w)) exactly.
    lerp_c = -(1.0 - w) if lerp_hi else w
    return AdamConsts(
        grad_scale=f32(grad_scale),
        weight_decay=f32(weight_decay),
        decay=f32(1 - lr * weight_decay),
        lerp_hi=lerp_hi,
        lerp_c=f32(lerp_c),
        beta2=f32(beta2),
        one_minus_beta2=f32(1 - beta2),
        step_size=f32(lr / bc1),
        bias_correction2_sqrt=f32(bc2**0.5),
        eps=f32(eps),
        decoupled=bool(adamw) and weight_decay != 0,
        l2=(not adamw) and weight_decay != 0,
    )
