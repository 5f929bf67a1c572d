"""The build helper: builds into any path, and fails cleanly without a compiler."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from grace_adam import build
from grace_adam.testing import run_python


def test_missing_compiler_raises_build_error(tmp_path):
    with pytest.raises(build.BuildError, match="not found"):
        build.build_library(tmp_path / "lib.so", cc=["definitely-not-a-compiler-xyz"])


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_build_to_path_and_load(tmp_path):
    out = tmp_path / "libgrace_adam.so"
    isas = build.build_library(out)
    assert out.exists() and "scalar" in isas
    r = run_python("import grace_adam; print(grace_adam.native_available(), grace_adam.available_isas())",
                   GRACE_ADAM_LIB=str(out))
    assert r.returncode == 0 and r.stdout.startswith("True"), r.stderr


SELFTEST = Path(__file__).resolve().parent / "csrc" / "ga_selftest.c"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_native_c_selftest_all_isas_bit_identical(tmp_path):
    """tests/grace_adam/csrc/ga_selftest.c on this machine's ISAs, built the way scripts/arm_test.sh builds
    it for aarch64 (the ARM paths run under qemu in test_arm.py)."""
    out = tmp_path / "libgrace_adam.so"
    assert build.main(["--out", str(out), "--selftest", str(SELFTEST)]) == 0
    r = subprocess.run([str(tmp_path / "ga_selftest"), "quick"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
