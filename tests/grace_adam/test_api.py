"""API surface: validation errors, threads, ISA selection, GIL release, the torch fallback."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import grace_adam
from grace_adam import _backend
from grace_adam.testing import run_python

requires_native = pytest.mark.skipif(not grace_adam.native_available(),
                                     reason=f"native kernel unavailable: {_backend.UNAVAILABLE_REASON}")
HYPER = dict(step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)


def tensors(n=16):
    return torch.zeros(n), torch.ones(n), torch.zeros(n), torch.zeros(n)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda t: t.__setitem__(0, t[0].double()), TypeError, "param must have dtype torch.float32"),
    (lambda t: t.__setitem__(1, t[1].to(torch.int32)), TypeError, "grad must have dtype"),
    (lambda t: t.__setitem__(2, torch.zeros(15)), ValueError, "exp_avg has 15 elements"),
    (lambda t: t.__setitem__(3, torch.zeros(32)[::2]), ValueError, "exp_avg_sq must be contiguous"),
    (lambda t: t.__setitem__(0, [1.0] * 16), TypeError, "param must be a torch.Tensor"),
])
def test_validation_errors(mutate, exc, match):
    t = list(tensors())
    mutate(t)
    with pytest.raises(exc, match=match):
        grace_adam.adam_step(*t, **HYPER)


def test_hyperparameter_and_mode_errors():
    p, g, m, v = tensors()
    with pytest.raises(ValueError, match="step must be"):
        grace_adam.adam_step(p, g, m, v, **{**HYPER, "step": 0})
    with pytest.raises(ValueError, match="betas"):
        grace_adam.adam_step(p, g, m, v, **{**HYPER, "beta1": 1.0})
    with pytest.raises(ValueError, match="commit=False"):
        grace_adam.adam_step(p, g, m, v, commit=False, **HYPER)
    with pytest.raises(ValueError, match="overlaps"):
        grace_adam.adam_step(p, g, m, v, commit=False, param_out=m, **HYPER)
    with pytest.raises(TypeError, match="lowp_out must have dtype"):
        grace_adam.adam_step(p, g, m, v, lowp_out=torch.zeros(16), **HYPER)
    with pytest.raises(ValueError, match="threads"):
        grace_adam.adam_step(p, g, m, v, threads=0, **HYPER)
    if torch.backends.mps.is_available() or torch.cuda.is_available():
        with pytest.raises(ValueError, match="must be on the CPU"):
            grace_adam.adam_step(p.to("cuda"), g, m, v, **HYPER)


def test_param_out_may_alias_param_when_committing():
    p, g, m, v = tensors()
    grace_adam.adam_step(p, g, m, v, param_out=p, **HYPER)
    assert torch.all(p < 0)


def test_empty_bucket_is_a_no_op():
    e = torch.zeros(0)
    grace_adam.adam_step(e, e, e, e, **HYPER)
    assert grace_adam.grad_stats(e) == (0.0, True)


def test_threads_and_isa_queries():
    before = grace_adam.get_num_threads()
    try:
        grace_adam.set_num_threads(3)
        assert grace_adam.get_num_threads() == 3
    finally:
        grace_adam.set_num_threads(before)
    with pytest.raises(ValueError):
        grace_adam.set_num_threads(0)
    if grace_adam.native_available():
        assert grace_adam.isa() in grace_adam.available_isas()
        assert "scalar" in grace_adam.available_isas()
    else:
        assert grace_adam.isa() == "torch"


@requires_native
def test_isa_env_var_forces_path_and_rejects_unknown():
    for name in grace_adam.available_isas():
        r = run_python("import grace_adam; print(grace_adam.isa())", GRACE_ADAM_ISA=name)
        assert r.returncode == 0 and r.stdout.strip() == name, r.stderr
    r = run_python("import grace_adam", GRACE_ADAM_ISA="bogus")
    assert r.returncode != 0 and "not supported here" in r.stderr


def test_fallback_env_var_same_api_and_results():
    code = """
import os, torch, grace_adam
if os.environ.get("GRACE_ADAM_NATIVE") == "0":
    assert not grace_adam.native_available() and grace_adam.isa() == 'torch'
    assert grace_adam.available_isas() == []
gen = torch.Generator().manual_seed(0)
p, m, v = torch.randn(5000, generator=gen), torch.zeros(5000), torch.zeros(5000)
g = torch.randn(5000, generator=gen).to(torch.bfloat16)
lo = torch.empty(5000, dtype=torch.bfloat16)
grace_adam.adam_step(p, g, m, v, step=3, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                     lowp_out=lo)
n2, fin = grace_adam.grad_stats(g, 0.5)
grace_adam.set_num_threads(2)
print(p.view(torch.int32).sum().item(), m.view(torch.int32).sum().item(), lo.view(torch.int16).sum().item(),
      n2.hex(), fin, grace_adam.get_num_threads())
