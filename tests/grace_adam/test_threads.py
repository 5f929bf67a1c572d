"""The pool beside a training thread: work balancing, pinning, first-touch placement and the streaming-store
threshold change where and how the kernel runs, never its bits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import grace_adam
from grace_adam import _backend, build, pool
from grace_adam.testing import run_python
from tests.grace_adam.test_exactness import HYPER, clone_all, make_state, requires_native

KW = dict(step=3, weight_decay=0.1, grad_scale=0.5, **HYPER)
LINUX = sys.platform.startswith("linux")
MASK = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]


@pytest.fixture
def pool_restore():
    """Leave the pool as the other tests expect it: unpinned, default threads, min chunk, NT threshold."""
    threads, nt = grace_adam.get_num_threads(), pool.get_nt_threshold()
    yield
    grace_adam.set_affinity(None)
    grace_adam.set_num_threads(threads)
    if _backend.LIB is not None:
        _backend._set_min_chunk(32768)
        pool.set_nt_threshold(nt)


def every_mode(state, g, threads, lowp=torch.bfloat16, offset=0):
    """In-place, deferred (speculative + commit), out-of-place with fused statistics and plain statistics,
    on elements [offset:] (an offset not a multiple of 16 moves the unit boundaries off the allocation's)."""
    p, m, v, vm = (t[offset:] for t in clone_all(state))
    g = g[offset:]
    n = p.numel()
    lo1, lo2, spec = torch.empty(n, dtype=lowp), torch.empty(n, dtype=lowp), torch.empty(n)
    outs = [torch.full((n,), 7.0) for _ in range(4)]
    stats = grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm, commit=False, param_out=outs[0],
                                 exp_avg_out=outs[1], exp_avg_sq_out=outs[2], max_exp_avg_sq_out=outs[3],
                                 lowp_out=lo1, return_stats=True, threads=threads, **KW)
    grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm, commit=False, param_out=spec, threads=threads, **KW)
    grace_adam.adam_step(p, g, m, v, max_exp_avg_sq=vm, lowp_out=lo2, threads=threads, **KW)
    return [p, m, v, vm, lo1, lo2, spec, *outs], [stats, grace_adam.grad_stats(g, 0.5, threads=threads)]


def assert_same(ref, got, what):
    for k, (a, b) in enumerate(zip(ref[0], got[0], strict=True)):
        assert torch.equal(a, b), f"{what}: tensor {k} differs"
    assert ref[1] == got[1], what


@requires_native
@pytest.mark.parametrize("offset", [0, 5])
def test_any_thread_count_even_oversubscribed_gives_the_same_bits(offset, pool_restore):
    """Small min chunk and many threads on this machine's few CPUs: many home ranges, claims of a few
    units, threads that wake late or share a core and leave their ranges to the others."""
    state, g = (lambda p, g, m, v, vm: ([p, m, v, vm], g))(*make_state(5 * 16384 + 37, seed=11))
    _backend._set_min_chunk(64)
    ref = every_mode(state, g, 1, offset=offset)
    for threads in (2, 3, 7, 16):
        assert_same(ref, every_mode(state, g, threads, offset=offset), f"threads={threads}")


