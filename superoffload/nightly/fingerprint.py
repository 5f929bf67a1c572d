"""The key a night is compared within: hardware, software and how the run used the machine.

Two nights are comparable only when everything that moves the numbers without a code change is the
same: CPU model and core count (or GPU name and driver), torch / DeepSpeed / CUDA versions, compute
thread count and core binding. The fingerprint is taken from the run records themselves (their
`provenance` and `run` blocks), so it describes where the numbers were measured, not where they
were ingested.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

FIELDS = ("device", "cpu", "cpu_count", "arch", "gpu", "driver", "torch", "deepspeed", "cuda", "threads",
          "bind_cores", "dtype")


def from_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint fields of one run record (None where the record does not say)."""
    prov = rec.get("provenance") or {}
    run = rec.get("run") or {}
    settings = rec.get("settings")
    if not run and isinstance(settings, dict):  # a plan_optimality result: how its runs used the machine
        dtypes = settings.get("dtype") or []
        run = {"threads": settings.get("threads") or None, "bind_cores": settings.get("bind_cores"),
               "dtype": dtypes[0] if len(dtypes) == 1 else None}
    device = str(prov.get("device") or "")
    # on a CUDA run the record's device is the GPU's name ("NVIDIA H200"); otherwise "cpu" or "sim (...)"
    on_gpu = bool(prov.get("cuda")) and device != "cpu" and not device.startswith("sim")
    return {
        "device": "cuda" if on_gpu else (device.split(" ")[0] or None),
        "cpu": prov.get("cpu"),
        "cpu_count": prov.get("cpu_count"),
        "arch": prov.get("arch"),
        "gpu": device if on_gpu else None,
        "driver": prov.get("driver"),
        "torch": prov.get("torch"),
        "deepspeed": prov.get("deepspeed"),
        "cuda": prov.get("cuda"),
        "threads": run.get("threads"),
        "bind_cores": bool(run.get("bind_cores")) if run else None,
        "dtype": run.get("dtype"),
    }


def merge(fps: list[dict[str, Any]]) -> dict[str, Any]:
    """One fingerprint for a night's records: a field the records disagree on is listed, sorted."""
    out: dict[str, Any] = {}
    for f in FIELDS:
        vals = sorted({json.dumps(fp.get(f)) for fp in fps})
        out[f] = json.loads(vals[0]) if len(vals) == 1 else [json.loads(v) for v in vals]
    return out


def key(fp: dict[str, Any]) -> str:
    """A stable short id of the fingerprint (the fields' JSON, hashed)."""
    canon = json.dumps({f: fp.get(f) for f in sorted(fp)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def describe(fp: dict[str, Any]) -> str:
    """One line a reader recognises: 'AMD EPYC ... x2, torch 2.13.0, deepspeed 0.17.1, 1 thread, fp32'."""
    hw = fp.get("gpu") or f"{fp.get('cpu')} x{fp.get('cpu_count')}"
    parts = [str(hw)]
    if fp.get("driver"):
        parts.append(f"driver {fp['driver']}")
    for name in ("torch", "deepspeed", "cuda"):
        if fp.get(name):
            parts.append(f"{name} {fp[name]}")
    if fp.get("threads"):
        parts.append(f"{fp['threads']} thread{'s' if fp['threads'] != 1 else ''}")
    if fp.get("bind_cores"):
        parts.append("bound cores")
    if fp.get("dtype"):
        parts.append(str(fp["dtype"]))
    return ", ".join(parts)
