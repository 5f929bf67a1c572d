"""One vocabulary for the knobs that the engine, the planner and the harness share.

Each knob has one name and one set of values everywhere: the engine config (`SuperOffloadConfig`), the
planner's `Options` and `Plan`, the harness's `-o KEY=VALUE` options and the run records all use the
names below. The choices are `Literal` types, so type checkers see them, and the runtime checks are
derived from the same types (`choices_of`), so the two cannot drift.

This module imports nothing from the rest of the package and torch only inside `torch_dtype`, so the
planner (which must stay torch-free at import) can use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "bf16", "fp16"]
"""dtype of the model's weights on the device (and of its gradients)."""

HostOptimizer = Literal["grace", "torch", "cpuadam"]
"""host Adam kernel: GraceAdam (one fused pass), torch's fused CPU AdamW, DeepSpeedCPUAdam."""

RollbackMode = Literal["deferred", "full_copy"]
"""how a speculative host step stays exactly undoable: a commit pass after validation (0 B/param
extra) or a second state set written out of place (12 B/param extra, commit is a swap)."""

CastSide = Literal["device", "host"]
"""where a bf16/fp16 <-> fp32 cast runs: on the device (fp32 crosses the link) or on the host
(low precision crosses the link)."""

DeviceKind = Literal["auto", "cuda", "host", "sim", "cpu"]
"""`cuda`; `host`, the CPU-only fast path (device tensors are host tensors); `sim`, a simulated
discrete device on the CPU that runs the CUDA code path with checked stream ordering; `auto` picks
cuda when available, else host; `cpu` is an alias of `host`."""

PRECISIONS: tuple[str, ...] = get_args(Precision)
HOST_OPTIMIZERS: tuple[str, ...] = get_args(HostOptimizer)
ROLLBACK_MODES: tuple[str, ...] = get_args(RollbackMode)
CAST_SIDES: tuple[str, ...] = get_args(CastSide)
DEVICE_KINDS: tuple[str, ...] = get_args(DeviceKind)

# bytes per element of each precision (the planner's byte counts come from here)
PRECISION_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}

# The knobs the engine config, the planner (`Options`, `Plan.engine_options`) and the harness share, with
# the engine's default for each (SuperOffloadConfig's field defaults; tests/planner/test_vocabulary.py
# keeps the two equal). A reader of an engine config dict that lacks a key, such as a run record written
# before the key existed, takes the default from here.
ENGINE_DEFAULTS: dict[str, Any] = {
    "precision": "fp32",
    "bucket_size": 1 << 24,  # elements per bucket
    "device_tail_buckets": 0,  # the last k buckets by gradient arrival step on the device
    "speculation": True,  # host steps during backward, validated after
    "rollback_mode": "deferred",
    "grad_cast": "device",
    "param_cast": "host",
    "host_optimizer": "grace",
    "flow_layers": [],  # block indices whose weights live on the host
    "flow_prefetch": 1,  # blocks fetched ahead of use (0 = on demand)
    "grad_accum": 1,
    "grad_clip": 0.0,  # global-norm threshold; 0 = off
    "upload_slots": 0,  # 0: an upload buffer per host bucket; k: a ring of k pinned slots
    "replicate": False,  # several ranks: every rank keeps the whole optimizer state (all-reduce, no all-gather)
}
SHARED_KEYS: tuple[str, ...] = tuple(ENGINE_DEFAULTS)

# Engine config knobs that only the planner's memory model reads (planner/memory.py EngineMemoryInput), with the
# engine's defaults (tests/planner/test_vocabulary.py keeps them equal): the staging ring's slots and AMSGrad's
# extra state (the config's `optimizer.amsgrad`).
MEMORY_DEFAULTS: dict[str, Any] = {"staging_buffers": 2, "amsgrad": False}


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a precision name; the one table of it in the project."""
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in table:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    return table[precision]


def precision_of(dtype: torch.dtype) -> str:
    """The precision name of a torch dtype (the inverse of `torch_dtype`)."""
    for p in PRECISIONS:
        if torch_dtype(p) == dtype:
            return p
    raise ValueError(f"no precision name for dtype {dtype}; supported: {', '.join(PRECISIONS)}")


def choices_of(literal: Any) -> tuple[str, ...]:
    """The allowed values of a `Literal[...]` type."""
    return get_args(literal)


def check_choice(name: str, value: Any, literal: Any) -> str:
    """`value` if it is one of `literal`'s values, else a ValueError that names the key and the choices."""
    allowed = choices_of(literal)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value
