"""`superoffload.AdamW`'s arguments, accepted and refused as `torch.optim.AdamW` accepts and refuses them.

The checks and messages are torch's (torch/optim/adam.py, `Adam.__init__`, which `AdamW` calls), so code
that catches torch's errors catches these. Beyond torch's, what the engine cannot honour is refused
here, before any work, with the reason:
- `capturable=True`: CUDA-graph capture of the step; the step runs on the host, outside any graph;
- `differentiable=True`: a step autograd can differentiate through; the host step is outside autograd;
- `amsgrad` turned on in a group after construction when no group had it then: the engine lays out its
  host state at construction, with `max_exp_avg_sq` buffers for every parameter when any group has
  amsgrad (a group without it leaves them untouched and its state has no `max_exp_avg_sq`, as in torch)
  and for none otherwise;
- a parameter listed twice in a group: torch warns and then steps it twice per `step()` (its shared
  state counts two steps); here it is an error (docs/integrations.md says why).
`foreach` and `fused` are accepted with any value and kept in the groups: in torch they choose among
kernels that compute the same update; the engine's host step is always its own fused kernel.
"""

from __future__ import annotations

from typing import Any

import torch

# group options the engine cannot honour when true, and why (checked at construction and at every step,
# so a group edited or loaded later is refused too)
REFUSED_WHEN_TRUE = {
    "capturable": "CUDA graph capture of the step is not supported: the step runs on the host",
    "differentiable": "the step runs on the host, outside autograd, so it cannot be differentiated through",
}

# torch.optim.AdamW's group keys and their defaults for a group (or a loaded state dict) without them
# (torch's Adam.__setstate__); AdamW's weight decay is always decoupled
GROUP_DEFAULTS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                  "differentiable": False, "fused": None}


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def check_hyperparameters(lr: Any, betas: Any, eps: Any, weight_decay: Any, *, foreach: Any,
                          capturable: bool) -> tuple[Any, ...]:
    """torch's checks of AdamW's constructor arguments, in torch's order and words; returns the betas as
    torch keeps them (a 1-element tensor beta becomes a 0-d one)."""
    if _is_tensor(lr):
        if foreach and not capturable:
            raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not eps >= 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for i in (0, 1):
        if not 0.0 <= betas[i] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")
    if not weight_decay >= 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    both_float = isinstance(betas[0], float) and isinstance(betas[1], float)
    if not (both_float or (_is_tensor(betas[0]) and _is_tensor(betas[1]))):
        raise ValueError("betas must be either both floats or both Tensors")
    for i in (0, 1):
        if _is_tensor(betas[i]):
            if not capturable and foreach:
                raise ValueError(f"betas[{i}] as a Tensor is not supported for capturable=False and foreach=True")
            if betas[i].numel() != 1:
                raise ValueError(f"Tensor betas[{i}] must be 1-element")
    return tuple(_scalar(b) for b in betas)


def _scalar(x: Any) -> Any:
    return x.reshape(()) if _is_tensor(x) and x.dim() else x


def check_flags(fused: Any, foreach: Any, differentiable: Any) -> None:
    """torch's errors for the implementation flags (raised by AdamW after its groups are built)."""
    if fused:
        if differentiable:
            raise RuntimeError("`fused` does not support `differentiable`")
        if foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def check_groups(groups: list[dict[str, Any]], engine_amsgrad: bool | None = None) -> bool:
    """The groups' options the engine cannot honour, refused; returns whether any group has amsgrad (the
    engine then holds max_exp_avg_sq buffers). `engine_amsgrad`: whether the built engine holds them (a
    group changed or loaded later cannot need them when it does not)."""
    for gi, g in enumerate(groups):
        for key, why in REFUSED_WHEN_TRUE.items():
            if g.get(key):
                raise ValueError(f"superoffload.AdamW: {key}=True (param group {gi}) is not supported: {why}")
    wanted = [gi for gi, g in enumerate(groups) if g.get("amsgrad", False)]
    if engine_amsgrad is False and wanted:
        raise ValueError(f"superoffload.AdamW: param group {wanted[0]} now says amsgrad=True, but no group had it "
                         f"when the optimizer was built, so the engine holds no max_exp_avg_sq (its host state is "
                         f"laid out at construction): build the optimizer with amsgrad=True in that group")
    return bool(wanted)


def check_no_duplicates(groups: list[dict[str, Any]]) -> None:
    """A parameter twice in one group (torch warns; across groups torch itself raises)."""
    for gi, g in enumerate(groups):
        seen: set[int] = set()
        for i, p in enumerate(g["params"]):
            if id(p) in seen:
                raise ValueError(f"superoffload.AdamW: param group {gi} holds the same parameter twice (position {i}); "
                                 f"torch.optim.AdamW warns and then steps it twice per step(), which the engine does "
                                 f"not do: list each parameter once")
            seen.add(id(p))


def check_trainable(params: list[torch.Tensor]) -> None:
    """Parameters the engine cannot train, refused before any work: complex, float64 or integer ones, and
    sparse ones (the engine keeps fp32 masters and moments on the host, and flat buffers)."""
    for p in params:
        if p.is_complex() or p.dtype == torch.float64:
            raise ValueError(f"superoffload.AdamW trains fp32 or bf16 parameters (its masters and moments are fp32 on "
                             f"the host); a {p.dtype} parameter of shape {tuple(p.shape)} was given: use "
                             f"torch.optim.AdamW for it")
        if p.layout != torch.strided:
            raise ValueError(f"superoffload.AdamW: a {p.layout} parameter cannot be laid out in the engine's flat "
                             f"buffers; use dense parameters")
