"""The reference system: plain PyTorch, everything on the device, no offload.

fp32 params with torch's fused AdamW (the loss and speed reference); bf16/fp16 via autocast on the
device (fp16 with a GradScaler), global-norm clipping when asked. On several ranks (torchrun) the model
is wrapped in ``torch.nn.parallel.DistributedDataParallel``: gradients are averaged across ranks during
backward as DDP does (bucketed all-reduce, then / world size), earlier micro-batches of an accumulation
window skip the all-reduce (``no_sync``), and every rank steps the same averaged gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from superoffload.device import get_device
from superoffload.engine.params import decay_groups
from superoffload.harness.system import Batch, RunConfig
from superoffload.options import torch_dtype
from superoffload.shapes import ModelShape

# Keys the harness itself puts into run.system_options (the CLI's --data / --data-dtype); every system
# accepts them although they mean nothing to the system.
HARNESS_OPTIONS = frozenset({"data", "data_dtype"})

OptionChecker = Callable[[str, Any], Any]


def parse_options(system: str, options: Mapping[str, Any], known: Mapping[str, OptionChecker]) -> dict[str, Any]:
    """Check ``-o`` options against a system's table {key: checker(key, value) -> parsed value}; a key not
    in it is an error, not ignored, so a typo never silently benchmarks the default configuration."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in HARNESS_OPTIONS:
            continue
        if key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ValueError(f"system {system!r} has no option {key!r} (options: {allowed})")
        out[key] = known[key](key, value)
    return out


def split_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The model's parameters as AdamW groups, split as the engine splits them (engine/params.py decay_split:
    matrices decay, biases, norms and 1-D params do not)."""
    return decay_groups(model.parameters(), weight_decay)


class TorchSystem:
    name = "torch"
    OPTIONS: ClassVar[dict[str, OptionChecker]] = {}  # the reference has no knobs: any -o is an error

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        """Check ``run`` for this system before anything is built; raise ValueError."""
        return parse_options(cls.name, run.system_options, cls.OPTIONS)

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None:
        self.run = run
        self.device = get_device(run.device)
        self.model = model.to(self.device.torch_device)
        self.dtype = torch_dtype(run.precision)
        self.autocast = run.precision != "fp32"
        self.world = world()
        self.ddp = None
        if self.world > 1:
            # the runner initialised the default group (gloo on CPU, nccl on CUDA); one device per rank
            ids = [torch.cuda.current_device()] if self.device.is_cuda else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.opt = torch.optim.AdamW(split_decay_groups(self.model, run.weight_decay), lr=run.lr,
                                     betas=run.betas, eps=run.eps,
                                     fused=True)  # fused AdamW has a CPU kernel since torch 2.4
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=run.precision == "fp16")

    def step(self, batch: Batch) -> torch.Tensor:
        dev = self.device.torch_device
        total = torch.zeros((), device=dev)
        n = len(batch.inputs)
        fwd = self.ddp if self.ddp is not None else self.model
        for i, (x, y) in enumerate(zip(batch.inputs, batch.targets, strict=True)):
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            # DDP all-reduces only on the last micro-batch of the window
            sync = self.ddp.no_sync() if self.ddp is not None and i < n - 1 else contextlib.nullcontext()
            with sync:
                with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast):
                    loss = fwd(x, y) / n
                self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.run.grad_clip > 0:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.run.grad_clip)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.opt)
        self.scaler.update()
        # GradScaler skips a step whose gradients overflowed, and backs its scale off
        self.last_step_skipped = scale is not None and self.scaler.get_scale() < scale
        self.opt.zero_grad(set_to_none=True)
        return total

    def stats(self) -> dict[str, Any]:
        out = {"optimizer": "torch.optim.AdamW(fused=True)", "autocast": self.autocast,
               "loss_scale": float(self.scaler.get_scale()) if self.scaler.is_enabled() else None,
               "world_size": self.world, "ddp": self.ddp is not None}  # the record's system_stats key
        if self.ddp is not None:
            out["backend"] = str(torch.distributed.get_backend())
        return out

    def teardown(self) -> None:
        del self.opt, self.model, self.ddp


def world() -> int:
    """Ranks of the default process group (1 when torch.distributed is not initialised)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