@requires_native
def test_many_small_jobs_back_to_back_from_two_threads(pool_restore):
    """Late wake-ups must not touch a finished job: many short jobs, from two Python threads at once."""
    _backend._set_min_chunk(16)
    p, g, m, v, _ = make_state(4099, seed=12)
    ref = clone_all([p, m, v])
    for _ in range(50):
        grace_adam.adam_step(*ref[:1], g, *ref[1:], threads=1, **KW)
    errors: list[str] = []

    def worker() -> None:
        mine = clone_all([p, m, v])
        for _ in range(50):
            grace_adam.adam_step(*mine[:1], g, *mine[1:], threads=8, **KW)
        if not all(torch.equal(a, b) for a, b in zip(ref, mine, strict=True)):
            errors.append("differs")

    ts = [threading.Thread(target=worker) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


@requires_native
def test_streaming_store_threshold_changes_no_bits(pool_restore):
    state, g = (lambda p, g, m, v, vm: ([p, m, v, vm], g))(*make_state(3 * 16384 + 5, seed=13))
    _backend._set_min_chunk(1024)
    pool.set_nt_threshold(1 << 62)  # never stream
    ref = every_mode(state, g, 3)
    pool.set_nt_threshold(0)  # always stream (aligned outputs)
    assert pool.get_nt_threshold() == 0
    assert_same(ref, every_mode(state, g, 3), "streaming stores")
    with pytest.raises(ValueError, match="nbytes"):
        pool.set_nt_threshold(-1)


def _task_cpus() -> list[str]:
    """Cpus_allowed_list of every thread of this process."""
    out = []
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.append(line.split(":", 1)[1].strip())
    return out


@requires_native
@pytest.mark.skipif(not LINUX, reason="pinning is Linux-only")
def test_pinned_pool_runs_on_its_cpus_and_gives_the_same_bits(pool_restore):
    state, g = (lambda p, g, m, v, vm: ([p, m, v, vm], g))(*make_state(4 * 16384 + 3, seed=14))
    _backend._set_min_chunk(256)
    ref = every_mode(state, g, 1)
    cpu = MASK[-1]
    assert grace_adam.set_affinity([cpu]) is True
    assert grace_adam.get_affinity() == [cpu] and grace_adam.get_num_threads() == 1
    for threads in (1, 2, 5):  # 1: a pinned worker steps, the caller waits; 5: five workers on one CPU
        assert_same(ref, every_mode(state, g, threads), f"pinned, threads={threads}")
    assert _task_cpus().count(str(cpu)) >= 5  # the workers; the calling thread keeps its mask
    assert grace_adam.set_affinity(None) is False and grace_adam.get_affinity() is None
    assert_same(ref, every_mode(state, g, 3), "unpinned again")
    assert _task_cpus().count(str(cpu)) == (len(_task_cpus()) if len(MASK) == 1 else 0)


def test_set_affinity_refuses_cpus_outside_the_mask_before_changing_anything(pool_restore):
    with pytest.raises(ValueError, match="not in this process's affinity mask"):
        grace_adam.set_affinity([max(MASK) + 1000])
    with pytest.raises(TypeError, match="ints"):
        grace_adam.set_affinity(["0"])
    assert grace_adam.get_affinity() is None


def test_set_affinity_is_a_clear_no_op_without_pinning(monkeypatch, pool_restore):
    monkeypatch.setattr(pool, "pinning_supported", lambda: False)
    assert grace_adam.set_affinity(MASK[:1]) is False
    assert grace_adam.get_affinity() is None


def test_cpus_beside_training_leaves_the_first_cpus():
    assert grace_adam.cpus_beside_training(cpus=[3, 0, 1, 2]) == [1, 2, 3]
    assert grace_adam.cpus_beside_training(2, cpus=range(4)) == [2, 3]
    assert grace_adam.cpus_beside_training(0, cpus=[5, 6]) == [5, 6]
    assert grace_adam.cpus_beside_training(cpus=[7]) == [7]  # one CPU: share it rather than none
    assert grace_adam.cpus_beside_training() == (MASK[1:] or MASK)
    with pytest.raises(ValueError, match="reserve"):
        grace_adam.cpus_beside_training(-1)


def test_parse_cpu_list():
    assert pool.parse_cpu_list("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    for bad in ("", "a", "3-1", "-2"):
        with pytest.raises(ValueError):
            pool.parse_cpu_list(bad)


def test_configure_for_training_defaults_and_env(monkeypatch, pool_restore):
    monkeypatch.delenv("GRACE_ADAM_CPUS", raising=False)
    cfg = grace_adam.configure_for_training()
    assert cfg.cpus == tuple(MASK[1:] or MASK) and cfg.threads == len(cfg.cpus) == grace_adam.get_num_threads()
    assert cfg.pinned == pool.pinning_supported() and cfg.source == "mask minus 1"
    assert grace_adam.get_affinity() == (list(cfg.cpus) if cfg.pinned else None)
    monkeypatch.setenv("GRACE_ADAM_CPUS", f"{MASK[0]}")
    cfg = grace_adam.configure_for_training(pin=False)
    assert cfg.cpus == (MASK[0],) and cfg.threads == 1 and not cfg.pinned and cfg.source == "GRACE_ADAM_CPUS"


@pytest.mark.skipif(not LINUX, reason="pinning is Linux-only")
def test_grace_adam_cpus_env_pins_at_import_and_names_itself_when_bad():
    code = "import grace_adam; print(grace_adam.get_affinity(), grace_adam.get_num_threads())"
    r = run_python(code, GRACE_ADAM_CPUS=str(MASK[0]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ([f"[{MASK[0]}]", "1"] if grace_adam.native_available() else ["None", "1"])
    r = run_python(code, GRACE_ADAM_CPUS="0-x")
    assert r.returncode != 0 and "GRACE_ADAM_CPUS='0-x'" in r.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.uint8])
@pytest.mark.parametrize("pinned", [False, True])
def test_zeros_first_touch(dtype, pinned, pool_restore):
    if pinned and not pool.pinning_supported():
        pytest.skip("pinning unavailable")
    _backend._set_min_chunk(64)
    if pinned:
        grace_adam.set_affinity(MASK[:1] * 3)  # three workers, each its own home range, no stealing
    for n in (0, 1, 1000, 70_001):
        t = pool.zeros(n, dtype=dtype, threads=3)
        assert t.dtype == dtype and t.shape == (n,) and not t.any()
        if _backend.LIB is not None and n:  # fresh pages read as zero anyway: the fill itself, on used memory
            t = torch.ones(n, dtype=dtype)
            assert _backend.LIB.ga_first_touch(t.data_ptr(), n, t.element_size(), 3) == 0
            assert not t.any()
    with pytest.raises(ValueError, match="threads"):
        pool.zeros(10, threads=0)
    with pytest.raises(ValueError, match="numel"):
        pool.zeros(-1)


SELFTEST = Path(__file__).resolve().parent / "csrc" / "ga_selftest.c"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_selftest_with_streaming_stores_always_on(tmp_path):
    """The default threshold keeps the self-test's small buffers on plain stores; with 0 every aligned
    output of every ISA streams again, and must still equal the scalar path bit for bit."""
    out = tmp_path / "libgrace_adam.so"
    assert build.main(["--out", str(out), "--selftest", str(SELFTEST)]) == 0
    r = subprocess.run([str(tmp_path / "ga_selftest"), "quick"], capture_output=True, text=True, timeout=120,
                       check=False, env={**os.environ, "GRACE_ADAM_NT_THRESHOLD": "0"})
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
