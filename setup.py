"""Build hook for grace_adam's native kernel (metadata lives in pyproject.toml).

The kernel is a plain C shared library (no Python or torch headers), loaded with ctypes. It is declared
as an Extension only so that setuptools places it correctly for `pip install .` (wheel) and
`pip install -e .` (PEP 660 editable: copied into the source tree). The actual compile is done by
grace_adam/build.py with per-ISA flags. If there is no compiler or the compile fails, the install still
succeeds and `import grace_adam` warns once and uses the pure-torch fallback.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_EXT = "grace_adam._lib.libgrace_adam"
CSRC = [os.path.join("grace_adam", "csrc", f) for f in
        ("ga_core.c", "ga_pool.c", "ga_scalar.c", "ga_avx2.c", "ga_avx512.c", "ga_neon.c", "ga_sve.c")]


def _builder():
    # Load build.py by path: importing the grace_adam package would import torch, which an isolated
    # build environment does not have.
    path = os.path.join(HERE, "grace_adam", "build.py")
    spec = importlib.util.spec_from_file_location("_grace_adam_build", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


class BuildGraceAdam(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        if fullname.split(".")[-1] == LIB_EXT.split(".")[-1]:
            # a plain shared library, not a CPython extension module: no EXT_SUFFIX
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def copy_extensions_to_source(self) -> None:
        # editable installs copy the built library into grace_adam/_lib/, which a fresh clone lacks
        # (the folder holds only build outputs, so git does not track it)
        os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grace_adam", "_lib"), exist_ok=True)
        super().copy_extensions_to_source()

    def build_extension(self, ext: Extension) -> None:
        if ext.name != LIB_EXT:
            super().build_extension(ext)
            return
        out = self.get_ext_fullpath(ext.name)
        b = _builder()
        try:
            isas = b.build_library(out, verbose=bool(self.verbose))
            print(f"grace_adam: built {out} ({', '.join(isas)})")
        except b.BuildError as exc:
            # Install anyway; import grace_adam will warn once and use the torch fallback.
            print(f"WARNING: grace_adam native kernel not built ({exc}); "
                  "the pure-torch fallback will be used", file=sys.stderr)


setup(
    ext_modules=[Extension(LIB_EXT, sources=CSRC, optional=True)],
    cmdclass={"build_ext": BuildGraceAdam},
)
