"""`superoffload.AdamW`'s optimizer state in torch's schema.

torch.optim.AdamW keeps, per parameter that has been stepped, `{"step": 0-d float tensor, "exp_avg",
"exp_avg_sq"[, "max_exp_avg_sq"]}` in `optimizer.state[param]`, and its `state_dict()` is `{"state":
{index: that}, "param_groups": [{every hyper-parameter, "params": [indices]}]}`. Here the state lives
in the engine's host buckets (this rank's shard, possibly split across buckets and double-buffered), so:

- `opt.state` is a mapping (`TorchState`) that answers for the trained parameters from a snapshot of
  the engine's state, taken when first read after a step or a load (one copy of this rank's state, the
  same the engine's own `state_dict()` makes; `state_dict()` shares it when there is one, and otherwise
  makes its own without keeping it). The tensors are fp32 (the
  host state's precision) and have the parameter's shape; with several ranks and a sharded state they
  are this rank's elements, flat. Writing into them in place is taken into the engine at the next
  `step()` (as an edit of torch's state tensors would be used by its next step); anything else kept
  under `opt.state` (another key, a parameter the engine does not train) is a plain dict entry, as in
  torch's `defaultdict`.
- `state_dict()` adds the engine's part next to torch's keys (`"engine"`: fp32 masters, the bucket
  layout, the loss scale; the moments are the same tensors as the torch part's, stored once), so a
  resume is exact, and `torch.optim.AdamW.load_state_dict` takes the same dict (extra keys are ignored).
- `load_state_dict` of a superoffload dict takes the moments and steps from its torch part (what hooks
  or the caller left there) and the masters from its engine part, except for a parameter whose current
  weight is not its saved master's cast (the caller loaded or wrote other weights: they win, as in torch,
  where loading an optimizer never changes the weights). A `torch.optim.AdamW` state dict loads with the
  engine's current masters (the weights).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from superoffload.engine import checkpoint as ckpt

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine
    from superoffload.engine.layout import ParamSlot

MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def scalar_dtype() -> torch.dtype:
    """The dtype torch gives a non-fused optimizer's `step` (torch.optim.optimizer._get_scalar_dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


@dataclass
class Snapshot:
    engine_sd: dict[str, Any]  # the engine's state_dict, without param_groups (the torch part has them)
    by_param: dict[torch.Tensor, dict[str, Any]]  # torch's entries, for the parameters stepped so far
    versions: list[tuple[torch.Tensor, int]]  # each entry tensor and its version when taken

    def edited(self) -> bool:
        return any(t._version != v for t, v in self.versions)


