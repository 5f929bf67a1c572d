"""GraceAdam's thread pool beside a training thread: which CPUs it uses, pinning, page placement, stores.

An engine that drives a GPU from one training thread (autograd, kernel launches) and runs GraceAdam on a
host worker thread should leave the training thread a CPU: with the pool on every CPU of the affinity
mask, one pool thread shares a core with the training thread, and both run at about half speed (the
pool's split balances the work, but the training thread still loses its core). The default for that
engine is ``configure_for_training()``: the mask minus one CPU, one pinned pool thread per CPU.

Everything here changes where and how the work runs, never a result: the kernel's output is the same
bits for any thread count, pinning, page placement and store kind (tests/grace_adam/test_threads.py).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from grace_adam import _backend

_ELEM_SIZES = (1, 2, 4, 8)


def _mask() -> list[int]:
    """The CPUs this process may run on (all online CPUs where the OS has no affinity masks)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (taskset / cpuset syntax) -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: use numbers and ranges such as 0-3,8") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r} in {text!r}: use FIRST-LAST with 0 <= FIRST <= LAST")
        cpus.extend(range(first, last + 1))
    if not cpus:
        raise ValueError(f"empty CPU list {text!r}")
    return cpus


def pinning_supported() -> bool:
    """Whether ``set_affinity`` can pin here: the native kernel on Linux."""
    return _backend.LIB is not None and sys.platform.startswith("linux")


def set_affinity(cpus: Iterable[int] | None) -> bool:
    """Pin GraceAdam's pool: worker k runs on ``cpus[k % len(cpus)]`` and the calling thread only waits,
    so each step runs on exactly these CPUs; the default thread count becomes ``len(cpus)``.

    ``None`` (or an empty list) unpins: the workers may run anywhere in the affinity mask again and the
    calling thread takes part in the work again (the thread count is left as it is).

    Returns True when the pool is now pinned to ``cpus``; False where pinning is not available (not Linux,
    or the pure-torch fallback), in which case nothing changed, and False after unpinning. A CPU outside
    this process's affinity mask raises ValueError before anything changes.
    """
    want = [] if cpus is None else list(cpus)
    for c in want:
        if isinstance(c, bool) or not isinstance(c, int):
            raise TypeError(f"CPUs must be ints, got {c!r}")
    allowed = set(_mask())
    outside = sorted(set(want) - allowed)
    if outside:
        raise ValueError(f"CPUs {outside} are not in this process's affinity mask {sorted(allowed)}; "
                         "pick CPUs from the mask (os.sched_getaffinity(0))")
    if not pinning_supported():
        return False
    arr = (ctypes.c_int32 * max(len(want), 1))(*want)
    rc = _backend.LIB.ga_set_affinity(arr, len(want))
    if rc != 0:
        raise RuntimeError(f"ga_set_affinity failed: {_backend.status_name(rc)}")
    return bool(want)


def get_affinity() -> list[int] | None:
    """The CPUs the pool is pinned to, in worker order; None when it is not pinned."""
    if _backend.LIB is None:
        return None
    n = _backend.LIB.ga_get_affinity(None, 0)
    if n == 0:
        return None
    arr = (ctypes.c_int32 * n)()
    _backend.LIB.ga_get_affinity(arr, n)
    return list(arr)


def cpus_beside_training(reserve: int = 1, cpus: Iterable[int] | None = None) -> list[int]:
    """The CPUs for GraceAdam's pool beside ``reserve`` busy threads (the training thread): the affinity
    mask (or ``cpus``) minus its ``reserve`` lowest-numbered CPUs, at least one CPU.

    The training thread itself is not pinned (threads it starts later would inherit the mask): with the
    pool pinned elsewhere, the scheduler finds it the CPU left free. On an SMT machine the reserved CPU's
    sibling still runs a pool thread; reserve the siblings too (``cpus=``) if that matters.
    """
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise ValueError(f"reserve must be an int >= 0, got {reserve!r}")
    mask = sorted(set(_mask() if cpus is None else cpus))
    if not mask:
        raise ValueError("no CPUs to choose from")
    return mask[reserve:] or mask[-1:]


@dataclass(frozen=True)
class PoolConfig:
    """What ``configure_for_training`` set: the pool's CPUs, thread count and whether it is pinned."""

    cpus: tuple[int, ...]
    threads: int
    pinned: bool
    source: str  # "GRACE_ADAM_CPUS" or "mask minus N"


def configure_for_training(reserve: int = 1, pin: bool = True) -> PoolConfig:
    """The pool setup for an engine that drives a GPU from one training thread; call it once, before the
    first step. CPUs: ``GRACE_ADAM_CPUS`` when set, else ``cpus_beside_training(reserve)`` (the mask minus
    the training thread's CPU). Threads: one per CPU. Pinned to them when ``pin`` and the platform allows
    (``set_affinity``); unpinned, only the thread count is set.
    """
    env = os.environ.get("GRACE_ADAM_CPUS", "").strip()
    cpus = parse_cpu_list(env) if env else cpus_beside_training(reserve)
    source = "GRACE_ADAM_CPUS" if env else f"mask minus {reserve}"
    pinned = set_affinity(cpus) if pin else False
    _backend.set_num_threads(len(cpus))
    return PoolConfig(cpus=tuple(cpus), threads=len(cpus), pinned=pinned, source=source)


def set_nt_threshold(nbytes: int) -> None:
    """Streaming stores only for passes that move at least ``nbytes`` (reads + writes); 0 = always.
    Default: the last-level cache size, or ``GRACE_ADAM_NT_THRESHOLD``. No effect on values."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
    if _backend.LIB is not None:
        _backend.LIB.ga_set_nt_threshold(nbytes)


def get_nt_threshold() -> int | None:
    """The streaming-store threshold in bytes (None for the pure-torch fallback, which has no such stores)."""
    return None if _backend.LIB is None else int(_backend.LIB.ga_get_nt_threshold())


def zeros(numel: int, dtype: torch.dtype = torch.float32, threads: int | None = None) -> torch.Tensor:
    """A zero-filled flat CPU tensor whose pages are first written by the pool's threads, each in the
    range an Adam pass over ``numel`` elements with the same ``threads`` gives it first: on a NUMA host
    the pages land on the node of the thread that will step them. Pin the pool first (``set_affinity``):
    an unpinned thread may run on another node by the time it steps. Only fresh memory is placed this
    way: an allocation the C library serves from memory used before keeps the pages where they are
    (large ones, above glibc's mmap threshold of at most 32 MiB, are always fresh).
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be an int >= 0, got {numel!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    nthreads = threads or 0  # 0: the pool's default, as adam_step(threads=None)
    t = torch.empty(numel, dtype=dtype)
    if _backend.LIB is None or t.element_size() not in _ELEM_SIZES:
        return t.zero_()
    rc = _backend.LIB.ga_first_touch(t.data_ptr() if numel else None, numel, t.element_size(), nthreads)
    if rc != 0:
        raise RuntimeError(f"ga_first_touch failed: {_backend.status_name(rc)}")
    return t


def _apply_cpus_env() -> None:
    """GRACE_ADAM_CPUS at import: pin the pool (a bad list raises, naming the variable)."""
    env = os.environ.get("GRACE_ADAM_CPUS", "").strip()
    if not env:
        return
    try:
        set_affinity(parse_cpu_list(env))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"GRACE_ADAM_CPUS={env!r}: {exc}") from None
    if not pinning_supported():
        _backend.set_num_threads(len(parse_cpu_list(env)))


_apply_cpus_env()
