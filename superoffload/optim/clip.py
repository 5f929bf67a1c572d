"""`torch.nn.utils.clip_grad_norm_` over parameters that `superoffload.AdamW` trains: clipped by the engine.

The engine takes each gradient during backward, so between `backward()` and `step()` those parameters'
`.grad` is None and torch's function would find nothing, return 0 and clip nothing: clipping silently
dropped. So, once a superoffload.AdamW exists, the two helpers torch's `clip_grad_norm_` calls
(`_get_total_norm`, then `_clip_grads_with_norm_(parameters, max_norm, total_norm)`; torch >= 2.6,
torch/nn/utils/clip_grad.py) are wrapped: when the parameters are ones a live superoffload.AdamW
trains, the step is clipped at `max_norm` in the engine (exactly, under speculation) and the norm torch
returns is filled with the engine's global norm. Any other call goes through unchanged. Wrapping the
helpers, not the public function, also covers a `from torch.nn.utils import clip_grad_norm_` made
before superoffload was imported. Where a torch build lacks the helpers, the public names are wrapped
instead (then only calls through `torch.nn.utils.clip_grad_norm_` are seen).

Accelerate's `Accelerator.clip_grad_norm_` no longer goes through torch's function (seen with accelerate
1.16: a DTensor-aware path that keeps only parameters whose `.grad` is set, finds none, returns 0 and
clips nothing), so it is wrapped the same way (`wrap_accelerate`): at install when accelerate is
imported, and again at every superoffload.AdamW step for a script that imports accelerate later.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

import torch
import torch.nn.utils.clip_grad as clip_grad

_live: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_last = threading.local()  # (norm_type, error_if_nonfinite) of this thread's _get_total_norm call
_lock = threading.Lock()
_installed = False


def register(opt: Any) -> None:
    _live[id(opt)] = opt


def unregister(key: int) -> None:
    _live.pop(key, None)


def owner(params: list[torch.Tensor]) -> Any:
    """The live superoffload.AdamW that trains any of `params` (at most one may)."""
    found = {id(o): o for o in list(_live.values()) for p in params if o.owns(p)}
    if len(found) > 1:
        raise RuntimeError("clip_grad_norm_ over parameters of several superoffload.AdamW optimizers: clip each "
                           "optimizer's parameters separately")
    return next(iter(found.values()), None)


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        if hasattr(clip_grad, "_get_total_norm") and hasattr(clip_grad, "_clip_grads_with_norm_"):
            _wrap_helpers()
        else:  # pragma: no cover - torch < 2.6
            _wrap_public()
    wrap_accelerate()


def wrap_accelerate() -> None:
    """Route `Accelerator.clip_grad_norm_` over a superoffload.AdamW's parameters to the engine (once;
    nothing happens while accelerate is not imported)."""
    module = sys.modules.get("accelerate.accelerator")
    cls = getattr(module, "Accelerator", None)
    if cls is None or getattr(cls.clip_grad_norm_, "_superoffload", False):
        return
    original = cls.clip_grad_norm_

    @functools.wraps(original)
    def clip_grad_norm_(self: Any, parameters: Any, max_norm: float, norm_type: float = 2) -> Any:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        opt = owner(params)
        if opt is None:
            return original(self, params, max_norm, norm_type)
        self.unscale_gradients()  # what accelerate does first (a no-op without a gradient scaler)
        total = torch.tensor(0.0)
        opt.take_clip_from_torch(params, float(max_norm), total, float(norm_type), False)
        return total

    clip_grad_norm_._superoffload = True  # type: ignore[attr-defined]
    with _lock:
        if not getattr(cls.clip_grad_norm_, "_superoffload", False):
            cls.clip_grad_norm_ = clip_grad_norm_


def _wrap_helpers() -> None:
    total, clip = clip_grad._get_total_norm, clip_grad._clip_grads_with_norm_

    @functools.wraps(total)
    def _get_total_norm(tensors: Any, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        _last.args = (float(norm_type), bool(error_if_nonfinite))
        return total(tensors, norm_type, error_if_nonfinite, foreach)

    @functools.wraps(clip)
    def _clip_grads_with_norm_(parameters: Any, max_norm: float, total_norm: torch.Tensor,
                               foreach: bool | None = None) -> None:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        opt = owner(params)
        if opt is None:
            return clip(params, max_norm, total_norm, foreach)
        norm_type, error_if_nonfinite = getattr(_last, "args", (2.0, False))
        opt.take_clip_from_torch(params, float(max_norm), total_norm, norm_type, error_if_nonfinite)
        return None

    clip_grad._get_total_norm = _get_total_norm
    clip_grad._clip_grads_with_norm_ = _clip_grads_with_norm_


def _wrap_public() -> None:  # pragma: no cover - torch < 2.6
    original = clip_grad.clip_grad_norm_

    @functools.wraps(original)
    def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        opt = owner(params)
        if opt is None:
            return original(params, max_norm, norm_type, error_if_nonfinite, foreach)
        total = torch.tensor(0.0)
        opt.take_clip_from_torch(params, float(max_norm), total, float(norm_type), error_if_nonfinite)
        return total

    clip_grad.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
