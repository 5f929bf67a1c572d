"""Peak FLOP/s used as the MFU/HFU denominator: a table for GPUs, a measurement for CPUs.

GPU values are the dense bf16 tensor-core peaks of the catalog (superoffload/catalog.py, which gives
their sources), whatever the run's dtype: one denominator per GPU. On a machine without a GPU, the
"device" is the CPU and the peak is measured: the best of a few large matmuls in the run's dtype. Every
record stores the value and where it came from.

A CPU's measured peak moves with the machine's load (28 vs 186 GFLOP/s minutes apart on a shared 2-core
machine), so measuring it per run made MFU move with the load instead of the code. It is measured once
per machine, dtype and thread count and kept in a cache file (``SUPEROFFLOAD_PEAK_CACHE``, default
``~/.cache/superoffload/cpu_peak.json``): the first writer wins, whether `superoffload calibrate` or the
first run, and a measurement made while other processes used more than a quarter of the CPUs is not
kept. Every later run on the machine divides by the same figure; its source names the entry.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import time
from pathlib import Path

import torch

from superoffload import catalog


def gpu_peak_flops(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU named ``name`` (its catalog record, most specific match); None for a
    GPU the catalog lacks."""
    gpu = catalog.gpu_for(name)
    return gpu.peak_flops["bf16"] if gpu is not None else None


# The probe's matmul: 1024 x 1024, unless one would take longer than MAX_MATMUL_S at the rate a 256 x 256
# one shows (a small matmul runs at a fraction of the large one's rate, so the bound is loose); then the
# largest of PROBE_SIZES that would not. fp32 stays at 1024 (0.1 s at 21 GFLOP/s, one core of a 2-core
# EPYC beside two busy loops); bf16 on a CPU without bf16 matmul units (0.35-0.45 GFLOP/s there at every
# size: 6 s per 1024 matmul, two per probe, paid by every bf16 run whose figure the machine's load kept
# from being kept) drops to 512.
PROBE_SIZES = (1024, 512, 256)
MAX_MATMUL_S = 1.0


def probe_size(flops_per_s: float) -> int:
    """The largest of PROBE_SIZES whose matmul takes at most MAX_MATMUL_S at ``flops_per_s``."""
    for n in PROBE_SIZES:
        if 2.0 * n**3 / flops_per_s <= MAX_MATMUL_S:
            return n
    return PROBE_SIZES[-1]


def _operands(dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two n x n operands, one matmul of them already run (the kernel choice warmed up)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    return a, b


@functools.lru_cache(maxsize=8)
def measure_cpu_peak_flops(dtype: torch.dtype = torch.float32, threads: int = 1, n: int | None = None,
                           seconds: float = 0.5) -> float:
    """Best observed FLOP/s of an n x n matmul on the CPU (n: ``probe_size`` of a 256 x 256 one's rate unless
    given); ``threads`` is the torch thread count in force (part of the cache key: the peak scales with it)."""
    if n is None:
        small = PROBE_SIZES[-1]
        a, b = _operands(dtype, small)
        t0 = time.perf_counter()
        torch.mm(a, b)
        n = probe_size(2.0 * small**3 / max(time.perf_counter() - t0, 1e-9))
        if n != small:
            a, b = _operands(dtype, n)
    else:
        a, b = _operands(dtype, n)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 / dt)
    return best


def peak_cache_path() -> Path:
    env = os.environ.get("SUPEROFFLOAD_PEAK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "superoffload" / "cpu_peak.json"


def _cache_key(dtype: torch.dtype, threads: int) -> str:
    from superoffload.harness.provenance import cpu_model

    return f"{cpu_model()}|{str(dtype).removeprefix('torch.')}|threads={threads}"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def store_cpu_peak(dtype: torch.dtype, threads: int, flops: float, by: str,
                   others_cpu_share: float | None = None) -> bool:
    """Keep `flops` as this machine's peak for (dtype, threads) unless one is kept already (the first writer
    wins, so every run divides by the same figure) or the machine was loaded while it was measured. True
    when it was stored."""
    from superoffload.harness.noise import OTHERS_BOUND
    from superoffload.harness.record import write_json_atomic

    if not flops > 0 or (others_cpu_share is not None and others_cpu_share > OTHERS_BOUND):
        return False
    path = peak_cache_path()
    data = _read_cache(path)
    key = _cache_key(dtype, threads)
    if key in data:
        return False
    data[key] = {"flops": float(flops), "by": by, "others_cpu_share": others_cpu_share,
                 "measured_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    try:
        write_json_atomic(path, data)
    except OSError:  # a read-only home: the figure is measured per run, as the source then says
        return False
    return True


def cpu_peak(dtype: torch.dtype, threads: int) -> tuple[float, str]:
    """(FLOP/s, source) of this machine's CPU peak for (dtype, threads): the kept figure, else a measurement
    (kept when the machine was quiet)."""
    path = peak_cache_path()
    key = _cache_key(dtype, threads)
    entry = _read_cache(path).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0:
        return float(entry["flops"]), f"cpu-peak-cache:{entry.get('by')}:{entry.get('measured_utc')}:{path}"
    from superoffload.harness.noise import NoiseSampler

    sampler = NoiseSampler().start()
    flops = measure_cpu_peak_flops(dtype, threads)
    kept = store_cpu_peak(dtype, threads, flops, "harness", sampler.others_share())
    label = f"measured-cpu-matmul:{str(dtype).removeprefix('torch.')}:threads={threads}"
    return flops, label + (f" (kept in {path})" if kept else " (not kept: measured per run)")


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
    return cpu_peak(compute, torch.get_num_threads())
