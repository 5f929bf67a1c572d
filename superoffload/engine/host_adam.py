"""Host Adam backends for the engine's buckets (the ablation's "GraceAdam vs DeepSpeedCPUAdam vs torch").

All three take the same call as `grace_adam.adam_step` (flat fp32 master/m/v, a gradient with a folded
scale, `commit` and the upload outputs):
- `grace`: GraceAdam, one fused pass; the speculative mode (commit=False) writes only the upload copy,
  or, with `state_out`, the whole new state to a second buffer set (out of place).
- `torch`: torch's fused AdamW CPU kernel (`torch._fused_adamw_`); `cpuadam`: DeepSpeedCPUAdam's kernel.
  Neither reads a scaled or low-precision gradient nor writes a separate output, so they need the
  separate passes GraceAdam exists to avoid: scale/cast the gradient into a scratch buffer, and for a
  speculative step, copy p, m, v to scratch (or to `state_out`), step the copies, cast the upload copy.
  Results differ from GraceAdam by a few ulps (their arithmetic), but each backend is exact against
  itself, so speculation stays bit-identical to validate-then-step with any of them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

_ds_op = None
_ds_ids = itertools.count(10_000)
_ds_created: dict[tuple, int] = {}


def _ds_adam():
    global _ds_op
    if _ds_op is None:
        from deepspeed.ops.op_builder import CPUAdamBuilder  # JIT-builds once (~1 min), then cached

        from superoffload.ds_build import prepare_deepspeed_ops

        prepare_deepspeed_ops(("CPUAdamBuilder",))  # one line before a build; a dead build's lock is cleared
        _ds_op = CPUAdamBuilder().load()
    return _ds_op


def _fused_torch(p, g, m, v, step: int, lr, beta1, beta2, eps, wd, adamw: bool, bias_correction: bool) -> None:
    if not bias_correction:
        raise ValueError("host_optimizer 'torch' needs bias_correction=True (torch's fused kernel always applies it)")
    fused = torch._fused_adamw_ if adamw else torch._fused_adam_
    fused([p], [g], [m], [v], [], [torch.tensor(float(step))], lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd,
          eps=eps, amsgrad=False, maximize=False)


def _cpuadam(p, g, m, v, step: int, lr, beta1, beta2, eps, wd, adamw: bool, bias_correction: bool) -> None:
    op = _ds_adam()
    key = (adamw,)
    if key not in _ds_created:
        _ds_created[key] = next(_ds_ids)
        op.create_adam(_ds_created[key], lr, beta1, beta2, eps, wd, adamw, False)
    op.adam_update(_ds_created[key], step, lr, beta1, beta2, eps, wd, bias_correction, p, g, m, v)


_UNFUSED: dict[str, Callable] = {"torch": _fused_torch, "cpuadam": _cpuadam}


def adam_step(backend: str, param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
              exp_avg_sq: torch.Tensor, *, step: int, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float, adamw: bool, bias_correction: bool, grad_scale: float,
              max_exp_avg_sq: torch.Tensor | None, commit: bool, param_out: torch.Tensor | None,
              lowp_out: torch.Tensor | None, threads: int | None,
              state_out: list[torch.Tensor] | None = None) -> None:
    """`state_out` = [param, exp_avg, exp_avg_sq(, max_exp_avg_sq)] outputs of an out-of-place step
    (commit=False): the new state goes there and the inputs are not written."""
    if backend == "grace":
        import grace_adam

        if state_out is not None:
            outs = dict(param_out=state_out[0], exp_avg_out=state_out[1], exp_avg_sq_out=state_out[2],
                        max_exp_avg_sq_out=state_out[3] if len(state_out) > 3 else None)
        else:
            outs = dict(param_out=param_out)
        grace_adam.adam_step(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1, beta2=beta2,
                             eps=eps, weight_decay=weight_decay, adamw=adamw, bias_correction=bias_correction,
                             grad_scale=grad_scale, max_exp_avg_sq=max_exp_avg_sq, commit=commit,
                             lowp_out=lowp_out, threads=threads, **outs)
        if state_out is not None and param_out is not None:
            param_out.copy_(state_out[0])  # an fp32 upload copy besides the new master
        return
    if max_exp_avg_sq is not None:
        raise ValueError(f"host_optimizer {backend!r} does not support amsgrad; use 'grace'")
    g = grad.float() if grad.dtype != torch.float32 else grad.clone()  # never scale the landing buffer
    if grad_scale != 1.0:
        g.mul_(grad_scale)
    if commit:
        p, m, v = param, exp_avg, exp_avg_sq
    elif state_out is not None:
        p, m, v = state_out[:3]
        for dst, src in zip((p, m, v), (param, exp_avg, exp_avg_sq), strict=True):
            dst.copy_(src)
    else:
        p, m, v = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    _UNFUSED[backend](p, g, m, v, step, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction)
    for out in (param_out, lowp_out):
        if out is not None:
            out.copy_(p)  # torch casts round to nearest even


def configure_pool(backend: str, discrete_device: bool, threads: int | None) -> dict | None:
    """GraceAdam's thread pool for an engine: beside a discrete device (CUDA, or the simulated one) with
    `host_threads` left null, one thread per CPU of the affinity mask except the training thread's, pinned
    (`grace_adam.configure_for_training`; `GRACE_ADAM_CPUS` names the CPUs instead): the training thread
    launches the device's work and must not share its core with the host step. Elsewhere (the CPU-only
    device, whose compute uses torch's threads, or an explicit `host_threads`) nothing is changed and the
    kernel gets `host_threads` per call. Returns what was set (the engine's stats), or None."""
    if backend != "grace" or not discrete_device or threads is not None:
        return None
    import grace_adam

    if not grace_adam.native_available():
        return None
    pool = grace_adam.configure_for_training(reserve=1, pin=True)
    return {"cpus": list(pool.cpus), "threads": pool.threads, "pinned": pool.pinned, "source": pool.source}
