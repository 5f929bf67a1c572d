"""Gradients however they got into `.grad`, and `maximize`, for `superoffload.AdamW`.

The engine sees a gradient through the post-accumulate-grad hook autograd runs when it accumulates one
into a parameter; a gradient assigned to `p.grad` directly (`p.grad = g`, as torch's own optimizer tests
and gradient-surgery code do) runs no hook, and the engine would never launch it. So the facade keeps
its own record of the gradient autograd left in each parameter (a weak reference, set by a hook of its
own), and at `step()` (or when the norm is asked for) hands every other gradient to the engine the way
autograd would: `torch.autograd.backward(params, grads)` on the parameters themselves, a backward pass
of its own through which the engine's hooks see each gradient exactly as from a loss. The engine's
plain loop then treats it as one more pass of the window (plain_loop.py: launched at the step, or added
to what a bucket already carried). After the step the assigned tensors are put back in `.grad`, as
torch leaves them, so a `step()` without `zero_grad()` steps them again, as torch's does.

`maximize`: torch negates the gradient inside its step. Here a tensor hook on each trained parameter
negates the gradient before autograd accumulates it (and before the engine sees it), when the
parameter's group says `maximize` at that moment: the same update (Adam's moments see -g, the weight
decay is unchanged). Visible only to a hook registered after it, or in `.grad` between an accumulating
backward and `step()`.

One `superoffload.AdamW` trains a parameter at a time (its engine takes the gradient at the hook): a
later one built over the same parameters takes them over, and the earlier one refuses further use with
an error saying so (`claim`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from superoffload.engine.hooks import EngineHook

# id(param) -> (weak param, weak optimizer): who trains each parameter now (checked by identity, so a
# reused id or a copied tensor never matches)
_owners: dict[int, tuple[weakref.ref, weakref.ref]] = {}


def claim(opt: Any, params: list[torch.Tensor]) -> None:
    """`opt` trains `params` from now on; an earlier live optimizer over any of them is superseded."""
    for key in [k for k, (p, o) in _owners.items() if p() is None or o() is None]:
        del _owners[key]
    earlier = {}
    for p in params:
        entry = _owners.get(id(p))
        if entry is not None and entry[0]() is p and entry[1]() not in (None, opt):
            earlier[id(entry[1]())] = entry[1]()
        _owners[id(p)] = (weakref.ref(p), weakref.ref(opt))
    for old in earlier.values():
        old.supersede()


class GradTracker:
    """The trained parameters' gradient record, the replay of assigned gradients, and maximize."""

    def __init__(self, opt: Any, params: list[torch.Tensor], group_of: dict[int, int]) -> None:
        self._opt = weakref.ref(opt)
        self._group_of = group_of  # id(param) -> its param group's index
        self._made: dict[int, weakref.ref] = {}  # id(param) -> the gradient autograd left there last
        self.replayed: list[tuple[torch.Tensor, torch.Tensor]] = []  # (param, the gradient assigned to it)
        self._handles = []
        for p in params:
            self._handles.append(p.register_post_accumulate_grad_hook(EngineHook(self._record)))
            self._handles.append(p.register_hook(EngineHook(_Negate(self, p))))

    def _record(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._made[id(p)] = weakref.ref(p.grad)

    def maximizes(self, p: torch.Tensor) -> bool:
        opt = self._opt()
        return opt is not None and bool(opt.param_groups[self._group_of[id(p)]].get("maximize", False))

    def assigned(self, params: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(param, grad) for each gradient in `.grad` that autograd did not leave there."""
        out = []
        for p in params:
            g = p.grad
            ref = self._made.get(id(p))
            if g is not None and (ref is None or ref() is not g):
                out.append((p, g))
        return out

    def replay(self, params: list[torch.Tensor]) -> None:
        """Hand the assigned gradients of `params` to the engine through a backward pass of their own."""
        todo = self.assigned(params)
        if not todo:
            return
        sparse = [p for p, g in todo if g.layout != torch.strided]
        if sparse:
            raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
        frozen = [p for p, _ in todo if not p.requires_grad]
        for p, _ in todo:
            p.grad = None
        for p in frozen:  # torch steps a gradient in .grad whatever requires_grad says now
            p.requires_grad_(True)
        try:
            torch.autograd.backward([p for p, _ in todo], [g.detach() for _, g in todo])
        finally:
            for p in frozen:
                p.requires_grad_(False)
        self.replayed.extend(todo)

    def after_step(self) -> None:
        """The assigned gradients back in `.grad` (torch's step leaves `.grad` as it found it)."""
        for p, g in self.replayed:
            if p.grad is None:
                p.grad = g
        self.forget()

    def forget(self) -> None:
        self._made.clear()
        self.replayed = []

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.forget()


class _Negate:
    """The tensor hook of one parameter: -grad while its group says maximize."""

    def __init__(self, tracker: GradTracker, p: torch.Tensor) -> None:
        self.tracker = weakref.ref(tracker)
        self.param = weakref.ref(p)

    def __call__(self, grad: torch.Tensor) -> torch.Tensor | None:
        tracker, p = self.tracker(), self.param()
        if tracker is None or p is None or not tracker.maximizes(p):
            return None
        return -grad
