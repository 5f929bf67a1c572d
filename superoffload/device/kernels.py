"""The two device-side kernels the engine needs, in two flavours chosen by capability.

- `grad_norm_sq(flat, out)`: Σ x² of a flat gradient, accumulated in fp64, written to the 1-element
  fp64 device tensor `out`. A non-finite element makes the result non-finite (squares of finite
  fp32/bf16/fp16 values cannot overflow fp64), so the same reduction is the finite flag.
- `adam_step(...)`: one Adam(W) step on flat fp32 tensors in place (the device tail buckets).
- `adam_steps(...)`: the same step on lists of tensors sharing hyperparameters and a step count: every
  tail bucket's slices in one call, because on a GPU a call per bucket is Python and launch time the
  device waits on (H200, gpt-1b, 715 tail buckets: 115 ms per step, more than torch's whole step).

`HostKernels` run GraceAdam, which needs host-addressable memory: the CPU-only device and the simulated
device, where it keeps training bit-identical to a synchronous host loop whatever the split between
device and host buckets. `TorchKernels` use only torch ops, so they run wherever torch does (CUDA, and
the CPU in tests): a chunked fp64 reduction (no fp64 copy of the whole bucket: the transient is one
chunk) and torch's fused Adam with the step count and the gradient scale as device tensors (no blocking
host-to-device copy), or a plain multi-op Adam when `bias_correction` is off (torch's fused kernel
always corrects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NORM_CHUNK = 1 << 20  # elements per fp64 chunk in TorchKernels.grad_norm_sq (an 8 MiB transient)

Annotate = Callable[..., Any]  # device.access(reads=..., writes=...): a context manager
Tensors = list[torch.Tensor]


class HostKernels:
    name = "grace"

    def __init__(self, annotate: Annotate) -> None:
        self._annotate = annotate

    def grad_norm_sq(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        import grace_adam

        with self._annotate(reads=[flat], writes=[out]):
            norm_sq, finite = grace_adam.grad_stats(flat)
            out.fill_(norm_sq if finite else float("inf"))

    def adam_step(self, param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  *, step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                  adamw: bool, bias_correction: bool, grad_scale: float,
                  max_exp_avg_sq: torch.Tensor | None = None) -> None:
        import grace_adam

        state = [t for t in (param, exp_avg, exp_avg_sq, max_exp_avg_sq) if t is not None]
        with self._annotate(reads=[grad, *state], writes=state):
            grace_adam.adam_step(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1, beta2=beta2,
                                 eps=eps, weight_decay=weight_decay, adamw=adamw, bias_correction=bias_correction,
                                 grad_scale=grad_scale, max_exp_avg_sq=max_exp_avg_sq)

    def adam_steps(self, params: Tensors, grads: Tensors, exp_avgs: Tensors, exp_avg_sqs: Tensors,
                   max_exp_avg_sqs: Tensors | None = None, **hp: Any) -> None:
        """`adam_step` on each slice in turn (GraceAdam's pass is per tensor and already one call)."""
        for i, p in enumerate(params):
            self.adam_step(p, grads[i], exp_avgs[i], exp_avg_sqs[i],
                           max_exp_avg_sq=max_exp_avg_sqs[i] if max_exp_avg_sqs is not None else None, **hp)


class TorchKernels:
    name = "torch"

    def __init__(self, annotate: Annotate | None = None) -> None:
        del annotate  # torch ops are seen by the simulator's dispatch mode directly

    @staticmethod
    def grad_norm_sq(flat: torch.Tensor, out: torch.Tensor) -> None:
        out.zero_()
        for chunk in flat.split(NORM_CHUNK):
            c = chunk.to(torch.float64)
            out.add_(torch.dot(c, c))
            del c  # one chunk alive at a time

    @staticmethod
    def adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                  max_exp_avg_sq: torch.Tensor | None = None, **hp: Any) -> None:
        TorchKernels.adam_steps([param], [grad], [exp_avg], [exp_avg_sq],
                                [max_exp_avg_sq] if max_exp_avg_sq is not None else None, **hp)

    @staticmethod
    def adam_steps(params: Tensors, grads: Tensors, exp_avgs: Tensors, exp_avg_sqs: Tensors,
                   max_exp_avg_sqs: Tensors | None = None, *, step: int, lr: float, beta1: float, beta2: float,
                   eps: float, weight_decay: float, adamw: bool, bias_correction: bool, grad_scale: float) -> None:
        if not params:
            return
        if not bias_correction:
            for i, param in enumerate(params):
                g = grads[i] * grad_scale if grad_scale != 1.0 else grads[i]
                if adamw:
                    param.mul_(1.0 - lr * weight_decay)
                elif weight_decay:
                    g = g + weight_decay * param
                exp_avgs[i].lerp_(g, 1.0 - beta1)
                exp_avg_sqs[i].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                v = exp_avg_sqs[i]
                if max_exp_avg_sqs is not None:
                    torch.maximum(max_exp_avg_sqs[i], v, out=max_exp_avg_sqs[i])
                    v = max_exp_avg_sqs[i]
                param.addcdiv_(exp_avgs[i], v.sqrt().add_(eps), value=-lr)
            return
        dev = params[0].device
        fused = torch._fused_adamw_ if adamw else torch._fused_adam_
        # device scalars made by a fill kernel: no blocking host-to-device copy on the hot path; the kernel
        # only reads the step count, so every slice shares one
        step_t = torch.full((), float(step), dtype=torch.float32, device=dev)
        scale_t = None if grad_scale == 1.0 else torch.full((), 1.0 / grad_scale, dtype=torch.float32, device=dev)
        # elementwise per tensor: one call over many slices gives each the bits of a call of its own
        fused(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or [], [step_t] * len(params), lr=lr,
              beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=max_exp_avg_sqs is not None,
              maximize=False, grad_scale=scale_t)
