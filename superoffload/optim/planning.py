"""The planner's defaults for `superoffload.AdamW`, made at the first step.

`superoffload.initialize` users plan up front (`superoffload explain`, the harness, `finetune`), with
the sequence length and batch in hand. An optimizer is built before any of that is known, so the plan
is made when the first step is: the model's shape from the model (a zoo model or a transformers
causal LM), the batch and sequence length from the first forward's input ids, the preset of the
device the parameters are on, the number of ranks. The plan then sets the knobs the engine reads when
it builds its buckets, which happens at that same step (bucket size, device tail buckets, speculation,
rollback mode, casting sides, host kernel); keys the caller gave are never changed.

Weight flow cannot be chosen this late (its blocks leave the device at construction); when the plan
wants it, the notes say so with the `flow_layers` to pass. With no model, no recognisable shape or no
input seen, there is no plan and the engine's defaults hold; `opt.plan_notes` says why.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from superoffload.shapes import shape_of_module

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine

log = logging.getLogger(__name__)

# what the engine reads when it builds its buckets (at the first step): the plan may still set these
# (replicate only without weight flow, whose buckets are built at construction)
LAYOUT_KEYS = ("bucket_size", "device_tail_buckets", "speculation", "rollback_mode", "grad_cast", "param_cast",
               "host_optimizer", "upload_slots", "replicate")


def _input_shape(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(batch, sequence length) of a forward's token ids: `input_ids=`, else the first 2-D integer tensor."""
    cands = [kwargs.get("input_ids"), *args, *kwargs.values()]
    for t in cands:
        if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point():
            return int(t.shape[0]), int(t.shape[1])
    return None


def _checkpointing(model: Any) -> bool:
    """Whether the model recomputes activations: transformers' flag (renamed in v5) or the zoo's."""
    for m in (model, getattr(model, "model", None)):
        if m is None:
            continue
        flag = "is_activation_checkpointing" if hasattr(type(m), "is_activation_checkpointing") else \
            "is_gradient_checkpointing"
        if getattr(m, flag, False) or getattr(m, "activation_checkpointing", False) is True:
            return True
    return False


class LazyPlan:
    def __init__(self, opt: Any, explicit: dict[str, Any], enabled: bool, hardware: str | None = None) -> None:
        self.opt = opt
        self.hardware = hardware
        self.explicit = explicit
        self.enabled = enabled
        self.plan: Any = None
        self.notes: list[str] = []
        self.seen: tuple[int, int] | None = None
        self._hook: Any = None
        self._done = False

    def attach(self, engine: SuperOffloadEngine) -> None:
        self.engine = engine
        model = self.opt.model
        if self.enabled and model is not None:
            self._hook = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        if self.seen is None:
            self.seen = _input_shape(args, kwargs)

    def from_checkpoint(self, knobs: dict[str, Any]) -> None:
        """A loaded state's layout knobs stand in for the plan (its buckets are rebuilt as they were)."""
        if self._done or self.engine.layout_measured:
            return
        self._done = True
        if self._hook is not None:
            self._hook.remove()
        chosen = {k: v for k, v in knobs.items() if k in LAYOUT_KEYS and k not in self.explicit
                  and not (k == "replicate" and self.engine.flow is not None)}
        self.engine.reconfigure(chosen)
        self.notes.append("plan: the loaded state's bucket layout knobs: " + ", ".join(f"{k}={v}" for k, v in
                                                                                       chosen.items()))

    def before_first_step(self) -> None:
        if self._done:
            return
        self._done = True
        if self._hook is not None:
            self._hook.remove()
        e = self.engine
        if not self.enabled:
            self.notes.append("plan: off (plan=False): the engine's defaults for every knob not given")
            return
        why = self._make()
        if why:
            self.notes.append(f"plan: not made ({why}): the engine's defaults for every knob not given")
            return
        chosen = {k: v for k, v in self.plan.engine_options(precision=e.config.precision).items()
                  if k in LAYOUT_KEYS and k not in self.explicit}
        if e.flow is not None and chosen.get("replicate", e.config.replicate) != e.config.replicate:
            del chosen["replicate"]
            self.notes.append(f"the plan sets replicate={self.plan.replicate}, but weight flow's buckets were built at "
                              f"construction: pass replicate={self.plan.replicate} to superoffload.AdamW")
            log.warning(self.notes[-1])
        e.reconfigure(chosen)
        given = sorted(k for k in LAYOUT_KEYS if k in self.explicit)
        self.notes.append(f"plan for {self.plan.model} (seq {self.plan.seq}, batch {self.plan.batch}, "
                          f"{self.plan.hardware}, {self.plan.chips} rank(s)): "
                          + ", ".join(f"{k}={v}" for k, v in chosen.items())
                          + (f"; given: {', '.join(given)}" if given else ""))
        if self.plan.flow_layers and "flow_layers" not in self.explicit:
            self.notes.append(f"the plan puts blocks {self.plan.flow_layers} in weight flow, which is chosen at "
                              f"construction: pass flow_layers={self.plan.flow_layers} to superoffload.AdamW")
            log.warning(self.notes[-1])

    def _make(self) -> str:
        """Make the plan; the reason when there is none."""
        from superoffload.planner.plan import PlanInfeasible, make_plan
        from superoffload.planner.presets import default_profile, get_profile, gpu_preset_warning

        e = self.engine
        model = self.opt.model
        if model is None:
            return "no model= given"
        shape = shape_of_module(model)
        if shape is None:
            return f"the shape of a {type(model).__name__} is not known to the planner"
        if self.seen is None:
            return "no forward with token ids was seen before the first step"
        batch, seq = self.seen
        gpu = torch.cuda.get_device_name(e.device) if e.device.type == "cuda" else None
        warning = None if self.hardware else gpu_preset_warning(gpu)
        hardware = self.hardware or default_profile(gpu)
        try:
            self.plan = make_plan(shape, seq, batch, get_profile(hardware),
                                  activation_checkpointing=_checkpointing(model), chips=e.comm.world,
                                  precision=e.config.precision)
        except PlanInfeasible as err:
            log.warning("superoffload.AdamW: %s", err)
            return f"infeasible: {err}"
        if warning is not None:  # the plan rests on a preset that is not this GPU's: say so, first
            self.plan.reasons.insert(0, warning)
            self.notes.append(warning)
            log.warning("superoffload.AdamW: %s", warning)
        return ""
