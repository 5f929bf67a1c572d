"""Telemetry: the no-NVML fallback and the NVML path against a fake NVML module."""

import logging
import sys
import time
import types

import superoffload.harness.telemetry as tel


def test_no_nvml_says_so_once_and_records_host(monkeypatch, caplog):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(tel, "_warned_no_nvml", False)
    with caplog.at_level(logging.WARNING):
        t1 = tel.Telemetry(0.01)
        t2 = tel.Telemetry(0.01)
    assert sum("no GPU telemetry" in r.message for r in caplog.records) == 1
    assert t1.nvml is None and t2.nvml is None
    t1.start()
    for i in range(3):
        time.sleep(0.03)
        t1.mark_step(i)
    t1.stop()
    s = t1.summary()
    assert s["gpu"] is None and "Not Found" in s["no_gpu_reason"]
    assert s["host"]["rss_bytes_peak"] > 0 and s["samples"] > 0


def test_fake_nvml_energy_per_step(monkeypatch):
    fake = types.ModuleType("pynvml")
    energy = {"mj": 1000}

    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: "h"
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=80, memory=40)
    fake.nvmlDeviceGetPowerUsage = lambda h: 300_000
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30)

    def clock(h, kind):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake.nvmlDeviceGetClockInfo = clock
    fake.nvmlDeviceGetPcieThroughput = lambda h, kind: 1000

    def energy_counter(h):
        energy["mj"] += 500
        return energy["mj"]

    fake.nvmlDeviceGetTotalEnergyConsumption = energy_counter
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    t = tel.Telemetry(0.005)
    t.start()
    for i in range(4):
        time.sleep(0.02)
        t.mark_step(i)
    t.stop()
    s = t.summary()
    assert s["gpu"]["energy_j_per_step"] == 0.5
    assert s["gpu"]["util_pct_mean"] == 80 and s["gpu"]["power_w_mean"] == 300.0
    assert "sm_clock" in s["gpu"]["unsupported"]  # unsupported query recorded, run went on
