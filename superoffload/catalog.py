"""The catalog: one record per system under test and one per GPU. Every other table of them derives from here.

A **system** record says what the rest of the project needs to know about a training system: where
its harness ``System`` is (imported only when the system is asked for, so DeepSpeed is never loaded for
another system), whether it runs on several ranks and with sequence parallelism, whether the planner's
cost model knows it, and how the report draws it. The order of ``SYSTEMS`` is the report's order (ours
first, then the peers that offload, then those that offload nothing).

Derived from ``SYSTEMS``: the harness registry (``superoffload.harness.systems``), the planner's
systems (``planner.systems.SYSTEMS`` / ``PAPER_ONLY_SYSTEMS``), calibrate's (``calibrate.accuracy``,
``calibrate.systems``) and the report's order, colours and names. The workflow's config schema
(``workflows/schemas/config.schema.yaml``) cannot import Python: a test keeps its system enum equal to
this catalog.

A **GPU** record matches a ``torch.cuda.get_device_name()`` and gives its dense peak FLOP/s per dtype
(the MFU denominator; the planner presets' peaks), the planner preset a run on it plans with, and the
workflow sweep ``sweep=auto`` picks for it. Matching is case-insensitive and the most specific record
wins (the longest name found in the device's name), so "NVIDIA GB200" is a GB200, not a B200, and
"NVIDIA GH200 480GB" a GH200, not an H200.

This module sits at the bottom of the layer table: it imports nothing of the project and no torch, so
the planner, the harness, calibrate, the report and the workflow all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Modelled = Literal["compared", "paper"]
"""How the planner's cost model knows a system: "compared", it predicts it wherever systems are compared
(``explain``, ``validate``, the memory check of ``bench run``, calibrate's system overheads); "paper", only
for the paper's figures that show it."""


@dataclass(frozen=True)
class SystemInfo:
    name: str
    """the ``--system`` name, the record's ``system`` and the results folder's"""
    implementation: str
    """``module:Class`` of its harness ``System`` (superoffload/harness/system.py)"""
    label: str
    """what the report calls it"""
    color: str
    """its colour in every figure"""
    multi_rank: bool = True
    """trains on several ranks under torchrun (``bench run --nproc``)"""
    sequence_parallel: bool = False
    """runs the sequence package: Ulysses ``--sp``, ``--loss-tile``, ``--offload-checkpoints``"""
    modelled: Modelled | None = None
    """how the planner's cost model knows it (None: not at all; its runs are measured, never predicted)"""


SYSTEMS: tuple[SystemInfo, ...] = (
    SystemInfo("superoffload", "superoffload.harness.systems.superoffload_system:SuperOffloadSystem",
               "SuperOffload (ours)", "#d62728", sequence_parallel=True, modelled="compared"),
    SystemInfo("ds_superoffload", "baselines.ds_superoffload:DSSuperOffloadSystem",
               "DeepSpeed SuperOffload", "#ff7f0e", modelled="compared"),
    SystemInfo("zero_offload", "baselines.zero_offload:ZeroOffloadSystem",
               "ZeRO-Offload", "#1f77b4", modelled="compared"),
    SystemInfo("zero_infinity", "baselines.zero_infinity:ZeroInfinitySystem",
               "ZeRO-Infinity", "#2ca02c", modelled="compared"),
    SystemInfo("fsdp_offload", "baselines.fsdp_offload:FSDPOffloadSystem",
               "FSDP2 CPU offload", "#9467bd", modelled="compared"),
    SystemInfo("torch", "superoffload.harness.systems.torch_system:TorchSystem",
               "PyTorch, no offload", "#555555", modelled="compared"),
    SystemInfo("ulysses", "baselines.ulysses:UlyssesSystem",
               "DeepSpeed-Ulysses", "#17becf", sequence_parallel=True, modelled="paper"),
)

SYSTEM_NAMES: tuple[str, ...] = tuple(s.name for s in SYSTEMS)

# The plain PyTorch reference: the model and its optimizer on the device and nothing else, so it has no
# per-step machinery of its own for calibrate to measure; `bench compare` divides by it by default.
REFERENCE = "torch"


def system(name: str) -> SystemInfo:
    """The record of system ``name``; ValueError naming the choices for a name the catalog lacks."""
    for s in SYSTEMS:
        if s.name == name:
            return s
    raise ValueError(f"unknown system {name!r}; choose one of: {', '.join(SYSTEM_NAMES)}")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    """matched case-insensitively inside ``torch.cuda.get_device_name()`` (the longest match wins)"""
    peak_flops: Mapping[str, float]
    """dense peak FLOP/s per dtype: "bf16" (tensor cores; the MFU denominator of every run) and, where the
    planner needs it, "fp32" (no tensor cores)"""
    peak_source: str
    """where the peaks come from"""
    preset: str | None = None
    """the planner preset (planner/presets.py PRESETS) a run on it plans with when no profile is given;
    None: no preset describes it, so a run plans with the generic GPU preset and the plan says so"""
    sweep: str = "gpu"
    """the workflow sweep ``sweep=auto`` picks on it (config/config.yaml ``sweeps``)"""


# bf16 peaks: the torchtitan table (tools/utils.py get_peak_flops), from NVIDIA's specs. GH200 and H200
# share H100 SXM's 989 TFLOP/s: the same GH100 die at the same clocks. fp32 peaks: NVIDIA datasheets.
_TORCHTITAN = "dense bf16: torchtitan get_peak_flops (NVIDIA specs)"
GPUS: tuple[GpuInfo, ...] = (
    GpuInfo("GH200", {"bf16": 989e12, "fp32": 67e12}, _TORCHTITAN + "; fp32: NVIDIA GH200 datasheet (67 TFLOPS)",
            preset="gh200", sweep="gh200"),
    GpuInfo("H200", {"bf16": 989e12, "fp32": 67e12}, _TORCHTITAN + "; fp32: NVIDIA H200 datasheet (67 TFLOPS)",
            preset="h200-pcie"),
    GpuInfo("H100 PCIe", {"bf16": 756e12, "fp32": 51e12},
            _TORCHTITAN + "; fp32: NVIDIA H100 PCIe datasheet (51 TFLOPS)", preset="h100-pcie"),
    GpuInfo("H100 NVL", {"bf16": 835e12}, _TORCHTITAN),
    GpuInfo("H100", {"bf16": 989e12}, _TORCHTITAN + " (H100 SXM)"),
    GpuInfo("H20", {"bf16": 148e12}, _TORCHTITAN),
    GpuInfo("GB200", {"bf16": 2.5e15}, _TORCHTITAN),
    GpuInfo("B200", {"bf16": 2.25e15}, _TORCHTITAN),
    GpuInfo("A100", {"bf16": 312e12}, _TORCHTITAN),
    GpuInfo("L40S", {"bf16": 362e12}, _TORCHTITAN),
)


def gpu(name: str) -> GpuInfo:
    """The record named ``name`` exactly (as in ``GPUS``); ValueError otherwise."""
    for g in GPUS:
        if g.name == name:
            return g
    raise ValueError(f"no GPU {name!r} in the catalog; known: {', '.join(g.name for g in GPUS)}")


def gpu_for(device_name: str | None) -> GpuInfo | None:
    """The record of a device named ``device_name`` (``torch.cuda.get_device_name()``): of the records whose
    name it contains, the most specific (longest); None when it contains none."""
    upper = (device_name or "").upper()
    found = [g for g in GPUS if g.name.upper() in upper]
    return max(found, key=lambda g: len(g.name), default=None)
