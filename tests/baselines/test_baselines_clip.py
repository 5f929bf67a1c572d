"""The FSDP2 CPU-offload clip (baselines._clip) against torch.nn.utils.clip_grad_norm_ unsharded."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from baselines._clip import clip_sharded_grad_norm_
from baselines._common import ensure_process_group
from superoffload.models import build_model, get_shape


@pytest.mark.parametrize("max_norm", [0.05, 1e6], ids=["fires", "no-op"])
def test_sharded_clip_matches_clip_grad_norm(max_norm):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    ensure_process_group("cpu")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model(get_shape("gpt-tiny"), seq=16, seed=7)
    ref = copy.deepcopy(model)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fully_shard(model, mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False))
    x = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    model(x, x).backward()
    ref(x, x).backward()

    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    norm = clip_sharded_grad_norm_([p for p in model.parameters()], max_norm, mesh.get_group())
    torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad.full_tensor(), ref_grads[n], rtol=1e-6, atol=1e-9)
    assert (max_norm < ref_norm) == (max_norm == 0.05)  # the "fires" case really clipped
