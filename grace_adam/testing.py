"""Helpers for grace_adam's tests (in the package so tests import them under any pytest import mode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

PACKAGE_PARENT = Path(__file__).resolve().parents[1]


def ulp_units(ref: torch.Tensor, got: torch.Tensor, floor: float) -> float:
    """Largest |ref - got| in units of the fp32 spacing at max(|ref|, floor).

    Plain ulps of the result are meaningless where p + update cancels (p near 0); measuring against the
    spacing of the larger of |p| and the step size (floor = lr) is the cancellation-aware version.
    """
    ref64, got64 = ref.double(), got.double()
    scale = torch.maximum(ref64.abs(), torch.full_like(ref64, floor))
    spacing = torch.exp2(torch.floor(torch.log2(scale)) - 23)
    return float(((ref64 - got64).abs() / spacing).max())


def run_python(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (same executable) with extra environment variables."""
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          cwd=PACKAGE_PARENT, timeout=timeout, check=False)
