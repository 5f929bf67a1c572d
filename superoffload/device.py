"""The Device abstraction: the only place the code knows whether a GPU is there.

CUDA: real streams, events, pinned host memory and HBM accounting. CPU-only: the same interface with
streams and events that are no-ops (work is already ordered on one host thread), pageable memory
(pinning needs a CUDA context and crashes without one) and an HBM budget number that stands in for
device memory. The engine and the harness call only these methods, so the CPU-only CI runs the same
code path as a GPU machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class _NullStream:
    def wait_stream(self, other: object) -> None:
        pass

    def wait_event(self, event: object) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _NullEvent:
    def record(self, stream: object = None) -> None:
        pass

    def wait(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class Device:
    """Compute device plus its host. Use :func:`get_device` to construct."""

    def __init__(self, device: torch.device, hbm_budget_bytes: int | None = None) -> None:
        self.torch_device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            total = torch.cuda.get_device_properties(device).total_memory
            self.hbm_budget_bytes = hbm_budget_bytes or total
        else:
            # CPU-only: "HBM" is a budget we enforce in accounting only (default: unlimited)
            self.hbm_budget_bytes = hbm_budget_bytes or (1 << 62)
        self._host_peak = 0

    # --- identity ----------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self.torch_device.type

    def name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.torch_device)
        return "cpu"

    # --- ordering ------------------------------------------------------------------------------
    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def new_stream(self):
        return torch.cuda.Stream(self.torch_device) if self.is_cuda else _NullStream()

    def current_stream(self):
        return torch.cuda.current_stream(self.torch_device) if self.is_cuda else _NullStream()

    @contextlib.contextmanager
    def stream(self, stream) -> Iterator[None]:
        if self.is_cuda:
            with torch.cuda.stream(stream):
                yield
        else:
            yield

    def new_event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing) if self.is_cuda else _NullEvent()

    # --- memory --------------------------------------------------------------------------------
    def empty_host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Host buffer for transfers: pinned (DMA-able, async) with CUDA, pageable without."""
        return torch.empty(numel, dtype=dtype, pin_memory=self.is_cuda)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if self.is_cuda and not t.is_pinned() else t

    def reset_peak_memory(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.torch_device)

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory allocated since the last reset (None: no device memory to report)."""
        if self.is_cuda:
            return int(torch.cuda.max_memory_allocated(self.torch_device))
        return None

    @property
    def shares_host_memory(self) -> bool:
        """True when device tensors are host tensors (CPU-only): a "transfer" can alias, not copy."""
        return not self.is_cuda

    def grad_norm_sq(self, flat: torch.Tensor) -> torch.Tensor:
        """Σ x² of a flat gradient accumulated in fp64, as a 1-element fp64 tensor on the device.

        A non-finite element makes the result non-finite (squares of finite fp32/bf16/fp16 values
        cannot overflow fp64), so this one reduction is also the bucket's finite flag. CPU-only: the
        GraceAdam statistics pass (one multi-threaded read, deterministic for any thread count)."""
        if not self.is_cuda:
            import grace_adam

            norm_sq, finite = grace_adam.grad_stats(flat)
            return torch.tensor([norm_sq if finite else float("inf")], dtype=torch.float64)
        return torch.linalg.vector_norm(flat, dtype=torch.float64).square().reshape(1)

    # --- the device-side optimizer (repartitioned tail buckets) --------------------------------------
    def adam_step(self, param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                  exp_avg_sq: torch.Tensor, *, step: int, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, adamw: bool, grad_scale: float,
                  max_exp_avg_sq: torch.Tensor | None = None) -> None:
        """One fused Adam(W) step on flat fp32 device tensors, in place.

        CUDA: torch's fused multi-tensor kernel (agrees with GraceAdam to a few ulps). CPU-only: the
        device is the host, so GraceAdam itself, which keeps CPU-only training bit-identical to a
        synchronous host loop whatever the split between "device" and host buckets.
        """
        if not self.is_cuda:
            import grace_adam

            grace_adam.adam_step(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1,
                                 beta2=beta2, eps=eps, weight_decay=weight_decay, adamw=adamw,
                                 grad_scale=grad_scale, max_exp_avg_sq=max_exp_avg_sq)
            return
        if grad_scale != 1.0:
            grad.mul_(grad_scale)
        fused = torch._fused_adamw_ if adamw else torch._fused_adam_
        step_t = torch.tensor(float(step), device=param.device)
        fused([param], [grad], [exp_avg], [exp_avg_sq],
              [max_exp_avg_sq] if max_exp_avg_sq is not None else [], [step_t], lr=lr, beta1=beta1,
              beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=max_exp_avg_sq is not None,
              maximize=False)

    def is_oom(self, exc: BaseException) -> bool:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def get_device(kind: str = "auto", hbm_budget_bytes: int | None = None) -> Device:
    """``auto`` picks the current CUDA device when there is one, else the CPU."""
    if kind not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, got {kind!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False; use --device cpu")
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        return Device(torch.device("cuda", torch.cuda.current_device()), hbm_budget_bytes)
    return Device(torch.device("cpu"), hbm_budget_bytes)
