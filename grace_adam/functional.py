"""Functional API: one fused Adam pass per flat bucket, and one-pass gradient statistics.

Tensors are passed to the native kernel as ``data_ptr()`` + ``numel``; everything is validated here first
so the C side never sees a wrong dtype, device, layout or size.
"""

from __future__ import annotations

import ctypes

import torch

from grace_adam import _backend, _fallback
from grace_adam._hyper import adam_consts, f32

_GRAD_DTYPES = {torch.float32: _backend.DTYPE_F32, torch.bfloat16: _backend.DTYPE_BF16,
                torch.float16: _backend.DTYPE_F16}
_LOWP_DTYPES = {torch.bfloat16: _backend.DTYPE_BF16, torch.float16: _backend.DTYPE_F16}
STATS_BLOCK = 16384  # GA_STATS_BLOCK in csrc/grace_adam.h


def _check(name: str, t: object, dtypes: tuple[torch.dtype, ...], numel: int | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got device {t.device}")
    if t.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (flat bucket); call .contiguous() first")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements, expected {numel} (same as param)")
    return t


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _threads_arg(threads: int | None) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    return threads


def _check_outputs(n: int, state: list[torch.Tensor], commit: bool, param_out: torch.Tensor | None,
                   lowp_out: torch.Tensor | None, exp_avg_out: torch.Tensor | None,
                   exp_avg_sq_out: torch.Tensor | None, max_exp_avg_sq_out: torch.Tensor | None) -> bool:
    """adam_step's output buffers: dtypes and sizes, a whole new state for the out-of-place step, and no
    overlap with an input (``state``: param, grad, exp_avg, exp_avg_sq[, max_exp_avg_sq]) or with each other.
    Returns whether the step is out of place."""
    amsgrad = len(state) == 5
    outs: list[tuple[str, torch.Tensor]] = []
    if param_out is not None:
        outs.append(("param_out", _check("param_out", param_out, (torch.float32,), n)))
    if lowp_out is not None:
        outs.append(("lowp_out", _check("lowp_out", lowp_out, tuple(_LOWP_DTYPES), n)))
    state_outs = [("exp_avg_out", exp_avg_out), ("exp_avg_sq_out", exp_avg_sq_out),
                  ("max_exp_avg_sq_out", max_exp_avg_sq_out)]
    given = [name for name, t in state_outs if t is not None]
    if given:
        if commit:
            raise ValueError(f"{', '.join(given)} are for the out-of-place step: pass commit=False (commit=True "
                             "updates exp_avg/exp_avg_sq in place)")
        need = ["param_out", "exp_avg_out", "exp_avg_sq_out"] + (["max_exp_avg_sq_out"] if amsgrad else [])
        have = set(given) | ({"param_out"} if param_out is not None else set())
        if set(need) != have:
            missing, extra = sorted(set(need) - have), sorted(have - set(need))
            raise ValueError("the out-of-place step writes the whole new state: pass exactly "
                             f"{', '.join(need)} (missing: {missing or 'none'}; not expected: {extra or 'none'})")
        outs += [(name, _check(name, t, (torch.float32,), n)) for name, t in state_outs if t is not None]
    if not commit and not outs:
        raise ValueError("commit=False writes only param_out / lowp_out: pass at least one of them")
    for oname, out in outs:
        for s in state:
            # The one harmless alias: writing the new param over param itself when committing.
            if out is state[0] and commit and s is state[0]:
                continue
            if n and _overlaps(out, s):
                raise ValueError(f"{oname} overlaps an input tensor; it must be a separate buffer")
    for k, (aname, a) in enumerate(outs):
        for bname, b in outs[k + 1:]:
            if n and _overlaps(a, b):
                raise ValueError(f"{aname} and {bname} overlap")
    return bool(given)


def adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
              step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0,
              adamw: bool = True, bias_correction: bool = True, grad_scale: float = 1.0,
              max_exp_avg_sq: torch.Tensor | None = None, commit: bool = True,
              param_out: torch.Tensor | None = None, lowp_out: torch.Tensor | None = None,
              exp_avg_out: torch.Tensor | None = None, exp_avg_sq_out: torch.Tensor | None = None,
              max_exp_avg_sq_out: torch.Tensor | None = None, return_stats: bool = False,
              threads: int | None = None) -> tuple[float, bool] | None:
    """One fused Adam/AdamW step over a flat bucket, in one pass over memory.

    param, exp_avg, exp_avg_sq (and max_exp_avg_sq, which turns on AMSGrad) are fp32; grad is fp32, bf16
    or fp16 and is used as ``g = float32(grad) * float32(grad_scale)`` (a single fp32 multiply; the caller
    folds 1/loss_scale and the clip factor into grad_scale). ``step`` is the 1-based count after increment.

    commit=True updates param/exp_avg/exp_avg_sq(/max_exp_avg_sq) in place. commit=False (speculative)
    writes only param_out (fp32) and/or lowp_out (bf16/fp16, round-to-nearest-even), bit-identical to
    what a later commit=True call on the same inputs produces. commit=False with exp_avg_out and
    exp_avg_sq_out (and max_exp_avg_sq_out under AMSGrad) and param_out is an out-of-place step: the whole
    new state goes to those buffers and the inputs stay untouched (double-buffered state: committing is
    swapping the buffers, rolling back is keeping the old ones). The result of every element is identical
    for any thread count, ISA path, split of the bucket into sub-slices and in-place vs out-of-place.

    return_stats=True also returns ``grad_stats(grad, grad_scale)`` (bit-identical to it), computed in the
    same pass: each 16384-element block is reduced and stepped while it is in cache.
    """
    n = _check("param", param, (torch.float32,), None).numel()
    _check("grad", grad, tuple(_GRAD_DTYPES), n)
    _check("exp_avg", exp_avg, (torch.float32,), n)
    _check("exp_avg_sq", exp_avg_sq, (torch.float32,), n)
    state = [param, grad, exp_avg, exp_avg_sq]
    if max_exp_avg_sq is not None:
        state.append(_check("max_exp_avg_sq", max_exp_avg_sq, (torch.float32,), n))
    out_of_place = _check_outputs(n, state, commit, param_out, lowp_out, exp_avg_out, exp_avg_sq_out,
                                  max_exp_avg_sq_out)
    nthreads = _threads_arg(threads)
    c = adam_consts(step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                    adamw=adamw, bias_correction=bias_correction, grad_scale=grad_scale)
    if n == 0:
        return (0.0, True) if return_stats else None
    lib = _backend.LIB
    if lib is None:
        stats = _fallback.grad_stats(grad, c.grad_scale, STATS_BLOCK) if return_stats else None
        _fallback.adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, c, commit, param_out, lowp_out,
                            (exp_avg_out, exp_avg_sq_out, max_exp_avg_sq_out) if out_of_place else None)
        return stats
    args = _backend.AdamArgs(
        param=param.data_ptr(), grad=grad.data_ptr(), exp_avg=exp_avg.data_ptr(),
        exp_avg_sq=exp_avg_sq.data_ptr(),
        max_exp_avg_sq=max_exp_avg_sq.data_ptr() if max_exp_avg_sq is not None else None,
        param_out=param_out.data_ptr() if param_out is not None else None,
        lowp_out=lowp_out.data_ptr() if lowp_out is not None else None,
        n=n, grad_dtype=_GRAD_DTYPES[grad.dtype],
        lowp_dtype=_LOWP_DTYPES[lowp_out.dtype] if lowp_out is not None else _backend.DTYPE_NONE,
        commit=int(bool(commit)), decoupled=int(c.decoupled), l2=int(c.l2), lerp_hi=int(c.lerp_hi),
        grad_scale=c.grad_scale, weight_decay=c.weight_decay, decay=c.decay, lerp_c=c.lerp_c,
        beta2=c.beta2, one_minus_beta2=c.one_minus_beta2, step_size=c.step_size,
        bias_correction2_sqrt=c.bias_correction2_sqrt, eps=c.eps,
        exp_avg_out=_ptr(exp_avg_out), exp_avg_sq_out=_ptr(exp_avg_sq_out), max_exp_avg_sq_out=_ptr(max_exp_avg_sq_out),
    )
    # ctypes releases the GIL during the call
    if not return_stats:
        rc = lib.ga_adam_step(ctypes.byref(args), nthreads)
        if rc != 0:
            raise RuntimeError(f"ga_adam_step failed: {_backend.status_name(rc)}")
        return None
    norm2, finite = ctypes.c_double(0.0), ctypes.c_int32(0)
    rc = lib.ga_adam_step_stats(ctypes.byref(args), nthreads, ctypes.byref(norm2), ctypes.byref(finite))
    if rc != 0:
        raise RuntimeError(f"ga_adam_step_stats failed: {_backend.status_name(rc)}")
    return norm2.value, bool(finite.value)


def grad_stats(grad: torch.Tensor, grad_scale: float = 1.0, threads: int | None = None) -> tuple[float, bool]:
    """Return (sum of squares of ``float32(grad) * float32(grad_scale)`` accumulated in fp64, all finite).

    One pass. Deterministic: fixed blocks of 16384 elements, 16 fp64 lanes per block reduced in a fixed
    tree, block sums added in order, so the result is bit-identical for any thread count and ISA.
    """
    n = _check("grad", grad, tuple(_GRAD_DTYPES), None).numel()
    nthreads = _threads_arg(threads)
    gs = f32(float(grad_scale))
    lib = _backend.LIB
    if lib is None:
        return _fallback.grad_stats(grad, gs, STATS_BLOCK)
    norm2 = ctypes.c_double(0.0)
    finite = ctypes.c_int32(0)
    rc = lib.ga_grad_stats(grad.data_ptr() if n else None, _GRAD_DTYPES[grad.dtype], n, gs, nthreads,
                           ctypes.byref(norm2), ctypes.byref(finite))
    if rc != 0:
        raise RuntimeError(f"ga_grad_stats failed: {_backend.status_name(rc)}")
    return norm2.value, bool(finite.value)


def stream7(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
            threads: int | None = None) -> None:
    """Bandwidth probe with Adam's memory pattern (4 fp32 streams read, 3 written): a+=b, c+=b, d+=b."""
    n = _check("a", a, (torch.float32,), None).numel()
    for name, t in (("b", b), ("c", c), ("d", d)):
        _check(name, t, (torch.float32,), n)
    nthreads = _threads_arg(threads)
    lib = _backend.LIB
    if lib is None:
        a.add_(b)
        c.add_(b)
        d.add_(b)
        return
    rc = lib.ga_stream7(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), n, nthreads)
    if rc != 0:
        raise RuntimeError(f"ga_stream7 failed: {_backend.status_name(rc)}")
