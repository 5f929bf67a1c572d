"""Provenance of one results folder: pip freeze, `nvidia-smi -q` (when present), git commit and state,
CPU / OS / Python, torch and DeepSpeed versions. Written once per folder by the `provenance` rule."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's superoffload, installed or not
from superoffload.harness.provenance import cpu_model as _cpu  # noqa: E402  (torch-free)
from superoffload.harness.provenance import dist_version as _version  # noqa: E402


def _run(cmd: list[str], timeout: float = 60) -> tuple[int | None, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        return p.returncode, p.stdout if p.returncode == 0 else p.stdout + p.stderr
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{type(e).__name__}: {e}"


def collect(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    rc, freeze = _run([sys.executable, "-m", "pip", "freeze", "--all"])
    (out_dir / "pip_freeze.txt").write_text(freeze if rc == 0 else f"# pip freeze failed ({rc})\n{freeze}")
    smi = shutil.which("nvidia-smi")
    if smi:
        rc_smi, text = _run([smi, "-q"])
    else:
        rc_smi, text = None, "nvidia-smi not found on PATH (no NVIDIA driver): no GPU provenance\n"
    (out_dir / "nvidia_smi.txt").write_text(text)
    _, commit = _run(["git", "rev-parse", "HEAD"])
    _, status = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    _, describe = _run(["git", "describe", "--always", "--dirty"])
    prov = {
        "collected_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": commit.strip() or None,
        "git_dirty": bool(status.strip()),
        "git_describe": describe.strip() or None,
        "hostname_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "arch": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            d: _version(d)
            for d in (
                "torch",
                "deepspeed",
                "snakemake",
                "transformers",
                "numpy",
                "jinja2",
                "matplotlib",
                "nvidia-ml-py",
                "superoffload",
            )
        },
        "nvidia_smi": {"present": bool(smi), "returncode": rc_smi},
        "torch_extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    (out_dir / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return prov


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out-dir", required=True, type=Path)
    collect(p.parse_args().out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
