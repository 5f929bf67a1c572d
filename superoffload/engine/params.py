"""Parameter groups, accepted as torch.optim accepts them.

`param_groups` may be None (the default groups: with `weight_decay_split`, matrices decay and 1-D
parameters do not), an iterable of parameters (one group), or an iterable of dicts with a `params`
entry and per-group `lr`, `betas`, `eps`, `weight_decay`. As in torch: a parameter may appear in one
group only; frozen parameters (`requires_grad=False`) in a group are never stepped, so they are left out.
Unlike torch, a trainable parameter of the model that is in no group is an error: torch would silently
leave it untrained while its `.grad` keeps accumulating.

`as_torch=True` takes the groups of a torch Optimizer (superoffload.AdamW's) as torch.optim does: any
extra keys, parameters of the model left out of every group (not trained, as in torch), and every group
kept, even one left with no trainable parameter, so group indices stay the optimizer's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from superoffload.engine.config import ConfigError, SuperOffloadConfig

GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")


def decay_split(params: Iterable[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(decay, no_decay): the Hugging Face / nanoGPT weight-decay split of the trainable parameters. Matrices
    (2-D and up) decay; biases, norms and other 1-D parameters do not. A parameter listed twice (tied weights)
    counts once; frozen ones are left out. The engine's default groups, the torch baseline's (and through it
    the DeepSpeed and FSDP baselines') and finetune's convergence reference all split by this, so a
    comparison between them is fair."""
    trainable = [p for p in dict.fromkeys(params) if p.requires_grad]
    return [p for p in trainable if p.dim() >= 2], [p for p in trainable if p.dim() < 2]


def decay_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list[dict[str, Any]]:
    """``decay_split`` as torch.optim parameter groups: the decaying ones at ``weight_decay``, the others (when
    there are any) at 0."""
    decay, no_decay = decay_split(params)
    return [{"params": decay, "weight_decay": weight_decay}] + (
        [{"params": no_decay, "weight_decay": 0.0}] if no_decay else [])


def build_param_groups(model: nn.Module, cfg: SuperOffloadConfig, groups: Iterable[Any] | None,
                       as_torch: bool = False) -> list[dict[str, Any]]:
    o = cfg.optimizer
    defaults = {"lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay}
    names = {id(p): n for n, p in model.named_parameters()}
    trainable = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]
    if groups is None:
        if cfg.weight_decay_split:
            decay, no_decay = decay_split(trainable)
            raw: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        else:
            raw = [{"params": trainable}]
    else:
        raw = _normalize(groups)
    out, seen = [], set()
    for gi, g in enumerate(raw):
        unknown = set(g) - {"params", *GROUP_KEYS}
        if unknown and not as_torch:
            raise ConfigError(f"param group {gi}: keys {sorted(unknown)} are not supported; use "
                              f"{', '.join(GROUP_KEYS)}")
        ps = []
        for p in g["params"]:
            if not isinstance(p, torch.Tensor):
                raise ConfigError(f"param group {gi} holds a {type(p).__name__}, not a parameter")
            if id(p) in seen:
                raise ConfigError(f"parameter {names.get(id(p), '?')} appears in more than one parameter group")
            seen.add(id(p))
            if id(p) not in names:
                raise ConfigError(f"param group {gi} holds a tensor that is not a parameter of the model")
            if not p.requires_grad:
                continue  # frozen: never gets a gradient, never stepped (torch keeps it and skips it)
            if not p.is_floating_point():
                raise ConfigError(f"parameter {names[id(p)]} is not floating point")
            ps.append(p)
        values = {k: v for k, v in g.items() if k != "params"}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        if ps or as_torch:
            out.append({**defaults, **values, "params": ps})
    left_out = [names[id(p)] for p in trainable if id(p) not in seen]
    if left_out and not as_torch:
        raise ConfigError(f"trainable parameter(s) {', '.join(left_out[:5])}"
                          f"{f' and {len(left_out) - 5} more' if len(left_out) > 5 else ''} are in no "
                          f"parameter group: add them to a group, or freeze them with requires_grad_(False)")
    if not any(g["params"] for g in out):
        raise ConfigError("the model has no trainable parameters" if groups is None else
                          "the parameter groups hold no trainable parameter (requires_grad=True)")
    return out


def _normalize(groups: Iterable[Any]) -> list[dict[str, Any]]:
    items = list(groups)
    if not items:
        raise ConfigError("param_groups is empty")
    if all(isinstance(g, dict) for g in items):
        out = []
        for i, g in enumerate(items):
            if "params" not in g:
                raise ConfigError(f"param group {i} has no 'params' entry")
            ps = g["params"]
            out.append({**g, "params": [ps] if isinstance(ps, torch.Tensor) else list(ps)})
        return out
    if any(isinstance(g, dict) for g in items):
        raise ConfigError("param_groups mixes dicts and parameters; pass either parameters or group dicts")
    return [{"params": items}]
