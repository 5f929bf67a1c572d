"""Global-norm gradient clipping for FSDP2-sharded gradients that live on the CPU.

``torch.nn.utils.clip_grad_norm_`` on CPU-offloaded DTensor gradients reduces its norm with the mesh's
backend, which is NCCL on a GPU machine and cannot take CPU tensors (upstream reports:
https://github.com/pytorch/pytorch/issues/148532, https://github.com/pytorch/torchtune/issues/1977,
https://github.com/axolotl-ai-cloud/axolotl/issues/3058). This does the reduction ourselves: each rank
sums the squares of its local shards (every element of a ``Shard`` DTensor lives on exactly one rank of
a 1-D mesh), one all-reduce over the mesh's group gives the global norm², and every shard is scaled by
the same factor as torch's clip_grad_norm_ would use: ``min(1, max_norm / (norm + 1e-6))``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def _local_grads(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    grads: list[torch.Tensor] = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if g.device_mesh.ndim != 1 or not all(isinstance(pl, Shard) for pl in g.placements):
                # a replicated dim would count its elements once per replica
                raise ValueError(f"sharded clip needs Shard placements on a 1-D mesh, got {g.placements}")
            g = g.to_local()
        grads.append(g)
    return grads


def sharded_grad_norm(grads: list[torch.Tensor], group: dist.ProcessGroup | None) -> torch.Tensor:
    """Global L2 norm of gradients sharded over ``group`` (fp32, on the grads' device)."""
    device = grads[0].device if grads else torch.device("cpu")
    if grads:
        # per-tensor norms then their squares: the same arithmetic as clip_grad_norm_ on one rank
        norms = torch._foreach_norm(grads, 2.0)
        sq = torch.stack([n.float() for n in norms]).square().sum()
    else:
        sq = torch.zeros((), device=device)
    if group is not None and dist.get_world_size(group) > 1:
        # a CPU tensor for gloo; NCCL needs it on this rank's GPU (the upstream bug this file avoids)
        comm_dev = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend(group) == "nccl" else torch.device("cpu")
        buf = sq.to(comm_dev)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
        sq = buf.to(device)
    return sq.sqrt()


def clip_sharded_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float,
                            group: dist.ProcessGroup | None) -> torch.Tensor:
    """Clip in place to ``max_norm`` (global over ``group``); returns the pre-clip global norm."""
    grads = _local_grads(params)
    total = sharded_grad_norm(grads, group)
    if grads:
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    return total
