"""Pieces every baseline adapter shares: option checking, the process group for world size 1.

Nothing here imports DeepSpeed, so ``validate`` stays cheap and a missing DeepSpeed only breaks the
DeepSpeed adapters.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from typing import Any

import torch.distributed as dist

# Re-exported for the adapters: the option check lives with the harness's reference system, so that every
# system, baseline or not, rejects unknown `-o` keys the same way.
from superoffload.harness.systems.torch_system import parse_options  # noqa: F401


def as_bool(key: str, value: Any) -> bool:
    """`-o key=true` arrives as a JSON bool; accept the usual spellings of a bool and nothing else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("true", "yes", "on")
    raise ValueError(f"option {key!r} must be true or false, got {value!r}")


def as_fraction(key: str, value: Any, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"option {key!r} must be a number in [0, 1], got {value!r}")
    v = float(value)
    low_ok = v >= 0.0 if allow_zero else v > 0.0
    if not (low_ok and v <= 1.0):
        rng = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"option {key!r} must be in {rng}, got {value!r}")
    return v


def as_count(key: str, value: Any) -> int:
    """A positive element count; JSON gives 5e8 as a float, so accept integral floats."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ValueError(f"option {key!r} must be a positive integer (elements), got {value!r}")
    return int(value)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dist_env_defaults() -> dict[str, str]:
    """Fill in the torch.distributed env vars of a single-process world where they are missing.

    DeepSpeed's init_distributed falls back to MPI discovery (and fails without mpi4py) unless all of
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK are set; torchrun sets them all.
    Returns what was set.
    """
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    if "MASTER_PORT" not in os.environ:
        added["MASTER_PORT"] = str(_free_port())  # a fixed port would collide with parallel runs
    os.environ.update(added)
    return added


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


_created_here = False


def ensure_process_group(device_type: str) -> str:
    """Initialise the default process group unless torchrun / the runner already did; return its backend.

    The group is process-wide and is kept until exit, never destroyed in teardown: DeepSpeed caches
    group handles in module globals (deepspeed.utils.groups), and a second engine in the same process
    fails with "Group ... is not registered" once the group it cached has been destroyed. Where something
    else in the process destroyed it anyway (a library, a test), the new group comes with DeepSpeed's cached
    handles forgotten (``forget_deepspeed_groups``), so the next engine builds them from the new group.
    """
    global _created_here
    dist_env_defaults()
    if not dist.is_initialized():
        dist.init_process_group(backend=backend_for(device_type))
        forget_deepspeed_groups()
        if not _created_here:
            atexit.register(_destroy_at_exit)
        _created_here = True
    return str(dist.get_backend())


def forget_deepspeed_groups() -> None:
    """Drop the process-group handles DeepSpeed keeps in module globals (deepspeed.utils.groups: the clone of
    the world group, the mpu, the all-to-all groups), which point into a default group that no longer exists
    once it was destroyed; DeepSpeed builds them again on first use. Nothing to do where DeepSpeed was never
    imported."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    for name, empty in (("_WORLD_GROUP", None), ("mpu", None), ("_ALL_TO_ALL_GROUP", {}),
                        ("_DATA_PARALLEL_GROUP", None), ("_MODEL_PARALLEL_GROUP", None),
                        ("_ZERO_PARAM_INTRA_PARALLEL_GROUP", None)):
        if hasattr(groups, name):
            setattr(groups, name, empty)


def _destroy_at_exit() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
