"""torch.optim's state-dict schema, packed and unpacked as `torch.optim.Optimizer` does (its
`state_dict` / `load_state_dict`, torch/optim/optimizer.py): parameters become indices in group order
(a parameter listed again keeps its first index), groups keep every key but `params`; loading checks the
group count and sizes with torch's messages, maps indices back to this optimizer's parameters in order,
keeps a saved `param_names` (or this optimizer's, when the saved group has none), and keeps state under
keys that are no parameter as it is. The hooks are run by the caller (adamw.py), in torch's order."""

from __future__ import annotations

from copy import deepcopy
from itertools import chain
from typing import Any

import torch

from superoffload.optim.arguments import GROUP_DEFAULTS


def pack(param_groups: list[dict[str, Any]], state: Any) -> dict[str, Any]:
    """{"state": {index: ...}, "param_groups": [...]} of `param_groups` and the `state` mapping."""
    index: dict[int, int] = {}
    start = 0
    groups = []
    for g in param_groups:
        packed = {k: v for k, v in g.items() if k != "params"}
        for i, p in enumerate(g["params"], start):
            index.setdefault(id(p), i)
        packed["params"] = [index[id(p)] for p in g["params"]]
        start += len(packed["params"])
        groups.append(packed)
    packed_state = {(index[id(k)] if isinstance(k, torch.Tensor) else k): v for k, v in state.items()}
    return {"state": packed_state, "param_groups": groups}


def _cast_like(p: torch.Tensor, value: Any, key: Any = None) -> Any:
    """A parameter's loaded state as torch casts it: tensors to the parameter's device, floating ones
    (but `step`) to its dtype, through dicts and sequences."""
    if isinstance(value, torch.Tensor):
        if key == "step" or not p.is_floating_point():
            return value.to(device=p.device)
        return value.to(dtype=p.dtype, device=p.device)
    if isinstance(value, dict):
        return {k: _cast_like(p, v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_like(p, v) for v in value)
    return value


def unpack(param_groups: list[dict[str, Any]], sd: dict[str, Any], trained: Any) -> tuple[
        list[dict[str, Any]], dict[torch.Tensor, dict[str, Any]], dict[Any, Any]]:
    """(the new param groups, the saved state of the parameters `trained(p)` says the engine trains, the
    rest of the state as torch keeps it)."""
    saved_groups = deepcopy(sd["param_groups"])
    if len(param_groups) != len(saved_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(g["params"]) != len(s["params"]) for g, s in zip(param_groups, saved_groups, strict=True)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's "
                         "group")
    id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                      chain.from_iterable(g["params"] for g in param_groups), strict=True))
    engine_state: dict[torch.Tensor, dict[str, Any]] = {}
    rest: dict[Any, Any] = {}
    for k, v in sd["state"].items():
        p = id_map.get(k) if isinstance(k, int) else None
        if p is None:
            rest[k] = v
        elif trained(p):
            engine_state[p] = v
        else:
            rest[p] = _cast_like(p, v)
    groups = []
    for g, s in zip(param_groups, saved_groups, strict=True):
        s["params"] = g["params"]
        if "param_names" in g and "param_names" not in s:
            s["param_names"] = g["param_names"]
        for key, default in GROUP_DEFAULTS.items():
            s.setdefault(key, default)
        s["decoupled_weight_decay"] = True  # AdamW's, whatever an older dict says (torch's AdamW.__setstate__)
        groups.append(s)
    return groups, engine_state, rest
