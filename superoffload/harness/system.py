"""The System protocol: what every trained system (ours and the baselines) implements.

The runner owns everything that must be identical across systems: the model's initial weights (built
once on the host with a fixed seed and handed over), the data, warm-up, timing, memory and telemetry.
A system only turns a model into something that can take one optimizer step on a batch.
"""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from superoffload.options import DeviceKind, Precision
from superoffload.shapes import ModelShape

# Fields whose name in a run record predates the code's: the record's ``run`` keeps the old key, so every
# reader of old and new records (reports, nightly, calibrate) reads one name.
RECORD_KEYS = {"precision": "dtype", "world": "world_size"}


@dataclass
class RunConfig:
    """Everything about a run that is not the model's shape. Validated by the CLI and the runner.

    ``precision`` was called ``dtype`` (still accepted as a keyword; the record's key stays ``run.dtype``).
    ``world`` is the number of ranks (the record's key stays ``run.world_size``)."""

    system: str = "torch"
    model: str = "gpt-tiny"
    seq: int = 128  # tokens per sequence; under sequence parallelism the global length (the SP group's)
    batch: int = 2  # micro-batch, sequences per step per rank (per data-parallel group under --sp)
    grad_accum: int = 1
    steps: int = 10  # timed steps (after warm-up)
    warmup: int = 2
    precision: Precision = "fp32"
    seed: int = 1234
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 0.0  # 0 = off; otherwise global-norm clipping to this value
    activation_checkpointing: bool = False
    threads: int | None = None  # host threads for torch and the host optimizer
    device: DeviceKind = "auto"
    world: int = 1  # ranks: --nproc, or torchrun's WORLD_SIZE (the runner sets it)
    # bind this rank's process to its own slice of the host's cores (superoffload.harness.placement)
    bind_cores: bool = False
    host_threads: int | None = None  # host optimizer threads (default: `threads`; --bind-cores: slice - 1)
    system_options: dict[str, Any] = field(default_factory=dict)  # system-specific knobs
    # Long sequences (superoffload.sequence; systems in systems.SP_SYSTEMS): Ulysses degree (consecutive
    # ranks form an SP group, each holding seq / sp tokens of every sequence; world / sp data-parallel
    # groups), the tiled loss (tokens per tile; None: the plain loss), checkpoints held in host memory
    # (implies activation checkpointing)
    sp: int = 1
    loss_tile: int | None = None
    offload_checkpoints: bool = False
    peak_flops: float | None = None  # override the peak used for MFU/HFU
    # where the initial weights are drawn: "host" (the same bits on every machine), or "cuda": the same seed on
    # the GPU's generator, then copied to the host before the system gets the model (a 5B model: seconds, not
    # the minute torch's CPU normal_ takes; still the same weights for every system on that GPU)
    init_device: str = "host"
    telemetry_interval_s: float = 0.1
    dtype: InitVar[str | None] = None  # the old name of ``precision``

    def __post_init__(self, dtype: str | None) -> None:
        if dtype is not None:
            self.precision = dtype

    @property
    def dp(self) -> int:
        """Data-parallel groups: every SP group of ``sp`` ranks trains the same sequences."""
        return max(1, self.world // max(1, self.sp))

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over every rank."""
        return self.batch * self.grad_accum * self.dp

    @property
    def local_seq(self) -> int:
        """Tokens of each sequence one rank holds (seq / sp)."""
        return self.seq // max(1, self.sp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over every rank (global sequence length x global batch)."""
        return self.global_batch * self.seq

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank processes per optimizer step."""
        return self.batch * self.grad_accum * self.local_seq

    @property
    def checkpointing_mode(self) -> bool | str:
        """What ``build_model(activation_checkpointing=)`` gets: "offload" with checkpoints in host memory."""
        return "offload" if self.offload_checkpoints else bool(self.activation_checkpointing)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    def record_dict(self) -> dict[str, Any]:
        """``to_dict`` under the run record's key names (``RECORD_KEYS``)."""
        return {RECORD_KEYS.get(k, k): v for k, v in self.to_dict().items()}


@dataclass
class Batch:
    """One optimizer step's worth of data for this rank: ``grad_accum`` micro-batches."""

    inputs: list[torch.Tensor]  # each [batch, seq] int64
    targets: list[torch.Tensor]


@runtime_checkable
class System(Protocol):
    """A training system under test.

    ``setup`` receives a model already initialised (fp32, on the host, same weights for every system
    with the same seed) and takes ownership of it. ``step`` runs forward + backward for every
    micro-batch and one optimizer step, and returns the mean loss as a 0-dim tensor (it may still be
    on the device; the runner synchronizes before stopping its clock). ``stats`` returns a
    JSON-serialisable dict that goes into the record (engine counters, the effective config of a
    library, ...). ``teardown`` releases processes, memory and process groups.
    """

    name: str

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None: ...

    def step(self, batch: Batch) -> torch.Tensor: ...

    def stats(self) -> dict[str, Any]: ...

    def teardown(self) -> None: ...
