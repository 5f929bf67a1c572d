"""Peak FLOP/s used as the MFU/HFU denominator: a table for GPUs, a measurement for CPUs.

GPU values are dense bf16 tensor-core peaks from vendor specs (the torchtitan table; GH200 and H200
share H100 SXM's 989 TFLOPS since they have the same GH100 die and clocks). On a machine without a
GPU, the "device" is the CPU and the peak is measured: the best of a few large matmuls in the run's
dtype. Every record stores the value and where it came from.
"""

from __future__ import annotations

import functools
import time

import torch

# checked in order: more specific names first ("H100 PCIe" before "H100", "GH200" before "H200")
GPU_PEAK_BF16: list[tuple[str, float]] = [
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIE", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H20", 148e12),
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("A100", 312e12),
    ("L40S", 362e12),
]


def gpu_peak_flops(name: str) -> float | None:
    upper = name.upper()
    for key, value in GPU_PEAK_BF16:
        if key in upper:
            return value
    return None


@functools.lru_cache(maxsize=8)
def measure_cpu_peak_flops(dtype: torch.dtype = torch.float32, threads: int = 1, n: int = 1024,
                           seconds: float = 0.5) -> float:
    """Best observed FLOP/s of an n x n matmul on the CPU; ``threads`` is the torch thread count in
    force (part of the cache key: the peak scales with it)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm up the kernel choice
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 / dt)
    return best


def resolve_peak(device: torch.device, dtype: torch.dtype, override: float | None) -> tuple[float, str]:
    """(peak FLOP/s, source) for MFU on ``device``."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"--peak-flops must be positive, got {override}")
        return float(override), "override"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name)
        if peak is None:
            raise ValueError(f"no peak FLOPS known for GPU {name!r}; pass --peak-flops")
        return peak, f"table:{name}"
    compute = torch.float32 if dtype == torch.float16 else dtype  # CPU fp16 matmul is not a fast path
    threads = torch.get_num_threads()
    return measure_cpu_peak_flops(compute, threads), \
        f"measured-cpu-matmul:{str(compute).removeprefix('torch.')}:threads={threads}"
