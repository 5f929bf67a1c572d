"""Background telemetry: NVML for the GPU, psutil for the host.

A daemon thread samples at a fixed interval (NVML calls go through ctypes and release the GIL, so the
training thread is not slowed). Energy per step comes from deltas of NVML's total-energy counter at
step boundaries (Megatron/Zeus style), not from integrating power samples. Every metric is optional:
what the driver does not support is recorded as unsupported and the run goes on. Without NVML the
sampler says "no GPU telemetry" once and records only the host.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psutil

log = logging.getLogger(__name__)
_warned_no_nvml = False


def _load_nvml() -> tuple[Any, str | None]:
    """(pynvml module or None, reason when None)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # pynvml.NVMLError: library not found, driver not loaded, ...
        return None, f"NVML unavailable: {e}"
    return pynvml, None


class Telemetry:
    """``start()``, ``mark_step(i)`` at each step boundary, ``stop()``, then ``summary()``."""

    def __init__(self, interval_s: float = 0.1, gpu_index: int = 0, want_gpu: bool = True) -> None:
        global _warned_no_nvml
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.step_energy_mj: list[float] = []
        self._last_energy: float | None = None
        self._step = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        self.nvml, self.no_gpu_reason = _load_nvml() if want_gpu else (None, "device is the CPU")
        self.handle = None
        self.unsupported: set[str] = set()
        if self.nvml is not None:
            try:
                self.handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu_index)
            except Exception as e:  # noqa: BLE001
                self.nvml, self.no_gpu_reason = None, f"NVML has no device {gpu_index}: {e}"
        if self.nvml is None and not _warned_no_nvml:
            log.warning("no GPU telemetry (%s); recording host metrics only", self.no_gpu_reason)
            _warned_no_nvml = True

    # --- sampling ---------------------------------------------------------------------------------
    def _try(self, key: str, fn, *args):
        if key in self.unsupported:
            return None
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - an unsupported query is not an error
            self.unsupported.add(key)
            return None

    def _gpu_sample(self) -> dict[str, Any]:
        nv, h = self.nvml, self.handle
        out: dict[str, Any] = {}
        util = self._try("utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["gpu_util_pct"], out["mem_util_pct"] = util.gpu, util.memory
        power = self._try("power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out["power_w"] = power / 1000.0
        mem = self._try("memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out["mem_used_bytes"] = int(mem.used)
        sm = self._try("sm_clock", nv.nvmlDeviceGetClockInfo, h, getattr(nv, "NVML_CLOCK_SM", 1))
        if sm is not None:
            out["sm_clock_mhz"] = sm
        tx = self._try("pcie_tx", nv.nvmlDeviceGetPcieThroughput, h, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
        rx = self._try("pcie_rx", nv.nvmlDeviceGetPcieThroughput, h, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
        if tx is not None and rx is not None:
            out["pcie_tx_kbps"], out["pcie_rx_kbps"] = tx, rx
        return out

    def _sample(self) -> dict[str, Any]:
        s: dict[str, Any] = {"t": time.perf_counter() - self._t0, "step": self._step,
                             "host_cpu_pct": psutil.cpu_percent(interval=None),
                             "host_rss_bytes": self._proc.memory_info().rss}
        if self.nvml is not None:
            s.update(self._gpu_sample())
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self._sample())

    def _energy_mj(self) -> float | None:
        if self.nvml is None:
            return None
        return self._try("energy", self.nvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)

    def start(self) -> None:
        psutil.cpu_percent(interval=None)  # prime the CPU% counter
        self._t0 = time.perf_counter()
        self._last_energy = self._energy_mj()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()

    def mark_step(self, step: int) -> None:
        """Call after step ``step`` has completed (device synchronized)."""
        self._step = step
        e = self._energy_mj()
        if e is not None and self._last_energy is not None:
            self.step_energy_mj.append(float(e - self._last_energy))
        self._last_energy = e

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self, timed_from_step: int = 0) -> dict[str, Any]:
        """Means over samples taken during timed steps (step index >= ``timed_from_step``)."""
        timed = [s for s in self.samples if s["step"] >= timed_from_step - 1] or self.samples

        def mean(key: str) -> float | None:
            vals = [s[key] for s in timed if key in s]
            return sum(vals) / len(vals) if vals else None

        def peak(key: str) -> float | None:
            vals = [s[key] for s in timed if key in s]
            return max(vals) if vals else None

        energy = self.step_energy_mj[timed_from_step:] if self.step_energy_mj else []
        return {
            "gpu": None if self.nvml is None else {
                "util_pct_mean": mean("gpu_util_pct"), "power_w_mean": mean("power_w"),
                "mem_used_bytes_peak": peak("mem_used_bytes"), "sm_clock_mhz_mean": mean("sm_clock_mhz"),
                "pcie_tx_kbps_mean": mean("pcie_tx_kbps"), "pcie_rx_kbps_mean": mean("pcie_rx_kbps"),
                "energy_j_per_step": (sorted(energy)[len(energy) // 2] / 1000.0) if energy else None,
                "unsupported": sorted(self.unsupported),
            },
            "no_gpu_reason": self.no_gpu_reason,
            "host": {"cpu_pct_mean": mean("host_cpu_pct"), "rss_bytes_peak": peak("host_rss_bytes")},
            "samples": len(self.samples),
            "interval_s": self.interval_s,
            "timeline": [{k: v for k, v in s.items() if k in ("t", "step", "gpu_util_pct", "host_cpu_pct",
                                                              "power_w")} for s in self.samples[-2000:]],
        }
