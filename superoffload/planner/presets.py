"""Hardware presets built from public specifications and published microbenchmarks only.

No number here was fitted to a figure of the paper. Where a spec gives only a peak, a derived value
uses one of the two shared efficiency constants below, applied the same way to every preset.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from superoffload import catalog
from superoffload.planner.hardware import ADAM_BYTES_PER_PARAM, Curve, GiB, HardwareProfile

# GraceAdam microbenchmark (the authors' table in the DeepSpeed SuperOffload blog,
# github.com/deepspeedai/DeepSpeed blogs/deepspeed-superoffload/images/superoffload_grace_adam.png, 8B row):
# seconds per full AdamW step of 8e9 params on Grace (units not printed; 28 B/param at ~350 GB/s fits).
ADAM_8B_SECONDS = {"grace": 0.608, "cpuadam": 0.769, "torch": 1.834}
_GRACE_LPDDR5X_GBPS = 500.0  # Grace: "72 cores, 500 GB/s LPDDR5" (summaries of arXiv 2509.21271); NVIDIA: up to 546


def _adam_gbps_from_table(scale: float = 1.0) -> dict[str, float]:
    """Effective GB/s at 28 B/param from the 8B row; ``scale`` moves it to another host."""
    return {k: scale * 8e9 * ADAM_BYTES_PER_PARAM / t / 1e9 for k, t in ADAM_8B_SECONDS.items()}


# Streaming efficiency: GraceAdam's effective bytes/s over Grace's spec bandwidth (368.4 / 500).
# Applied to every bandwidth-bound kernel we have no measurement for (casts, device Adam, other hosts'
# Adam), because a fused streaming pass is the same kind of work everywhere.
STREAM_EFFICIENCY = _adam_gbps_from_table()["grace"] / _GRACE_LPDDR5X_GBPS

# Link protocol efficiency: PCIe Gen5 x16 pinned copies reach ~55 GB/s of the 64 GB/s per-direction
# spec (H2D/D2H table of DeepSpeed PR #8283, github.com/deepspeedai/DeepSpeed/pull/8283). Assumed to hold
# for NVLink-C2C too, for which no public measured sweep was found.
LINK_EFFICIENCY = 55.0 / 64.0

# Fixed cost per copy (driver call + DMA setup). Assumption, order of a cudaMemcpyAsync launch;
# calibrate measures the whole curve instead.
COPY_LATENCY_S = 10e-6
SYNC_LATENCY_S = 10e-6  # event record + host wait wake-up; assumption, calibrate measures it

# Pageable copies go through a driver staging buffer copied by one CPU thread: ~10-17 GB/s on PCIe
# Gen5 hosts (DeepSpeed PR #8283); we use the middle. No public GH200 number was
# found, so the same staging limit is assumed there.
PAGEABLE_GBPS = 14.0

# Achievable vs peak matmul: TransformerEngine issue #2053 measured ~750 TFLOP/s for a large bf16
# Linear on GH200 (github.com/NVIDIA/TransformerEngine/issues/2053) against the 989 TFLOP/s dense peak.
GH200 = catalog.gpu("GH200")
MATMUL_EFFICIENCY = 750e12 / GH200.peak_flops["bf16"]

# FlashAttention-2 paper: up to ~335 TFLOP/s fwd+bwd on H100 SXM5, i.e. ~0.45 of the achievable
# GEMM rate above. Attention FLOPs run at this fraction of device_matmul_flops.
ATTENTION_FACTOR = 335e12 / 750e12


# Several chips. NVLink 4: 25 GB/s per link and direction (18 links = "900 GB/s bidirectional per GPU",
# NVIDIA Hopper architecture page). The paper's cluster (the artifact's Slurm scripts: partition ghx4,
# NCCL over the "hsn" interface; NCSA DeltaAI, inferred) has 4 GH200 per node, each GPU pair joined by 6
# NVLinks ("NV6") and one 200 Gb/s Slingshot-11 NIC per Superchip (DeltaAI system architecture,
# docs.ncsa.illinois.edu/systems/deltaai). A ring gets one peer's links per direction (150 GB/s) inside a
# node and the chip's own NIC (25 GB/s) between nodes; both at the same protocol efficiency as the
# host links (an assumption: no public NCCL sweep on that machine was found).
NVLINK4_GBPS_PER_LINK = 25.0
GH200_NODE_CHIPS = 4
GH200_PEER_LINKS = 6
SLINGSHOT11_GBPS = 200 / 8  # 200 Gb/s per NIC per direction
# Per ring step (NCCL protocol + hop): assumptions of the usual order (a few microseconds on NVLink,
# about twice that through a NIC and a switch), not measured on that machine.
NVLINK_STEP_LATENCY_S = 5e-6
NETWORK_STEP_LATENCY_S = 10e-6
# The GPUs' peaks (dense bf16 and fp32) are the catalog's (superoffload/catalog.py gives their sources). fp32
# (non-tensor-core) matmul is achievable at the same share of peak as bf16 (MATMUL_EFFICIENCY, an
# assumption); only the tiled loss's fp32 weight-gradient GEMM uses it.
INFINIBAND_NDR_GBPS = 400 / 8  # an x86 GPU server's typical one NDR NIC per GPU (assumption for PCIe presets)
# The training thread's time per device call on a GPU (overhead.py prices the engine's launch with them):
# 19 us per op that launches a kernel and 8.5 us per light call (a view, a stream context, an event record
# or wait), fitted by op class to the first H200 runs (one H200 PCIe, x86 host, torch 2.11, 2026-12-04,
# docs/results.md "First runs on a GPU"): the launch's training-thread time at 879 and at 108 buckets against
# that engine's counted ops per step (docs/cost_model.md, "The engine's launch"). That host ran GraceAdam on
# every core beside the training thread, so these are high; `calibrate` on a GPU measures them instead.
# Python and driver cost, so assumed the same behind a Grace CPU (not measured there).
GPU_LAUNCH_OP_S = 19e-6
GPU_DEVICE_CALL_S = 8.5e-6


def _links(peak_gbps: float) -> dict[str, Curve]:
    pinned = Curve.latency_bandwidth(peak_gbps * LINK_EFFICIENCY, COPY_LATENCY_S)
    pageable = Curve.latency_bandwidth(min(PAGEABLE_GBPS, peak_gbps * LINK_EFFICIENCY), COPY_LATENCY_S)
    return {"h2d_pinned": pinned, "d2h_pinned": pinned,
            "h2d_pageable": pageable, "d2h_pageable": pageable}


def gh200() -> HardwareProfile:
    # NVIDIA, "NVIDIA Grace Hopper Superchip Architecture In-Depth" (developer.nvidia.com/blog):
    # "96 GB HBM3 at up to 3000 GB/s"
    hbm_gbps = 3000.0
    return HardwareProfile(
        name="gh200",
        source="preset: NVIDIA GH200 specs, the GraceAdam table of the DeepSpeed SuperOffload blog, "
               "TransformerEngine#2053 (docs/cost_model.md, Constants and sources)",
        **_links(450.0),  # NVLink-C2C: 900 GB/s total (NVIDIA; DeepSpeed SuperOffload blog) = 450 per direction
        device_matmul_flops=750e12,  # TE#2053 measured on GH200
        device_fp32_matmul_flops=MATMUL_EFFICIENCY * GH200.peak_flops["fp32"],
        device_peak_flops=GH200.peak_flops["bf16"],
        attention_factor=ATTENTION_FACTOR,
        device_hbm_bytes=96 * GiB,  # 96 GB HBM3 (spec)
        device_hbm_gbps=hbm_gbps,
        device_cast_gbps=STREAM_EFFICIENCY * hbm_gbps,
        host_adam_gbps=_adam_gbps_from_table(),  # measured on Grace by the authors
        host_cores=72,  # Grace: 72 Neoverse V2 cores
        host_memory_bytes=480 * 10**9,  # largest LPDDR5X option on the GH200 datasheet (480 GB)
        host_cast_gbps=STREAM_EFFICIENCY * _GRACE_LPDDR5X_GBPS,
        sync_latency_s=SYNC_LATENCY_S,
        chips_per_node=GH200_NODE_CHIPS,
        intra_node_gbps=LINK_EFFICIENCY * GH200_PEER_LINKS * NVLINK4_GBPS_PER_LINK,
        inter_node_gbps=LINK_EFFICIENCY * SLINGSHOT11_GBPS,
        intra_node_latency_s=NVLINK_STEP_LATENCY_S,
        inter_node_latency_s=NETWORK_STEP_LATENCY_S,
        launch_op_s=GPU_LAUNCH_OP_S, device_call_s=GPU_DEVICE_CALL_S,
        notes=["host memory is the datasheet's 480 GB; the paper's per-chip host memory is not known",
               "C2C curve is latency+bandwidth, not a measured sweep; run `superoffload calibrate`",
               "several chips: 4 per node (NV6 NVLink between pairs), one 200 Gb/s NIC per chip, as on the "
               "paper's cluster (NCSA DeltaAI, inferred from the artifact's Slurm scripts)"],
    )


# Generic x86 host for the PCIe presets: one Xeon (Sapphire Rapids) socket with 8 channels of
# DDR5-4800 = 307 GB/s spec, 56 cores, 512 GB. Its Adam rates are Grace's scaled by the
# memory-bandwidth ratio (Adam is bandwidth bound).
_X86_MEM_GBPS = 8 * 38.4
_X86_SCALE = _X86_MEM_GBPS / _GRACE_LPDDR5X_GBPS


def _pcie_profile(name: str, gpu: catalog.GpuInfo, hbm_bytes: int, hbm_gbps: float, source: str) -> HardwareProfile:
    peak = gpu.peak_flops["bf16"]
    return HardwareProfile(
        name=name,
        source=source,
        **_links(64.0),  # PCIe Gen5 x16: 64 GB/s per direction
        device_matmul_flops=MATMUL_EFFICIENCY * peak,
        device_fp32_matmul_flops=MATMUL_EFFICIENCY * gpu.peak_flops["fp32"],
        device_peak_flops=peak,
        attention_factor=ATTENTION_FACTOR,
        device_hbm_bytes=hbm_bytes,
        device_hbm_gbps=hbm_gbps,
        device_cast_gbps=STREAM_EFFICIENCY * hbm_gbps,
        host_adam_gbps=_adam_gbps_from_table(_X86_SCALE),
        host_cores=56,
        host_memory_bytes=512 * 10**9,
        host_cast_gbps=STREAM_EFFICIENCY * _X86_MEM_GBPS,
        sync_latency_s=SYNC_LATENCY_S,
        # 8 PCIe GPUs per server talking through PCIe switches (no NVLink bridges assumed), one NDR NIC
        # per GPU between servers: assumptions about the server, not specs of the GPU
        chips_per_node=8,
        intra_node_gbps=LINK_EFFICIENCY * 64.0,
        inter_node_gbps=LINK_EFFICIENCY * INFINIBAND_NDR_GBPS,
        intra_node_latency_s=NVLINK_STEP_LATENCY_S,
        inter_node_latency_s=NETWORK_STEP_LATENCY_S,
        launch_op_s=GPU_LAUNCH_OP_S, device_call_s=GPU_DEVICE_CALL_S,
        notes=["host is an assumed Sapphire Rapids socket (8x DDR5-4800); calibrate on the real one",
               "several chips: assumed 8 per server over PCIe, one NDR 400 Gb/s NIC per GPU"],
    )


def h100_pcie() -> HardwareProfile:
    # H100 PCIe: peaks from the catalog, 80 GB HBM2e at 2.0 TB/s (NVIDIA datasheet)
    return _pcie_profile("h100-pcie", catalog.gpu("H100 PCIe"), 80 * GiB, 2000.0,
                         "preset: NVIDIA H100 PCIe datasheet, PCIe Gen5, generic x86 host")


def h200_pcie() -> HardwareProfile:
    # H200: peaks from the catalog, 141 GB HBM3e at 4.8 TB/s (NVIDIA datasheet)
    return _pcie_profile("h200-pcie", catalog.gpu("H200"), 141 * GiB, 4800.0,
                         "preset: NVIDIA H200 datasheet, PCIe Gen5, generic x86 host")


def cpu() -> HardwareProfile:
    """A CPU-only machine: the "device" is the CPU, "HBM" is a budget, the link is a memcpy.

    Spec basis: a desktop with dual-channel DDR5-4800 (76.8 GB/s) and 8 AVX2 cores at 3 GHz
    (8 x 32 fp32 FLOP/cycle x 3e9 = 768 GFLOP/s peak). Meant for CI; calibrate replaces it.
    """
    mem_gbps = 2 * 38.4
    memcpy = Curve.latency_bandwidth(STREAM_EFFICIENCY * mem_gbps / 2, 2e-6)  # copy reads + writes
    peak = 8 * 32 * 3e9
    return HardwareProfile(
        name="cpu",
        source="preset: generic 8-core DDR5 desktop (spec numbers); device = host",
        h2d_pinned=memcpy, d2h_pinned=memcpy, h2d_pageable=memcpy, d2h_pageable=memcpy,
        device_matmul_flops=MATMUL_EFFICIENCY * peak,
        device_peak_flops=peak,
        attention_factor=ATTENTION_FACTOR,
        device_hbm_bytes=32 * GiB,
        device_hbm_gbps=mem_gbps,
        device_cast_gbps=STREAM_EFFICIENCY * mem_gbps,
        host_adam_gbps=_adam_gbps_from_table(mem_gbps / _GRACE_LPDDR5X_GBPS),
        host_cores=8,
        host_memory_bytes=64 * GiB,
        host_cast_gbps=STREAM_EFFICIENCY * mem_gbps,
        sync_latency_s=2e-6,
        device_reserve_bytes=1 * GiB,
        host_reserve_bytes=4 * GiB,
        device_is_host=True,
        # several ranks on one CPU host: gloo over loopback TCP. Order of magnitude measured on the 2-core CI
        # machine (docs/cost_model.md, "Several chips"): ~1.2 GB/s all-reduce bus bandwidth, ~0.4 GB/s for
        # gloo's reduce-scatter, ~250 us for a small collective; one "node" holds every rank
        chips_per_node=64,
        intra_node_gbps=1.0,
        inter_node_gbps=1.0,
        intra_node_latency_s=100e-6,
        inter_node_latency_s=100e-6,
    )


PRESETS = {"gh200": gh200, "h100-pcie": h100_pcie, "h200-pcie": h200_pcie, "cpu": cpu}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def physical_memory_bytes(default: int = 16 * GiB) -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return default


def this_cpu(matmul_flops: float | None = None, matmul_source: str | None = None) -> HardwareProfile:
    """The `cpu` preset with what the OS says of this machine: its usable CPUs and physical memory, and the
    compute peak scaled to those cores (the preset's per-core spec); memory bandwidth stays the preset's.
    What a plan uses on a machine without a GPU when no profile is given: a 2-core 24 GB machine planned for
    the preset's 8 cores and 64 GiB said "host needs 4.3 GB of 67.6 GB". ``matmul_flops``: this CPU's matmul
    rate as measured (the harness passes the figure it keeps per machine for MFU, harness/peak.py), used for
    the compute instead of the scaled spec; ``matmul_source`` says where it came from. `superoffload
    calibrate` measures the rest."""
    base = cpu()
    cores, mem = usable_cpus(), physical_memory_bytes(base.host_memory_bytes)
    scale = cores / base.host_cores
    matmul = base.device_matmul_flops * scale if matmul_flops is None else matmul_flops
    compute = (f"compute scaled by {cores}/{base.host_cores}" if matmul_flops is None else
               f"matmul {matmul_flops / 1e9:.0f} GFLOP/s measured ({matmul_source or 'this machine'})")
    return replace(base, name="this-cpu", host_cores=cores, host_memory_bytes=mem,
                   device_hbm_bytes=min(base.device_hbm_bytes, mem),
                   device_peak_flops=base.device_peak_flops * scale, device_matmul_flops=matmul,
                   source=f"{base.source}; this machine's {cores} usable CPUs ({compute}) and {mem / GiB:.1f} GiB "
                          "of memory; calibrate measures the rest")


PRESETS["this-cpu"] = this_cpu  # `explain --hardware this-cpu`: the plan a CPU run here gets without a profile


# What a GPU without a preset of its own plans with (its catalog record names none, or the catalog lacks it): a
# generic PCIe GPU beside an x86 host. The plan says so in its reasons (gpu_preset_warning).
GENERIC_GPU_PRESET = "h100-pcie"


def default_profile(gpu_name: str | None) -> HardwareProfile:
    """The profile a plan uses when none is given: the GPU's preset, or without one `this_cpu()`."""
    return this_cpu() if gpu_name is None else PRESETS[preset_for_gpu(gpu_name)]()


def preset_for_gpu(gpu_name: str | None) -> str:
    """The preset for a device: `gpu_name` is torch.cuda.get_device_name(), None for the CPU (or the
    simulated device, which runs at this CPU's speed). A GPU is looked up in the catalog; one without a
    preset of its own gets GENERIC_GPU_PRESET, and gpu_preset_warning says so."""
    if gpu_name is None:
        return "cpu"
    gpu = catalog.gpu_for(gpu_name)
    return gpu.preset if gpu is not None and gpu.preset is not None else GENERIC_GPU_PRESET


def gpu_preset_warning(gpu_name: str | None) -> str | None:
    """The sentence a plan's reasons carry when the GPU has no preset of its own (None when it has one, or
    for the CPU): the plan is then made for the generic preset's numbers, not this GPU's."""
    if gpu_name is None:
        return None
    gpu = catalog.gpu_for(gpu_name)
    if gpu is not None and gpu.preset is not None:
        return None
    known = (f"the catalog knows it as {gpu.name} but names no preset for it" if gpu is not None
             else "superoffload/catalog.py does not list it")
    return (f"Hardware: warning: the GPU {gpu_name!r} has no planner preset ({known}): planned with the generic "
            f"'{GENERIC_GPU_PRESET}' preset, whose numbers are not this GPU's. Measure it with `superoffload "
            f"calibrate --out PROFILE.json` and plan with that profile (bench run -o hardware=PROFILE.json, "
            f"finetune --hardware PROFILE.json).")


def get_profile(name_or_path: str | Path | HardwareProfile) -> HardwareProfile:
    """A preset by name, or a profile JSON written by ``calibrate``."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]()
    path = Path(key)
    if not path.is_file():
        raise ValueError(f"unknown hardware {key!r}: not a preset ({', '.join(PRESETS)}) and not a file")
    try:
        return HardwareProfile.load(path)
    except (OSError, ValueError, TypeError) as e:  # unreadable, not JSON, or not a profile's fields
        raise ValueError(f"hardware profile {key}: not a profile written by `superoffload calibrate` "
                         f"({type(e).__name__}: {e})") from None
