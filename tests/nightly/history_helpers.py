"""Synthetic nightly histories: nights of one case with chosen per-repeat values."""

from __future__ import annotations

from pathlib import Path

from superoffload.nightly.store import History, Sample

FP = {"device": "cpu", "cpu": "Test CPU", "cpu_count": 2, "arch": "x86_64", "gpu": None, "driver": None,
      "torch": "2.13.0", "deepspeed": "0.19.8", "cuda": None, "threads": 1, "bind_cores": False, "dtype": "fp32"}
CASE = "superoffload_gpt-tiny_s128_b2"


def add_night(h: History, i: int, tps: list[float], *, case: str = CASE, status: str = "ok",
              loss: str = "feedc0de", device_bytes: float | None = None, commit: str | None = None,
              fp: dict | None = None) -> int:
    samples = []
    for r, t in enumerate(tps):
        samples.append(Sample(case, r, "status", text=status))
        if status == "ok":
            samples += [Sample(case, r, "tokens_per_s", value=t), Sample(case, r, "step_s_median", value=256 / t),
                        Sample(case, r, "loss_hash", text=loss)]
            if device_bytes is not None:
                samples.append(Sample(case, r, "peak_device_bytes", value=device_bytes))
    return h.add_night("training", f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00+00:00", commit or f"{i:040x}",
                       False, fp or FP, f"night-{case}-{i}", samples)


def history(tmp_path: Path) -> History:
    return History(tmp_path / "history" / "nightly.sqlite")
