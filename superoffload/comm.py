"""DeepSpeed's `deepspeed.comm` names a training script uses (`from deepspeed import comm as dist`), over
torch.distributed; without an initialized process group this process is rank 0 of 1."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as _dist


def is_initialized() -> bool:
    return _dist.is_available() and _dist.is_initialized()


def get_rank(group: Any = None) -> int:
    return _dist.get_rank(group) if is_initialized() else 0


def get_world_size(group: Any = None) -> int:
    return _dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier(group: Any = None) -> None:
    if is_initialized():
        _dist.barrier(group)


def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
    if is_initialized():
        return _dist.all_reduce(tensor, op=op or _dist.ReduceOp.SUM, group=group, async_op=async_op)
    return None


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False) -> Any:
    if is_initialized():
        return _dist.broadcast(tensor, src, group=group, async_op=async_op)
    return None


ReduceOp = _dist.ReduceOp