def moments_of(engine: SuperOffloadEngine, groups: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Per param group, the moments torch's AdamW keeps for its parameters: max_exp_avg_sq only where the
    group has amsgrad (the engine holds it for every parameter when any group had amsgrad at construction)."""
    return [MOMENTS if engine.group_amsgrad(g) else MOMENTS[:2] for g in groups]


def take_snapshot(engine: SuperOffloadEngine) -> Snapshot:
    sd = dict(engine.state_dict())  # synchronizes with the host worker first
    sd.pop("param_groups", None)
    moments = moments_of(engine, engine.optimizer.param_groups)
    by_param: dict[torch.Tensor, dict[str, Any]] = {}
    for s in engine.slots:
        entry = sd["params"][s.name]
        if entry["step"] <= 0:
            continue  # never stepped: no state, as in torch
        whole = sum(b - a for a, b in entry["ranges"]) == s.numel
        st: dict[str, Any] = {"step": torch.tensor(float(entry["step"]), dtype=scalar_dtype())}
        st.update({k: entry[k].view(s.shape) if whole else entry[k] for k in moments[s.group] if k in entry})
        by_param[s.param] = st
    return Snapshot(sd, by_param, [(t, t._version) for st in by_param.values() for t in st.values()])


class TorchState(MutableMapping):
    """`optimizer.state`: the trained parameters' state from the engine, anything else in a dict."""

    def __init__(self, opt: Any, extra: dict | None = None) -> None:
        self._opt = opt
        self.extra: dict[Any, Any] = dict(extra or {})
        self._snap: Snapshot | None = None
        self._snap_step = -1

    def snapshot(self, keep: bool = True) -> Snapshot | None:
        """The engine's state now (None without an engine). `keep`: held until the next step or load, so
        that in-place edits of its tensors reach the engine; `state_dict()` does not keep its own (a whole
        copy of this rank's state, which a training loop that only saves should not carry along)."""
        e = self._opt._engine
        if e is None:
            return None
        if self._snap is not None and self._snap_step == e.global_step:
            return self._snap
        snap = take_snapshot(e)
        if keep:
            self._snap, self._snap_step = snap, e.global_step
        return snap

    def invalidate(self) -> None:
        self._snap = None

    def edited(self) -> bool:
        return self._snap is not None and self._snap.edited()

    def _served(self) -> dict[torch.Tensor, dict[str, Any]]:
        snap = self.snapshot()
        return snap.by_param if snap is not None else {}

    def _trained(self, key: Any) -> bool:
        return isinstance(key, torch.Tensor) and self._opt.owns(key)

    def __getitem__(self, key: Any) -> Any:
        served = self._served()
        if key in served:
            return served[key]
        if self._trained(key):
            return {}  # trained, not stepped yet
        return self.extra.setdefault(key, {})  # torch's defaultdict(dict)

    def get(self, key: Any, default: Any = None) -> Any:
        served = self._served()
        if key in served:
            return served[key]
        return self.extra.get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._trained(key):
            raise TypeError("superoffload.AdamW keeps the state of the parameters it trains in its engine: edit the "
                            "tensors of optimizer.state[param] in place, or load a state_dict")
        self.extra[key] = value

    def __delitem__(self, key: Any) -> None:
        if self._trained(key):
            raise TypeError("superoffload.AdamW keeps the state of the parameters it trains in its engine: load a "
                            "state_dict without it to start it afresh")
        del self.extra[key]

    def __contains__(self, key: object) -> bool:
        return key in self._served() or key in self.extra

    def __iter__(self) -> Iterator[Any]:
        return iter([*self._served(), *self.extra])

    def __len__(self) -> int:
        return len(self._served()) + len(self.extra)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


# --- loading --------------------------------------------------------------------------------------
def _torch_values(entry: dict[str, Any], st: dict[str, Any] | None, name: str, amsgrad: bool) -> None:
    """The moments and step count of torch's entry `st` for one parameter into the engine entry (in place);
    no entry: the parameter starts afresh, as in torch. `amsgrad`: its group has it (else the engine's
    max_exp_avg_sq, held when another group has amsgrad, is zeros and unused)."""
    n = entry["exp_avg"].numel()
    if not st:
        entry.update({k: torch.zeros(n) for k in MOMENTS if k in entry}, step=0)
        return
    step = st.get("step", 0)
    entry["step"] = int(float(step.item() if isinstance(step, torch.Tensor) else step))
    for k in MOMENTS:
        if k not in entry:
            continue
        t = st.get(k) if amsgrad or k != "max_exp_avg_sq" else None
        if t is None:
            if entry["step"] > 0 and amsgrad:
                raise ValueError(f"the state of parameter {name} has no {k} (saved with amsgrad=False?); this "
                                 f"optimizer has amsgrad=True")
            entry[k] = torch.zeros(n)
            continue
        if t.numel() != n:
            raise ValueError(f"the state of parameter {name} holds {t.numel()} elements of {k}, the engine {n} "
                             f"(a state dict of another world size? load the list of every rank's state dicts)")
        entry[k] = t.detach().to("cpu", torch.float32).reshape(-1)


def _master_or_weights(engine: SuperOffloadEngine, s: ParamSlot, entry: dict[str, Any]) -> torch.Tensor:
    """The saved fp32 master where the parameter still holds its cast, else the parameter's weights
    (loaded or written since: in torch loading an optimizer never changes the weights)."""
    master = entry["master"].reshape(-1)
    if engine.flow is not None and engine.flow.owns(s.param):
        return master  # its device storage is released outside forward: the host store is the weight
    flat = s.param.detach().reshape(-1)
    if flat.numel() != s.numel:
        return master
    mine = torch.cat([flat[a:b] for a, b in entry["ranges"]]).to("cpu") if entry["ranges"] else flat[:0].cpu()
    if mine.numel() != master.numel() or torch.equal(master.to(mine.dtype), mine):
        return master
    return mine.float()


def own_engine_sd(engine: SuperOffloadEngine, saved: dict[str, Any], groups: list[dict[str, Any]],
                  state_of: dict[torch.Tensor, dict[str, Any]]) -> dict[str, Any]:
    """The engine state to load from a superoffload.AdamW state dict (`saved`: its engine part)."""
    engine.synchronize()
    moments = moments_of(engine, groups)
    params = {}
    for name, e in saved["params"].items():
        params[name] = {k: v.detach().to("cpu") if isinstance(v, torch.Tensor) else v for k, v in e.items()}
    for s in engine.slots:
        entry = params.get(s.name)
        if entry is None:
            continue  # the engine names what is missing
        _torch_values(entry, state_of.get(s.param), s.name, "max_exp_avg_sq" in moments[s.group])
        entry["master"] = _master_or_weights(engine, s, entry)
    return {**saved, "params": params, "param_groups": groups}


def foreign_engine_sd(engine: SuperOffloadEngine, groups: list[dict[str, Any]],
                      state_of: dict[torch.Tensor, dict[str, Any]]) -> dict[str, Any] | None:
    """The engine state to load from a state dict without an engine part (torch.optim.AdamW's, or one of
    this optimizer's taken before its first step): the moments and steps it holds, the current masters.
    None when there is nothing to write (no state given, none held)."""
    if not any(state_of.get(s.param) for s in engine.slots) and not any(engine.steps):
        return None
    cur = engine.state_dict()
    try:
        full = ckpt.param_state(cur)
    except ValueError:  # this rank's shard only: the weights are the masters torch would see
        full = None
    held = engine.config.optimizer.amsgrad
    moments = moments_of(engine, groups)
    params = {}
    for s in engine.slots:
        master = full[s.name]["master"] if full else s.param.detach().to("cpu", torch.float32)
        entry: dict[str, Any] = {"master": master.reshape(-1), "ranges": [(0, s.numel)], "numel": s.numel,
                                 "shape": tuple(s.shape), "step": 0}
        entry.update({k: torch.zeros(s.numel) for k in MOMENTS if held or k != "max_exp_avg_sq"})
        _torch_values(entry, state_of.get(s.param), s.name, "max_exp_avg_sq" in moments[s.group])
        params[s.name] = entry
    order = cur["arrival_order"] if cur["layout_measured"] else [engine.slots[i].name for i in engine.order]
    return {"version": ckpt.VERSION, "world_size": 1, "rank": 0, "replicated": False, "params": params,
            "param_groups": groups, "loss_scale": cur["loss_scale"], "global_step": cur["global_step"],
            "micro": cur["micro"], "window_micros": cur.get("window_micros", 0), "arrival_order": order,
            "layout_measured": True}
