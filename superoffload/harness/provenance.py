"""Provenance: what machine and software produced a number.

`cpu_model`, `git_commit` and `dist_version` import nothing heavy (no torch), so the workflow's
scripts use them too."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(repo: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the source tree this package runs from, or (None, None) outside git."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def _grace_adam_path() -> str | None:
    try:
        import grace_adam
    except ImportError:
        return None
    return grace_adam.isa()


@functools.lru_cache(maxsize=1)
def collect(device_name: str = "cpu") -> dict[str, Any]:
    import torch

    commit, dirty = git_commit()
    cuda = torch.version.cuda if torch.cuda.is_available() else None
    driver = None
    if torch.cuda.is_available():
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - telemetry is optional
            driver = None
    return {
        "device": device_name,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": cuda,
        "driver": driver,
        "deepspeed": dist_version("deepspeed"),
        "transformers": dist_version("transformers"),
        "superoffload": dist_version("superoffload"),
        # the host Adam's code path: an ISA of the native kernel, or "torch" when it is not built (a
        # checkout without `python -m grace_adam.build` runs the pure-torch fallback, several times slower,
        # with only an import warning to say so)
        "grace_adam": _grace_adam_path(),
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    }
