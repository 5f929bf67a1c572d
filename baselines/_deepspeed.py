"""The DeepSpeed side shared by zero_offload, zero_infinity and ds_superoffload.

One config builder and one engine-driving System. Every knob whose default moved across DeepSpeed
releases (or that depends on the ZeRO stage) is written out explicitly, so a record's effective config
says exactly what ran, and a DeepSpeed upgrade inside the supported range cannot silently change a
baseline:

- ``gradient_clipping``: default became 1.0 in 0.19.3 (was 0.0); we pass run.grad_clip, 0.0 = off.
- ``offload_*.pin_memory``: default became true in 0.19.5 (was false); pinning needs CUDA, so we pin
  exactly when CUDA is available (on the CPU accelerator pinning is a no-op either way).
- ``overlap_comm``: None = "true for stage 3, false otherwise"; set per adapter.
- ``reduce_bucket_size`` / ``allgather_bucket_size`` / ``sub_group_size`` / ``contiguous_gradients`` /
  ``round_robin_gradients``: written at their documented values so they are visible in the record.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from baselines._common import as_bool, as_count, ensure_process_group, parse_options
from superoffload import ds_build
from superoffload.device import get_device
from superoffload.harness.system import Batch, RunConfig
from superoffload.harness.systems.torch_system import split_decay_groups
from superoffload.shapes import ModelShape

SUPPORTED = ((0, 19, 5), (0, 20, 0))  # [low, high): same range as pyproject's bench extra


def _parse_version(v: str) -> tuple[int, int, int]:
    parts = []
    for piece in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def check_deepspeed_version(version: str) -> None:
    """Fail clearly outside the range whose defaults this module was written against."""
    low, high = SUPPORTED
    if not low <= _parse_version(version) < high:
        raise RuntimeError(f"deepspeed {version} is outside the supported range >=0.19.5,<0.20 "
                           "(config defaults changed across releases); install 'deepspeed>=0.19.5,<0.20'")


def import_deepspeed() -> Any:
    try:
        import deepspeed
    except ImportError as e:
        raise RuntimeError("DeepSpeed is not installed; install the bench extra "
                           "(pip install -e '.[bench]')") from e
    check_deepspeed_version(deepspeed.__version__)
    return deepspeed


def precision_section(dtype: str) -> dict[str, Any]:
    if dtype == "bf16":
        return {"bf16": {"enabled": True}, "fp16": {"enabled": False}}
    if dtype == "fp16":
        # dynamic loss scaling (loss_scale 0), DeepSpeed's documented defaults written out
        return {"bf16": {"enabled": False},
                "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                         "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    return {"bf16": {"enabled": False}, "fp16": {"enabled": False}}


def build_config(run: RunConfig, zero: dict[str, Any], world: int) -> dict[str, Any]:
    """The full DeepSpeed config for ``run`` with the given ``zero_optimization`` section."""
    return {
        "train_batch_size": run.batch * run.grad_accum * world,
        "train_micro_batch_size_per_gpu": run.batch,
        "gradient_accumulation_steps": run.grad_accum,
        "gradient_clipping": float(run.grad_clip),  # 0.0 explicitly: the default is 1.0 since 0.19.3
        # AdamW, decoupled weight decay; the per-group decay split comes from the param groups we pass
        "optimizer": {"type": "AdamW",
                      "params": {"lr": run.lr, "betas": list(run.betas), "eps": run.eps,
                                 "weight_decay": run.weight_decay}},
        "zero_optimization": zero,
        **precision_section(run.precision),
        "zero_allow_untested_optimizer": False,
        "zero_force_ds_cpu_optimizer": True,
        "steps_per_print": 1 << 30,  # silence DeepSpeed's periodic logging inside timed steps
        "wall_clock_breakdown": False,
    }


def offload_section(pin_memory: bool) -> dict[str, Any]:
    return {"device": "cpu", "pin_memory": pin_memory}


# Options every DeepSpeed adapter accepts: the communication knobs, to sweep them deliberately.
COMMON_OPTIONS = {"overlap_comm": as_bool, "reduce_bucket_size": as_count, "sub_group_size": as_count}


@dataclass
class DSState:
    engine: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    grad_norms: list[float | None] = field(default_factory=list)


class DeepSpeedSystem:
    """Drives a DeepSpeed engine for the harness; subclasses only describe ``zero_optimization``."""

    name: ClassVar[str] = "deepspeed"
    OPTIONS: ClassVar[dict[str, Any]] = dict(COMMON_OPTIONS)
    # DeepSpeed ops this system builds just in time on first use (announced, stale build locks cleared)
    DS_OPS: ClassVar[tuple[str, ...]] = ds_build.CPU_OFFLOAD_BUILDERS
    # ops to build and load before initialize (ds_build.prepare_deepspeed_ops, ``load``); DeepSpeed loads the
    # others itself when it first needs them
    DS_PRELOAD: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        """Check ``run`` for this system before anything is built; raise ValueError."""
        if run.device == "cpu" and torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu":
            # DeepSpeed picks its accelerator itself and would train on the GPU anyway
            raise ValueError(f"{cls.name}: --device cpu on a CUDA machine needs DS_ACCELERATOR=cpu in the "
                             "environment (DeepSpeed chooses its device itself)")
        return parse_options(cls.name, run.system_options, cls.OPTIONS)

    def zero_config(self, run: RunConfig, options: dict[str, Any], pin: bool) -> dict[str, Any]:
        raise NotImplementedError

    def before_initialize(self) -> None:
        """Hook run just before deepspeed.initialize (ds_superoffload installs its CPU shims here)."""

    def prepare(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> dict[str, Any]:
        """Hook run after the process group exists and before the config is built: change the model in place
        and return extra keyword arguments for deepspeed.initialize (ulysses: the SP groups as ``mpu``)."""
        return {}

    def batch_world(self, world: int) -> int:
        """The data-parallel ranks DeepSpeed divides ``train_batch_size`` by (every rank, unless sequence
        parallelism shares a micro-batch between ranks)."""
        return world

    def micro_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What this rank feeds of one micro-batch (ulysses: its chunk of every sequence)."""
        return x, y

    def reported_loss(self, total: torch.Tensor) -> torch.Tensor:
        """The loss a step reports from this rank's mean over its micro-batches (ulysses: the global one)."""
        return total

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None:
        options = self.validate(run)
        ds = import_deepspeed()
        # DeepSpeed JIT-builds its CPU ops on first use (cpu_adam in initialize, the CPU accelerator's
        # shm comm op in init_distributed): say so first, and clear the lock of a build that died
        ds_build.prepare_deepspeed_ops(self.DS_OPS, load=self.DS_PRELOAD)
        self.run = run
        self.version = ds.__version__
        self.device = get_device(run.device)
        self.backend = ensure_process_group(self.device.type)
        world = torch.distributed.get_world_size()
        pin = torch.cuda.is_available()  # pinning without CUDA crashes torch; with CUDA it is the fast path
        zero = self.zero_config(run, options, pin)
        for key, value in options.items():
            if key in COMMON_OPTIONS:
                zero[key] = value
        self.state = DSState(config=build_config(run, zero, self.batch_world(world)))
        # DeepSpeed reuses the group we created (or torchrun's); gloo on CPU, nccl on CUDA
        ds.init_distributed(dist_backend=self.backend)
        extra = self.prepare(model, shape, run)
        self.before_initialize()
        groups = split_decay_groups(model, run.weight_decay)  # the same groups as the torch system
        # a copy: DeepSpeed may fill in the dict it is given; the record keeps what we asked for
        engine, *_ = ds.initialize(model=model, model_parameters=groups,
                                   config=copy.deepcopy(self.state.config), **extra)
        self.state.engine = engine

    def step(self, batch: Batch) -> torch.Tensor:
        engine = self.state.engine
        dev = engine.device
        total = torch.zeros((), device=dev)
        n = len(batch.inputs)
        skipped = getattr(engine, "skipped_steps", None)
        for x, y in zip(batch.inputs, batch.targets, strict=True):
            x, y = self.micro_batch(x, y)
            loss = engine(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
            engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
            engine.step()  # an optimizer step only at the accumulation boundary
            total += loss.detach().float() / n
        # DeepSpeed counts the steps it skipped on an fp16 overflow
        self.last_step_skipped = None if skipped is None else engine.skipped_steps > skipped
        norm = engine.get_global_grad_norm()
        self.state.grad_norms.append(None if norm is None else float(norm))
        return self.reported_loss(total)

    def stats(self) -> dict[str, Any]:
        engine = self.state.engine
        opt = getattr(engine, "optimizer", None)
        inner = getattr(opt, "optimizer", None)
        out: dict[str, Any] = {
            "deepspeed_version": self.version,
            "deepspeed_config": self.state.config,
            "optimizer": type(opt).__name__ if opt is not None else None,
            "inner_optimizer": type(inner).__name__ if inner is not None else None,
            "grad_norms": self.state.grad_norms,  # pre-clip global norm per optimizer step
            "world_size": torch.distributed.get_world_size(),
            "backend": self.backend,
        }
        if self.run.precision == "fp16" and engine is not None:
            with contextlib.suppress(Exception):
                out["loss_scale"] = float(engine.optimizer.cur_scale)
        return out

    def teardown(self) -> None:
        engine = self.state.engine if hasattr(self, "state") else None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.destroy()
        if hasattr(self, "state"):
            self.state.engine = None
