"""Registry of systems under test, read off the catalog (superoffload/catalog.py). Entries are import
strings, so the harness never imports a baseline's heavy dependencies (DeepSpeed) unless that system is
asked for."""

from __future__ import annotations

import importlib

from superoffload import catalog
from superoffload.harness.system import System

SYSTEMS: dict[str, str] = {s.name: s.implementation for s in catalog.SYSTEMS}

# Systems that train on several ranks under torchrun (bench run --nproc): torch as DDP, the DeepSpeed
# baselines and FSDP2 over the default process group, the engine sharded ZeRO-2 style.
MULTI_RANK: frozenset[str] = frozenset(s.name for s in catalog.SYSTEMS if s.multi_rank)

# Systems that run the sequence package (superoffload.sequence): Ulysses sequence parallelism (--sp), the
# tiled loss (--loss-tile) and checkpoints in host memory (--offload-checkpoints). The others refuse them.
SP_SYSTEMS: frozenset[str] = frozenset(s.name for s in catalog.SYSTEMS if s.sequence_parallel)


def supports_multi_rank(name: str) -> bool:
    return name in MULTI_RANK


def check_system(name: str) -> None:
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose one of: {', '.join(SYSTEMS)}")


def create_system(name: str) -> System:
    check_system(name)
    module, _, cls = SYSTEMS[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(f"system {name!r} is not available: {e}") from e
    return getattr(mod, cls)()
