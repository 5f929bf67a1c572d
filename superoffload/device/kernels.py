"""The device-side kernels the engine needs, in two flavours chosen by where the device's memory is.

- `grad_norm(flat, out)`: the L2 norm of a flat gradient accumulated in fp64 (one reduction:
  `linalg.vector_norm` with an fp64 accumulator, the gradient cast element by element as it is read, no
  fp64 copy), written to a 0-dim fp64 device tensor. A non-finite element makes it non-finite. The step
  squares and sums the per-bucket norms once (`engine/norms.py`), so the launch issues one kernel per
  bucket whatever its size.
- `adam_steps(...)`: one Adam(W) step on lists of flat fp32 tensors sharing hyperparameters and a step
  count (the device tail buckets), in one fused call: on a GPU a call per bucket is Python and launch
  time the device waits on.

`TorchKernels` use only torch ops, so they run wherever torch does: CUDA, and the simulated device,
which runs exactly what CUDA runs (only memory, streams and events are simulated), so what a GPU would
launch is what the CPU tests count. Adam is torch's fused kernel with the step count and the gradient
scale as device tensors (no blocking host-to-device copy), or a plain multi-op Adam when
`bias_correction` is off (torch's fused kernel always corrects). `HostKernels` run GraceAdam for the
tail buckets of the CPU-only device (host memory, host work); its norm is the same torch reduction, so
every backend computes the norm with the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Annotate = Callable[..., Any]  # device.access(reads=..., writes=...): a context manager
Tensors = list[torch.Tensor]


class HostKernels:
    name = "grace"

    def __init__(self, annotate: Annotate) -> None:
        self._annotate = annotate

    @staticmethod
    def grad_norm(flat: torch.Tensor, out: torch.Tensor) -> None:
        TorchKernels.grad_norm(flat, out)

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
    def grad_norm(flat: torch.Tensor, out: torch.Tensor) -> None:
        torch.linalg.vector_norm(flat, dtype=torch.float64, out=out)

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
