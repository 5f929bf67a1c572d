"""Loads ``libgrace_adam.so`` with ctypes (a CDLL call releases the GIL for its duration).

Environment:
  GRACE_ADAM_NATIVE=0        use the pure-torch fallback even if the library is there
  GRACE_ADAM_LIB=PATH        load the library from PATH instead of grace_adam/_lib/
  GRACE_ADAM_ISA=NAME        force scalar|avx2|avx512|neon|sve (import fails if this CPU/build lacks it)
  GRACE_ADAM_NUM_THREADS=N   default thread count (else: the CPUs in this process's affinity mask)
  GRACE_ADAM_CPUS=LIST       pin the pool to these CPUs at import, e.g. 1-15 or 2,3,8-11 (grace_adam.pool)
  GRACE_ADAM_NT_THRESHOLD=B  bytes a pass moves before it uses streaming stores (default: the LLC size)
  GRACE_ADAM_LAZY_BUILD=1    if the library is missing, build it in place at import (development)
  GRACE_ADAM_PREFETCH=N      software prefetch distance in elements of the x86 passes (default 512; 0: none)
  GRACE_ADAM_DIV=divide      always use the divide instruction for sqrt(v) / sqrt(1 - beta2^t), never the
                             reciprocal (same bits either way; for A/B measurements, docs/grace_adam.md)
"""

from __future__ import annotations

import ctypes
import os
import warnings
from pathlib import Path

ABI_VERSION = 5  # GA_ABI_VERSION in csrc/grace_adam.h
DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_NONE = 0, 1, 2, 3
LIB_PATH = Path(__file__).resolve().parent / "_lib" / "libgrace_adam.so"


