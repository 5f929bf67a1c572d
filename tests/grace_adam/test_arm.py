"""The NEON and SVE paths, cross-compiled and run under qemu-user (scripts/arm_test.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "arm_test.sh"


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 "
                           "(apt-get install gcc-aarch64-linux-gnu qemu-user)")
def test_arm_paths_bit_identical_under_qemu():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ARM: PASS" in r.stdout
    assert r.stdout.count("PASS: all ISA paths bit-identical to scalar") == 5
