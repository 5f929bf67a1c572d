"""``GraceAdam``: a torch.optim.Optimizer for CPU fp32 parameters backed by the fused kernel.

Its state dict uses torch.optim.Adam/AdamW's keys (``step`` as a float tensor, ``exp_avg``,
``exp_avg_sq``, ``max_exp_avg_sq``; param-group key ``decoupled_weight_decay``), so a state dict saved by
one loads into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from grace_adam.functional import adam_step


def _scalar_dtype() -> torch.dtype:
    # torch.optim keeps `step` in float64 only when that is the default dtype.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class GraceAdam(torch.optim.Optimizer):
    """Adam (``adamw=False``, L2 weight decay) or AdamW (``adamw=True``, decoupled) on CPU fp32 params.

    Params whose ``grad`` is None are skipped. Params must be contiguous CPU fp32 tensors (non-contiguous
    ones are rejected with a clear error, since the kernel works on flat memory); gradients may be
    fp32, bf16 or fp16 (non-contiguous gradients are copied to contiguous memory first).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, adamw: bool = True, amsgrad: bool = False,
                 bias_correction: bool = True, threads: int | None = None) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid betas: {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        decoupled_weight_decay=adamw, bias_correction=bias_correction, threads=threads,
                        # torch.optim.Adam's group keys, so our state dicts load there unchanged
                        maximize=False, foreach=None, capturable=False, differentiable=False, fused=None)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            # Groups loaded from torch.optim.Adam/AdamW state dicts lack our own keys.
            group.setdefault("amsgrad", False)
            group.setdefault("decoupled_weight_decay", False)  # what torch.optim.Adam assumes
            group.setdefault("bias_correction", True)
            group.setdefault("threads", None)
            group.setdefault("maximize", False)

    def _state_for(self, p: torch.Tensor, amsgrad: bool) -> dict[str, Any]:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            t = state.get(key)
            if t is not None and (not t.is_contiguous() or t.dtype != torch.float32 or t.device != p.device):
                state[key] = t.to(device=p.device, dtype=torch.float32).contiguous()
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["maximize"]:
                raise NotImplementedError("GraceAdam does not implement maximize=True")
            beta1, beta2 = group["betas"]
            amsgrad = bool(group["amsgrad"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("GraceAdam does not support sparse gradients")
                if p.device.type != "cpu" or p.dtype != torch.float32:
                    raise ValueError(f"GraceAdam needs CPU fp32 params, got {p.dtype} on {p.device}")
                if not p.is_contiguous():
                    raise ValueError("GraceAdam needs contiguous params (the kernel works on flat memory); "
                                     "got a non-contiguous one")
                if not grad.is_contiguous():
                    grad = grad.contiguous()
                state = self._state_for(p, amsgrad)
                state["step"] += 1
                adam_step(p, grad, state["exp_avg"], state["exp_avg_sq"], step=int(state["step"].item()),
                          lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                          eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                          adamw=bool(group["decoupled_weight_decay"]),
                          bias_correction=bool(group["bias_correction"]),
                          max_exp_avg_sq=state["max_exp_avg_sq"] if amsgrad else None,
                          threads=group["threads"])
        return loss
