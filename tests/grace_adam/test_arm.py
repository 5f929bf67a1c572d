"""The NEON and SVE paths, cross-compiled and run under qemu-user (scripts/arm_test.sh)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests import _watchdog as watchdog

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "arm_test.sh"


# CI's twin: Grace's vector length, one wider (the SVE code is vector-length agnostic: two lengths check that
# nothing assumes one) and NEON; the slow twin adds 512 bits and qemu's "max" (each about as slow as 256 bits)
CI_CPUS = ("max,sve128=on", "max,sve256=on", "cortex-a72")


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 "
                           "(apt-get install gcc-aarch64-linux-gnu qemu-user)")
@pytest.mark.parametrize("cpus", [pytest.param(CI_CPUS, id="sve128-sve256-neon"),
                                  pytest.param(None, id="every-cpu", marks=pytest.mark.slow)])
def test_arm_paths_bit_identical_under_qemu(cpus):
    env = {**os.environ, "ARM_TEST_CPUS": " ".join(cpus)} if cpus else None
    # progress-based, not a fixed limit: emulation runs 2-3x slower on a busy machine; a hang (no output, no
    # CPU) is stopped
    r = watchdog.run(["bash", str(SCRIPT)], env=env, warm_start=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ARM: PASS" in r.stdout
    ran = [line.split("-cpu ", 1)[1] for line in r.stdout.splitlines() if line.startswith("== qemu-aarch64 -cpu")]
    assert ran == list(cpus or ("max,sve128=on", "max,sve256=on", "max,sve512=on", "max", "cortex-a72"))
    assert r.stdout.count("PASS: all ISA paths bit-identical to scalar") == len(ran)
    assert "default ISA path: sve" in r.stdout and "default ISA path: neon" in r.stdout
