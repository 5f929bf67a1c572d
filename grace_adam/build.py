"""Build ``libgrace_adam.so`` with the system C compiler (stdlib only: setup.py loads this file directly).

Usage (development, in place)::

    python grace_adam/build.py            # or: python -m grace_adam.build
    python grace_adam/build.py --cc aarch64-linux-gnu-gcc --arch aarch64 --out /tmp/libgrace_adam.so
    python grace_adam/build.py --out /tmp/lib/libgrace_adam.so --selftest tests/grace_adam/csrc/ga_selftest.c

Each ISA file is compiled with its own ``-m`` flags (ggml-cpu style) so the baseline files stay runnable
on any CPU of the architecture; the runtime dispatcher picks a path with cpuid / getauxval. An ISA file
that the compiler cannot build is left out (the others still work); a failure of the scalar core raises.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
DEFAULT_OUT = Path(__file__).resolve().parent / "_lib" / "libgrace_adam.so"

# -ffp-contract=off is the exactness contract: GCC's default (=fast) may fuse mul+add, even across
# intrinsics, differently in each file; every path must round every operation separately.
COMMON_FLAGS = [
    "-std=c11", "-O3", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno",
    "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter",
]


@dataclass(frozen=True)
class IsaSource:
    name: str
    source: str
    flags: tuple[str, ...]
    define: str


X86_ISAS = (
    IsaSource("avx2", "ga_avx2.c", ("-mavx2", "-mfma", "-mf16c"), "GA_HAVE_AVX2"),
    IsaSource("avx512", "ga_avx512.c",
              ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"), "GA_HAVE_AVX512"),
)
ARM_ISAS = (
    IsaSource("neon", "ga_neon.c", ("-march=armv8-a",), "GA_HAVE_NEON"),
    IsaSource("sve", "ga_sve.c", ("-march=armv8.2-a+sve",), "GA_HAVE_SVE"),
)


class BuildError(RuntimeError):
    """The compiler is missing or the core of the library failed to build."""


def default_cc() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def normalize_arch(machine: str) -> str:
    m = machine.lower()
    if m in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return m


def isa_sources(arch: str) -> tuple[IsaSource, ...]:
    if arch == "x86_64":
        return X86_ISAS
    if arch == "aarch64":
        return ARM_ISAS
    return ()


def _run(cmd: list[str], verbose: bool) -> tuple[bool, str]:
    if verbose:
        print(" ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:  # compiler not found
        return False, str(exc)
    out = (proc.stdout + proc.stderr).strip()
    if verbose and out:
        print(out, file=sys.stderr)
    return proc.returncode == 0, out


def build_library(out: str | os.PathLike[str] = DEFAULT_OUT, cc: list[str] | None = None,
                  arch: str | None = None, extra_cflags: list[str] | None = None,
                  verbose: bool = False) -> list[str]:
    """Compile and link the library to ``out`` (atomically). Returns the names of the compiled ISAs."""
    cc = cc or default_cc()
    arch = normalize_arch(arch or platform.machine())
    extra = list(extra_cflags or [])
    if shutil.which(cc[0]) is None:
        raise BuildError(f"C compiler {cc[0]!r} not found (set CC)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiled = ["scalar"]
    defines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="grace_adam_build_") as tmp:
        objs: list[str] = []
        for isa in isa_sources(arch):
            if isa.name == "sve" and "neon" not in compiled:
                continue  # the SVE file links against the NEON statistics kernel
            obj = os.path.join(tmp, isa.source + ".o")
            ok, msg = _run([*cc, *COMMON_FLAGS, *extra, *isa.flags, "-c", str(CSRC / isa.source), "-o", obj],
                           verbose)
            if ok:
                objs.append(obj)
                compiled.append(isa.name)
                defines.append(f"-D{isa.define}=1")
            else:
                print(f"grace_adam: skipping the {isa.name} path, the compiler failed:\n{msg}",
                      file=sys.stderr)
        for src in ("ga_scalar.c", "ga_pool.c", "ga_core.c"):
            obj = os.path.join(tmp, src + ".o")
            ok, msg = _run([*cc, *COMMON_FLAGS, *extra, *defines, "-c", str(CSRC / src), "-o", obj], verbose)
            if not ok:
                raise BuildError(f"compiling {src} failed:\n{msg}")
            objs.append(obj)
        tmp_out = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        ok, msg = _run([*cc, "-shared", "-pthread", "-o", str(tmp_out), *objs, "-lm"], verbose)
        if not ok:
            raise BuildError(f"linking failed:\n{msg}")
        # Atomic: a process that is loading the library never sees a half-written file.
        os.replace(tmp_out, out)
    return compiled


def build_selftest(source: str | os.PathLike[str], lib: str | os.PathLike[str], out: str | os.PathLike[str],
                   cc: list[str] | None = None, verbose: bool = False) -> Path:
    """Compile a C test program (``source``) against the built library ``lib`` (``libgrace_adam.so``),
    with an rpath to its folder so the program runs from anywhere. Returns the executable's path."""
    cc = cc or default_cc()
    lib, out = Path(lib).resolve(), Path(out)
    if lib.name != "libgrace_adam.so":
        raise BuildError(f"the self-test links with -lgrace_adam: {lib} must be named libgrace_adam.so")
    ok, msg = _run([*cc, "-O2", "-std=c11", "-Wall", f"-I{CSRC}", str(source), "-o", str(out),
                    f"-L{lib.parent}", "-lgrace_adam", f"-Wl,-rpath,{lib.parent}", "-lm"], verbose)
    if not ok:
        raise BuildError(f"compiling the self-test {source} failed:\n{msg}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output path of the shared library")
    ap.add_argument("--cc", default=None, help="C compiler command (default: $CC, Python's CC, or cc)")
    ap.add_argument("--arch", default=None, help="target architecture (x86_64 / aarch64); default: this host")
    ap.add_argument("--cflags", default="", help="extra compiler flags")
    ap.add_argument("--selftest", metavar="SRC", default=None,
                    help="also compile this C self-test against the library, to ga_selftest beside --out")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    cc = shlex.split(args.cc) if args.cc else None
    try:
        isas = build_library(args.out, cc, args.arch, shlex.split(args.cflags), args.verbose)
        print(f"built {args.out} with ISA paths: {', '.join(isas)}")
        if args.selftest:
            exe = build_selftest(args.selftest, args.out, Path(args.out).with_name("ga_selftest"), cc, args.verbose)
            print(f"built {exe}")
    except BuildError as exc:
        print(f"grace_adam: build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