class AdamArgs(ctypes.Structure):
    """Mirror of ``ga_adam_args`` in csrc/grace_adam.h (keep the field order in sync)."""

    _fields_ = [
        ("param", ctypes.c_void_p),
        ("grad", ctypes.c_void_p),
        ("exp_avg", ctypes.c_void_p),
        ("exp_avg_sq", ctypes.c_void_p),
        ("max_exp_avg_sq", ctypes.c_void_p),
        ("param_out", ctypes.c_void_p),
        ("lowp_out", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("grad_dtype", ctypes.c_int32),
        ("lowp_dtype", ctypes.c_int32),
        ("commit", ctypes.c_int32),
        ("decoupled", ctypes.c_int32),
        ("l2", ctypes.c_int32),
        ("lerp_hi", ctypes.c_int32),
        ("grad_scale", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("decay", ctypes.c_float),
        ("lerp_c", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("one_minus_beta2", ctypes.c_float),
        ("step_size", ctypes.c_float),
        ("bias_correction2_sqrt", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("exp_avg_out", ctypes.c_void_p),
        ("exp_avg_sq_out", ctypes.c_void_p),
        ("max_exp_avg_sq_out", ctypes.c_void_p),
    ]


def _declare(lib: ctypes.CDLL) -> None:
    i32, i64, f32, vp = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    sigs = {
        "ga_sizeof_adam_args": (ctypes.c_size_t, []),
        "ga_status_name": (ctypes.c_char_p, [i32]),
        "ga_adam_step": (i32, [ctypes.POINTER(AdamArgs), i32]),
        "ga_adam_step_stats": (i32, [ctypes.POINTER(AdamArgs), i32, ctypes.POINTER(ctypes.c_double),
                                     ctypes.POINTER(ctypes.c_int32)]),
        "ga_grad_stats": (i32, [vp, ctypes.c_int32, i64, f32, i32, ctypes.POINTER(ctypes.c_double),
                                ctypes.POINTER(ctypes.c_int32)]),
        "ga_stream7": (i32, [vp, vp, vp, vp, i64, i32]),
        "ga_set_num_threads": (i32, [i32]),
        "ga_get_num_threads": (i32, []),
        "ga_set_min_chunk": (i32, [i64]),
        "ga_set_affinity": (i32, [ctypes.POINTER(ctypes.c_int32), i32]),
        "ga_get_affinity": (i32, [ctypes.POINTER(ctypes.c_int32), i32]),
        "ga_first_touch": (i32, [vp, i64, ctypes.c_int32, i32]),
        "ga_set_nt_threshold": (i32, [i64]),
        "ga_get_nt_threshold": (i64, []),
        "ga_set_isa": (i32, [i32]),
        "ga_get_isa": (i32, []),
        "ga_supported_isas": (ctypes.c_uint, []),
        "ga_compiled_isas": (ctypes.c_uint, []),
        "ga_isa_name": (ctypes.c_char_p, [i32]),
        "ga_set_div_by_recip": (i32, [i32]),
        "ga_set_prefetch": (i32, [i64]),
        "ga_get_prefetch": (i64, []),
        "ga_divisor_recip": (f32, [f32]),
        "ga_divisor_check": (i64, [i32, f32, f32, i32, i32]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def _check_abi(lib: ctypes.CDLL, path: Path) -> str:
    """Why ``lib`` cannot be used with this binding ("" if it can): ABI version, then struct layout."""
    lib.ga_abi_version.restype, lib.ga_abi_version.argtypes = ctypes.c_int, []
    if lib.ga_abi_version() != ABI_VERSION:
        return f"{path} has ABI {lib.ga_abi_version()}, expected {ABI_VERSION}; rebuild it"
    _declare(lib)
    c_size, py_size = lib.ga_sizeof_adam_args(), ctypes.sizeof(AdamArgs)
    if c_size != py_size:
        return (f"ga_adam_args is {c_size} bytes in {path} but the Python mirror AdamArgs is {py_size}: "
                "grace_adam/_backend.py and csrc/grace_adam.h are out of step (same field order and types)")
    return ""


def _isa_names(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The library's ISA names, indexed by ``enum ga_isa`` (the C table is the only copy)."""
    names: list[str] = []
    while (name := lib.ga_isa_name(len(names)).decode()) != "unknown":
        names.append(name)
    return tuple(names)


def status_name(rc: int) -> str:
    """Name and meaning of a ``ga_status`` code returned by the library."""
    if LIB is None:
        return f"status {rc}"
    return f"{LIB.ga_status_name(rc).decode()}, status {rc}"


def _load() -> tuple[ctypes.CDLL | None, str]:
    """Returns (library or None, reason it is None)."""
    if os.environ.get("GRACE_ADAM_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None, "disabled by GRACE_ADAM_NATIVE=0"
    path = Path(os.environ.get("GRACE_ADAM_LIB") or LIB_PATH)
    lazy = os.environ.get("GRACE_ADAM_LAZY_BUILD") == "1" and "GRACE_ADAM_LIB" not in os.environ
    if not path.exists() and lazy:
        from grace_adam.build import BuildError, build_library

        try:
            build_library(path)
        except BuildError as exc:
            return None, f"lazy build failed: {exc}"
    if not path.exists():
        return None, (f"{path} was not built (no C compiler at install time?); "
                      "build it with `python -m grace_adam.build`")
    try:
        lib = ctypes.CDLL(str(path))
        reason = _check_abi(lib, path)
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {path}: {exc}"
    return (None, reason) if reason else (lib, "")


LIB, UNAVAILABLE_REASON = _load()
ISA_NAMES: tuple[str, ...] = _isa_names(LIB) if LIB is not None else ()

if LIB is None and not UNAVAILABLE_REASON.startswith("disabled"):
    warnings.warn(
        f"grace_adam: native kernel unavailable ({UNAVAILABLE_REASON}); using the slower pure-torch "
        "fallback, which has the same API and results.",
        RuntimeWarning,
        stacklevel=2,
    )

_fallback_threads: int | None = None


def _apply_isa_env() -> None:
    want = os.environ.get("GRACE_ADAM_ISA", "").strip()
    if not want:
        return
    if LIB is None:
        raise RuntimeError(f"GRACE_ADAM_ISA={want!r} requested but the native kernel is unavailable "
                           f"({UNAVAILABLE_REASON})")
    _force_isa(want)


def native_available() -> bool:
    """True when the compiled kernel is loaded (False: pure-torch fallback)."""
    return LIB is not None


def available_isas() -> list[str]:
    """ISA paths both compiled into the library and supported by this CPU (empty for the fallback)."""
    if LIB is None:
        return []
    mask = LIB.ga_supported_isas()
    return [name for i, name in enumerate(ISA_NAMES) if mask & (1 << i)]


def isa() -> str:
    """Name of the active path: one of ``available_isas()``, or ``"torch"`` for the fallback."""
    if LIB is None:
        return "torch"
    return ISA_NAMES[LIB.ga_get_isa()]


def _force_isa(name: str) -> None:
    """Select an ISA path in this process (tests, benchmarks). Raises if it is not available."""
    if LIB is None:
        raise RuntimeError(f"native kernel unavailable ({UNAVAILABLE_REASON})")
    idx = ISA_NAMES.index(name) if name in ISA_NAMES else -1
    if idx < 0 or LIB.ga_set_isa(idx) != 0:
        raise RuntimeError(f"grace_adam ISA {name!r} is not supported here; available: {available_isas()}")


def _set_min_chunk(n: int) -> None:
    """Minimum elements per thread (tests lower it so small arrays are split across threads)."""
    if LIB is not None and LIB.ga_set_min_chunk(int(n)) != 0:
        raise ValueError(f"min chunk must be >= 1, got {n}")


def _set_div_by_recip(on: bool) -> None:
    """Whether the SIMD paths may divide by sqrt(1 - beta2^t) through its reciprocal where that is proven
    exact (the default); False: always the divide instruction. Same bits either way (A/B measurements)."""
    if LIB is not None:
        LIB.ga_set_div_by_recip(1 if on else 0)


def divisor_recip(c: float) -> float:
    """The reciprocal the current ISA path divides by ``c`` through (0.0: it divides; always 0.0 on the
    scalar path and the torch fallback)."""
    return 0.0 if LIB is None else float(LIB.ga_divisor_recip(c))


def get_prefetch() -> int:
    """The x86 passes' software prefetch distance in elements (0: none, and on every other path)."""
    return 0 if LIB is None else int(LIB.ga_get_prefetch())


def set_prefetch(elements: int) -> None:
    """Set the x86 passes' software prefetch distance (A/B measurements; values are the same)."""
    if LIB is not None and LIB.ga_set_prefetch(int(elements)) != 0:
        raise ValueError(f"prefetch distance must be >= 0 elements, got {elements!r}")


def division_mode() -> str:
    """How this process's passes divide by sqrt(1 - beta2^t): "reciprocal" (the SIMD paths, where proven
    exact) or "divide" (the scalar path, the torch fallback, or GRACE_ADAM_DIV=divide). Same bits either way."""
    return "reciprocal" if divisor_recip(0.5**0.5) != 0.0 else "divide"


def divisor_check(c: float, r: float, *, exhaustive: bool = False, isa_name: str | None = None,
                  threads: int = 0) -> int:
    """How many inputs x in [1, 2) the ISA path's division by ``c`` through ``r`` gets wrong: all 2^23 of
    them (``exhaustive``) or those near a rounding midpoint, which decide it (docs/grace_adam.md)."""
    if LIB is None:
        raise RuntimeError(f"native kernel unavailable ({UNAVAILABLE_REASON})")
    name = isa_name or isa()
    if name not in ISA_NAMES:
        raise ValueError(f"unknown ISA {name!r}; available: {available_isas()}")
    rc = int(LIB.ga_divisor_check(ISA_NAMES.index(name), c, r, int(exhaustive), threads))
    if rc < 0:
        raise ValueError(f"divisor_check({c!r}, {r!r}) on {name}: {status_name(rc)}")
    return rc


def set_num_threads(n: int) -> None:
    """Default thread count of the kernel's persistent pool (independent of torch.set_num_threads)."""
    global _fallback_threads
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a positive int, got {n!r}")
    if LIB is None:
        _fallback_threads = n
    elif LIB.ga_set_num_threads(n) != 0:
        raise ValueError(f"threads out of range: {n}")


def get_num_threads() -> int:
    if LIB is None:
        return _fallback_threads or os.cpu_count() or 1
    return int(LIB.ga_get_num_threads())


_apply_isa_env()
