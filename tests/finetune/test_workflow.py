"""`snakemake convergence`: its own target (not part of `all`), a dry run lists the check and its figure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--nolock", "-n", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_convergence_target(tmp_path):
    out = _dry_run("convergence", "--config", f"results_dir={tmp_path}")
    assert "convergence_check" in out and "convergence_figure" in out
    assert "convergence_check" not in _dry_run("all", "--config", f"results_dir={tmp_path}")
