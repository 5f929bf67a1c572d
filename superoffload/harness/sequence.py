"""The harness side of long sequences (``bench run --sp K``, ``--loss-tile T``, ``--offload-checkpoints``):
process groups, the sequence package's set-up on the model, and the global loss a step reports.

Rank layout (the multi-rank engine tests' recipe, tests/engine/multirank/worker.py ``scenario_sp``, and
DeepSpeed's own ``deepspeed.runtime.sequence_parallel.parallel_state_sp``): ``sp`` consecutive ranks form an
SP group that splits every sequence of its micro-batch; ``world / sp`` such groups are the data-parallel
groups, each with its own micro-batch. The runner seeds the data by data-parallel rank (``rank // sp``), so
every rank of an SP group draws the same global batch of whole sequences; the system keeps its contiguous
chunk of each (``SequenceParallel.shard``; targets are shifted over the whole sequence before sharding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from superoffload.harness.system import RunConfig


def uses_sequence_package(run: RunConfig) -> bool:
    """Whether the run asks for any piece of the sequence package that changes the loss or the data path
    (SP or the tiled loss; checkpoints in host memory alone only change how the model is built)."""
    return run.sp > 1 or run.loss_tile is not None


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def sp_groups(sp: int) -> tuple[Any, list[int]]:
    """(this rank's SP group, its ranks): consecutive ranks ``[d*sp, (d+1)*sp)``. Every rank creates every
    group (``new_group`` is collective). Without torch.distributed: (None, [0]), a group of one."""
    if not distributed():
        if sp != 1:
            raise ValueError(f"--sp {sp} needs {sp} ranks (torch.distributed is not initialized)")
        return None, [0]
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % sp:
        raise ValueError(f"--sp {sp} must divide the world size {world}")
    mine, ranks = None, []
    for d in range(world // sp):
        members = list(range(d * sp, (d + 1) * sp))
        group = dist.new_group(members)
        if rank in members:
            mine, ranks = group, members
    return mine, ranks


def tokens_per_micro_batch(run: RunConfig) -> int:
    """Targets of one micro-batch over every data-parallel group (whole sequences; the harness's data has no
    ignored targets, so this is the count ``TokenNormalizedLoss`` would otherwise all-reduce)."""
    return run.batch * run.seq * run.dp


def global_loss(total: torch.Tensor, divide: int = 1) -> torch.Tensor:
    """The ranks' loss shares summed over the world (divided by ``divide``): the global mean loss of the step.
    One scalar all-reduce, inside the step: a trainer logs this number too."""
    if distributed() and dist.get_world_size() > 1:
        total = total.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / divide if divide != 1 else total
