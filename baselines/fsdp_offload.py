"""PyTorch FSDP2 with ``CPUOffloadPolicy``: sharded params, grads and AdamW state on the host.

``fully_shard`` per transformer block, then at the root (bottom-up, as FSDP2 requires). The optimizer
is torch's fused AdamW over the sharded CPU parameters (the same optimizer and the same decay /
no-decay groups as the ``torch`` system), stepping after backward. bf16 uses
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: bf16 compute and all-gathers, fp32
gradient reduction and fp32 master weights. fp16 is refused: FSDP2 has no loss scaler of its own.

Pinned memory only with CUDA (``CPUOffloadPolicy()``'s default pin_memory=True crashes a CPU-only
torch). Gradient clipping uses baselines._clip (upstream's clip_grad_norm_ is broken for CPU-offloaded
DTensor grads). Option: ``reshard_after_forward`` (default true, FSDP2's default: ZeRO-3-like).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn as nn

from baselines._clip import clip_sharded_grad_norm_
from baselines._common import as_bool, ensure_process_group, parse_options
from superoffload.device import get_device
from superoffload.harness.system import Batch, RunConfig
from superoffload.harness.systems.torch_system import split_decay_groups
from superoffload.options import torch_dtype
from superoffload.shapes import ModelShape


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: our GPT's ``blocks``, or a wrapped Hugging Face model's decoder layers."""
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):
        return list(model.blocks)
    inner = getattr(getattr(model, "model", None), "model", None)  # CausalLM -> *ForCausalLM -> *Model
    if isinstance(getattr(inner, "layers", None), nn.ModuleList):
        return list(inner.layers)
    raise ValueError(f"fsdp_offload: cannot find the transformer blocks of {type(model).__name__} "
                     "(expected .blocks or .model.model.layers)")


class FSDPOffloadSystem:
    name: ClassVar[str] = "fsdp_offload"
    OPTIONS: ClassVar[dict[str, Any]] = {"reshard_after_forward": as_bool}

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        if run.precision == "fp16":
            raise ValueError("fsdp_offload does not support fp16: FSDP2 has no loss scaler and unscaled "
                             "fp16 gradients underflow; use --dtype bf16 or fp32")
        return parse_options(cls.name, run.system_options, cls.OPTIONS)

    def setup(self, model: nn.Module, shape: ModelShape, run: RunConfig) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        options = self.validate(run)
        self.run = run
        self.device = get_device(run.device)
        self.backend = ensure_process_group(self.device.type)
        world = torch.distributed.get_world_size()
        self.mesh = init_device_mesh(self.device.type, (world,))
        self.pin = torch.cuda.is_available()
        offload = CPUOffloadPolicy(pin_memory=self.pin)
        mp = MixedPrecisionPolicy() if run.precision == "fp32" else \
            MixedPrecisionPolicy(param_dtype=torch_dtype(run.precision), reduce_dtype=torch.float32)
        reshard = options.get("reshard_after_forward", True)
        kw = {"mesh": self.mesh, "offload_policy": offload, "mp_policy": mp}
        for block in transformer_blocks(model):
            fully_shard(block, reshard_after_forward=reshard, **kw)
        # the root's params (embeddings, final norm, tied head) need their all-gather in forward and
        # backward anyway, so the root is not resharded between them
        fully_shard(model, reshard_after_forward=False, **kw)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        # the optimizer runs on the sharded CPU params: torch's fused CPU AdamW, same groups as `torch`
        self.opt = torch.optim.AdamW(split_decay_groups(model, run.weight_decay), lr=run.lr,
                                     betas=run.betas, eps=run.eps, fused=True)
        self.grad_norms: list[float] = []
        self.config = {"fully_shard": "per block + root", "blocks": len(transformer_blocks(model)),
                       "mesh": [world], "offload_policy": f"CPUOffloadPolicy(pin_memory={self.pin})",
                       "mp_policy": {"param_dtype": run.precision if run.precision != "fp32" else None,
                                     "reduce_dtype": "fp32" if run.precision != "fp32" else None},
                       "reshard_after_forward": reshard, "optimizer": "torch.optim.AdamW(fused=True)",
                       "grad_clip": run.grad_clip, "clip_impl": "baselines._clip (all-reduce of local norm²)"}

    last_step_skipped = False  # torch's AdamW steps every step (a non-finite gradient reaches the weights)

    def step(self, batch: Batch) -> torch.Tensor:
        dev = self.device.torch_device
        n = len(batch.inputs)
        total = torch.zeros((), device=dev)
        for i, (x, y) in enumerate(zip(batch.inputs, batch.targets, strict=True)):
            # reduce-scatter only on the last micro-batch; earlier ones accumulate unsharded grads
            self.model.set_requires_gradient_sync(i == n - 1)
            loss = self.model(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)) / n
            loss.backward()
            total += loss.detach().float()
        if self.run.grad_clip > 0:
            norm = clip_sharded_grad_norm_(self.params, self.run.grad_clip, self.mesh.get_group())
            self.grad_norms.append(float(norm))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total

    def stats(self) -> dict[str, Any]:
        return {"fsdp_config": self.config, "grad_norms": self.grad_norms,
                "world_size": torch.distributed.get_world_size(), "backend": self.backend,
                "torch_version": torch.__version__}

    def teardown(self) -> None:
        # the process group stays (see baselines._common.ensure_process_group)
        for attr in ("opt", "model", "params", "mesh"):
            if hasattr(self, attr):
                delattr(self, attr)
