"""The machine a GPU run ran on, read once before it: the GPU as NVML reports it (name, driver, memory, clocks,
power limit, and the link to the host: PCIe generation and width, or NVLink-C2C on a Superchip), torch's view
of it, and the host (CPU, cores, memory, NUMA nodes).

    python -m superoffload.harness.gpu_identity --out env.json

Every NVML query is optional: one the driver does not answer is listed under ``unsupported`` and the rest is
still read; without NVML (no driver, nvidia-ml-py missing) ``gpu`` is null and ``no_gpu_reason`` says why.
Telemetry during a run (utilisation, power, link throughput) is ``superoffload.harness.telemetry``'s.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import psutil

from superoffload.harness import provenance
from superoffload.harness.record import write_json_atomic
from superoffload.harness.telemetry import _load_nvml
from superoffload.planner.presets import preset_for_gpu

MiB = 2**20


class _Reader:
    """NVML queries that may each be unsupported: ``get(key, fn, *args)`` returns None and notes the key."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.unsupported: list[str] = []

    def get(self, key: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.unsupported.append(key)
            return None
        try:
            v = fn(*args)
        except Exception:  # noqa: BLE001 - pynvml.NVMLError_NotSupported and kin: not an error here
            self.unsupported.append(key)
            return None
        return v.decode() if isinstance(v, bytes) else v


def _const(nv: Any, name: str, default: int) -> int:
    return int(getattr(nv, name, default))


def link(r: _Reader, h: Any) -> dict[str, Any]:
    """The GPU's link to the host: {"kind": "c2c" | "pcie" | None, PCIe generation and width (current and the
    most the slot and card allow), the PCIe speed in MT/s, whether NVLink-C2C is on}."""
    c2c = r.get("c2c_mode", "nvmlDeviceGetC2cModeInfoV", h)
    c2c_on = bool(getattr(c2c, "isC2cEnabled", 0)) if c2c is not None else None
    out = {"c2c_enabled": c2c_on,
           "pcie_gen": r.get("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
           "pcie_width": r.get("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
           "pcie_gen_max": r.get("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
           "pcie_width_max": r.get("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h),
           "pcie_speed_mtps": r.get("pcie_speed", "nvmlDeviceGetPcieSpeed", h)}
    out["kind"] = "c2c" if c2c_on else ("pcie" if out["pcie_gen"] is not None else None)
    return out


def _clocks(r: _Reader, h: Any) -> dict[str, Any]:
    nv = r.nvml
    sm, mem = _const(nv, "NVML_CLOCK_SM", 1), _const(nv, "NVML_CLOCK_MEM", 2)
    return {"sm_mhz": r.get("clock_sm", "nvmlDeviceGetClockInfo", h, sm),
            "mem_mhz": r.get("clock_mem", "nvmlDeviceGetClockInfo", h, mem),
            "sm_max_mhz": r.get("clock_sm_max", "nvmlDeviceGetMaxClockInfo", h, sm),
            "mem_max_mhz": r.get("clock_mem_max", "nvmlDeviceGetMaxClockInfo", h, mem),
            "sm_app_mhz": r.get("clock_sm_app", "nvmlDeviceGetApplicationsClock", h, sm)}


def gpu_identity(nv: Any, index: int = 0) -> dict[str, Any]:
    """One GPU's identity through an initialised NVML module ``nv`` (pynvml or a stand-in with its names)."""
    r = _Reader(nv)
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = r.get("memory", "nvmlDeviceGetMemoryInfo", h)
    power = r.get("power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
    cap = r.get("compute_capability", "nvmlDeviceGetCudaComputeCapability", h)
    uuid = r.get("uuid", "nvmlDeviceGetUUID", h)
    cuda_driver = r.get("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2")
    mig = r.get("mig_mode", "nvmlDeviceGetMigMode", h)
    out = {
        "index": index, "count": r.get("count", "nvmlDeviceGetCount"),
        "name": r.get("name", "nvmlDeviceGetName", h),
        "uuid_hash": hashlib.sha256(str(uuid).encode()).hexdigest()[:12] if uuid else None,
        "driver": r.get("driver", "nvmlSystemGetDriverVersion"),
        "cuda_driver": f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}" if isinstance(cuda_driver, int) else None,
        "memory_total_mib": int(mem.total) // MiB if mem is not None else None,
        "memory_used_mib": int(mem.used) // MiB if mem is not None else None,
        "compute_capability": f"{cap[0]}.{cap[1]}" if isinstance(cap, tuple) else None,
        "power_limit_w": power / 1000.0 if isinstance(power, (int, float)) else None,
        "pstate": r.get("pstate", "nvmlDeviceGetPerformanceState", h),
        "temperature_c": r.get("temperature", "nvmlDeviceGetTemperature", h, _const(nv, "NVML_TEMPERATURE_GPU", 0)),
        "persistence_mode": r.get("persistence", "nvmlDeviceGetPersistenceMode", h),
        "mig_mode": mig[0] if isinstance(mig, (tuple, list)) else mig,
        "clocks": _clocks(r, h),
        "link": link(r, h),
    }
    out["unsupported"] = sorted(set(r.unsupported))
    return out


def _torch_view() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(device=p.name, capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                   memory_total_mib=p.total_memory // MiB, free_mib=torch.cuda.mem_get_info()[0] // MiB)
    return out


def _numa_nodes() -> int | None:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return len(nodes) or None


def identity() -> dict[str, Any]:
    """The whole identity: {gpu (None without NVML), no_gpu_reason, torch, host, device_name, planner_preset
    (the planner preset a run on this device plans with: what validation falls back to without a calibrated
    profile), provenance}."""
    nv, reason = _load_nvml()
    gpu = None
    if nv is not None:
        try:
            gpu = gpu_identity(nv)
        except Exception as e:  # noqa: BLE001 - NVML without a usable device 0
            gpu, reason = None, f"NVML has no device 0: {e}"
    t = _torch_view()
    gpu_name = (gpu or {}).get("name") or t.get("device")
    device = gpu_name or f"{provenance.cpu_model()} (CPU only)"
    return {
        "kind": "gpu_identity", "gpu": gpu, "no_gpu_reason": None if gpu else reason, "torch": t,
        "host": {"cpu": provenance.cpu_model(), "cores": os.cpu_count(),
                 "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                 "memory_total_mib": psutil.virtual_memory().total // MiB,
                 "memory_available_mib": psutil.virtual_memory().available // MiB, "numa_nodes": _numa_nodes()},
        "device_name": device, "planner_preset": preset_for_gpu(gpu_name),
        "provenance": provenance.collect(device),
    }


def with_line(ident: dict[str, Any]) -> dict[str, Any]:
    """``ident`` with ``line``: describe()'s one line, for readers that do not import this module."""
    return {**ident, "line": describe(ident)}


def describe(ident: dict[str, Any]) -> str:
    """One line: "NVIDIA H100 80GB HBM3, 81559 MiB, driver 580.159.04 (CUDA 13.0), PCIe gen5 x16, SM 1980 MHz"."""
    g = ident.get("gpu")
    if not g:
        return f"{ident.get('device_name')}: no GPU identity ({ident.get('no_gpu_reason')})"
    ln = g["link"]
    if ln["kind"] == "c2c":
        how = "NVLink-C2C"
    elif ln["kind"] == "pcie":
        how = f"PCIe gen{ln['pcie_gen']} x{ln['pcie_width']} (max gen{ln['pcie_gen_max']} x{ln['pcie_width_max']})"
    else:
        how = "link unknown"
    return (f"{g['name']}, {g['memory_total_mib']} MiB, driver {g['driver']} (CUDA {g['cuda_driver']}), {how}, "
            f"SM {g['clocks']['sm_mhz']} of {g['clocks']['sm_max_mhz']} MHz, power limit {g['power_limit_w']} W")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="write the identity here as JSON (atomically)")
    a = ap.parse_args(argv)
    ident = with_line(identity())
    write_json_atomic(a.out, ident)
    print(describe(ident))
    h = ident["host"]
    print(f"host: {h['cpu']}, {h['cores']} cores, {h['memory_total_mib']} MiB, {h['numa_nodes']} NUMA node(s); "
          f"torch {ident['torch']['version']} (CUDA {ident['torch']['cuda']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