"""
    fb = run_python(code, GRACE_ADAM_NATIVE="0")
    assert fb.returncode == 0, fb.stderr
    assert "native kernel unavailable" not in fb.stderr  # explicitly disabled: no warning
    if grace_adam.native_available():
        nat = run_python(code)
        nat_line = nat.stdout.strip()
        assert nat.returncode == 0 and nat_line, nat.stderr
        # the native result must equal the fallback's bit for bit (checksums of the raw bits)
        assert nat_line.split()[:-1] == fb.stdout.strip().split()[:-1]


def test_missing_library_warns_once_and_falls_back(tmp_path):
    code = """
import warnings
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    import grace_adam
    import grace_adam.functional
print(grace_adam.native_available(), sum('native kernel unavailable' in str(x.message) for x in w))
"""
    r = run_python(code, GRACE_ADAM_LIB=str(tmp_path / "missing.so"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "1"]


@requires_native
def test_kernel_releases_the_gil():
    n = 1 << 24
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    ticks = 0
    running = threading.Event()
    done = threading.Event()

    def spin() -> None:
        nonlocal ticks
        running.set()
        while not done.is_set():
            ticks += 1  # pure-Python work: advances only while the GIL is free

    t = threading.Thread(target=spin)
    t.start()
    running.wait()
    time.sleep(0.01)
    start = ticks
    t0 = time.perf_counter()
    for k in range(1, 6):
        grace_adam.adam_step(p, g, m, v, step=k, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, threads=1)
    elapsed = time.perf_counter() - t0
    during = ticks - start
    done.set()
    t.join()
    # With the GIL held for ~`elapsed` seconds the spinner could only run at the switch interval edges.
    assert elapsed > 0.02
    assert during > 1000, f"second thread made no progress during the kernel ({during} ticks)"


@requires_native
def test_c_status_codes_are_named_in_errors():
    assert _backend.status_name(-1) == "GA_EINVAL (invalid argument), status -1"
    assert _backend.status_name(-2).startswith("GA_EUNSUPPORTED")
    assert _backend.status_name(-99) == "unknown status, status -99"
    bad = _backend.AdamArgs(n=-1)  # the C side refuses it; Python never sends it
    assert _backend.status_name(_backend.LIB.ga_adam_step(bad, 1)).startswith("GA_EINVAL")


@requires_native
def test_isa_names_come_from_the_library():
    lib = _backend.LIB
    assert tuple(lib.ga_isa_name(i).decode() for i in range(len(_backend.ISA_NAMES))) == _backend.ISA_NAMES
    assert _backend.ISA_NAMES[:1] == ("scalar",) and lib.ga_isa_name(len(_backend.ISA_NAMES)) == b"unknown"
    assert grace_adam.isa() in _backend.ISA_NAMES


@requires_native
def test_struct_layout_checked_against_the_library(monkeypatch):
    import ctypes
    from pathlib import Path

    path = Path(_backend.LIB._name)
    assert _backend._check_abi(ctypes.CDLL(str(path)), path) == ""

    class Grown(ctypes.Structure):  # a mirror with one field the C struct does not have
        _fields_ = [*_backend.AdamArgs._fields_, ("extra", ctypes.c_int64)]

    monkeypatch.setattr(_backend, "AdamArgs", Grown)
    reason = _backend._check_abi(ctypes.CDLL(str(path)), path)
    c_size = _backend.LIB.ga_sizeof_adam_args()
    assert f"ga_adam_args is {c_size} bytes" in reason and f"AdamArgs is {c_size + 8}" in reason
    assert "out of step" in reason


@requires_native
def test_prefetch_distance_changes_no_bits():
    """GRACE_ADAM_PREFETCH / set_prefetch is a tuning knob: the x86 passes' results are the same bits at any
    distance (and none); a negative distance is refused."""
    before = _backend.get_prefetch()
    outs = []
    try:
        for distance in (0, 64, 512, 4096):
            _backend.set_prefetch(distance)
            assert _backend.get_prefetch() == distance
            gen = torch.Generator().manual_seed(5)
            p, g, m, v = (torch.randn(300_007, generator=gen) for _ in range(4))
            v = v.abs()
            low = torch.empty_like(p, dtype=torch.bfloat16)
            grace_adam.adam_step(p, g, m, v, step=4, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, lowp_out=low)
            outs.append((p, m, v, low))
        with pytest.raises(ValueError, match=">= 0"):
            _backend.set_prefetch(-1)
    finally:
        _backend.set_prefetch(before)
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other, strict=True))
