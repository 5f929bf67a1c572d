"""Hooks the engine installs on the user's model, as small objects that a copy of the model drops.

`copy.deepcopy(model)` and `torch.save(model)` copy a module's hook dicts; a hook that were a bound
method of the engine would drag the engine (threads, locks, device buffers) along and fail. These hook
objects deep-copy and pickle as inert no-ops, so the copy is a plain module with the current weights.
"""

from __future__ import annotations

import functools
from typing import Any


class InertHook:
    """What an engine hook becomes in a copy of the model."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class EngineHook(functools.partial):
    """`EngineHook(fn)` calls `fn`. A `functools.partial`, so calling it adds no Python frame: a
    gradient-ready hook runs once per parameter per backward on the training thread."""

    def __deepcopy__(self, memo: dict) -> InertHook:
        return InertHook()

    def __reduce__(self) -> tuple:
        return (InertHook, ())
