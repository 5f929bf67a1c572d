"""DeepSpeed's own SuperOffload (``offload_optimizer.super_offload: true``, ZeRO stage 3).

Configured like the artifact's ``prism`` mode: stage 3, optimizer offload, ``ratio`` 0.90 (the share of
optimizer sub-groups stepped on the CPU; the rest step on the GPU), ``overlap_comm`` false,
``reduce_bucket_size`` and ``sub_group_size`` 6e8, stage3_* residency knobs at DeepSpeed's defaults
(the artifact sets none). Options: ``ratio`` in [0, 1],
``cpuadam_cores_perc`` in (0, 1] (share of this process's cores given to the CPU-Adam worker),
``offload_param`` (the artifact's long-sequence ``prism-ulysses`` variant), plus the common knobs.

Upstream runs its CPU-Adam in a *spawned* worker process. Spawn re-imports the parent's ``__main__``
unless it is a package's ``__main__`` (``python -m superoffload``, ``python -m pytest``), so any other
entry script must be guarded by ``if __name__ == "__main__":``.

Upstream also moves this process's CPU affinity to the first (1 - cpuadam_cores_perc) of its cores;
we restore the affinity in teardown so later work in the same process is not starved.

Note (DeepSpeed >= 0.18.9): with ``gradient_clipping`` > 0 upstream does not overlap CPU-Adam with
backward at all; it steps synchronously after the norm is known.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from baselines._common import as_bool, as_fraction
from baselines._deepspeed import COMMON_OPTIONS, DeepSpeedSystem
from baselines.zero_infinity import stage3_base
from superoffload.harness.system import RunConfig


def _cores_perc(key: str, value: Any) -> float:
    return as_fraction(key, value, allow_zero=False)  # upstream's worker asserts 0 < perc <= 1


class _NullStream:
    """What a CUDA stream offers the SuperOffload code, as no-ops: CPU work is already ordered."""

    def synchronize(self) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass


class CpuShims:
    """The two documented monkeypatches that let upstream SuperOffload run without CUDA.

    1. ``superoffload_stage3._validate_superoffload_accelerator`` asserts the accelerator is CUDA;
       we replace it with a no-op (nothing else in the path is CUDA-specific on the CPU accelerator).
    2. ``partition_grads`` calls ``get_accelerator().current_stream().synchronize()``, and the CPU
       accelerator's ``current_stream()`` returns None; we make it return a no-op stream when the
       original gives None.
    Installed only when DeepSpeed's accelerator is not CUDA, and removed again in teardown.
    """

    def __init__(self) -> None:
        self.installed = False

    def install(self) -> None:
        import deepspeed.runtime.superoffload.superoffload_stage3 as s3
        from deepspeed.accelerator import get_accelerator

        self._s3, self._acc = s3, get_accelerator()
        self._orig_validate = s3._validate_superoffload_accelerator
        self._had_own_stream = "current_stream" in vars(self._acc)
        orig_stream = self._acc.current_stream
        self._orig_stream = orig_stream
        s3._validate_superoffload_accelerator = lambda: None
        self._acc.current_stream = lambda *a, **k: orig_stream(*a, **k) or _NullStream()
        self.installed = True

    def remove(self) -> None:
        if not self.installed:
            return
        self._s3._validate_superoffload_accelerator = self._orig_validate
        if self._had_own_stream:
            self._acc.current_stream = self._orig_stream
        else:  # drop our instance attribute so the class's method shows through again
            del self._acc.current_stream
        self.installed = False


class DSSuperOffloadSystem(DeepSpeedSystem):
    name: ClassVar[str] = "ds_superoffload"
    OPTIONS: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, "ratio": as_fraction,
                                         "cpuadam_cores_perc": _cores_perc, "offload_param": as_bool}
    # its CPU optimizer worker loads cpu_adam and the training step gives up on it after 60 s: a first-use
    # JIT build there (or a wait on another process's build, two test workers at once) failed the run
    DS_PRELOAD: ClassVar[tuple[str, ...]] = ("CPUAdamBuilder",)

    def zero_config(self, run: RunConfig, options: dict[str, Any], pin: bool) -> dict[str, Any]:
        # the artifact's prism mode sets no stage3_* knobs: DeepSpeed's defaults, written out
        zero = stage3_base(pin, offload_param=options.get("offload_param", False), resident=False)
        zero["offload_optimizer"].update({
            "super_offload": True,
            "ratio": options.get("ratio", 0.90),
            "cpuadam_cores_perc": options.get("cpuadam_cores_perc", 0.8),  # upstream default
        })
        zero.update({"overlap_comm": False, "reduce_bucket_size": int(6e8), "sub_group_size": int(6e8)})
        return zero

    def before_initialize(self) -> None:
        from deepspeed.accelerator import get_accelerator

        self._shims = CpuShims()
        if get_accelerator().device_name() != "cuda":  # no CUDA (or DS_ACCELERATOR=cpu): shims needed
            self._shims.install()
        self._affinity = _get_affinity()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["cpu_shims"] = bool(getattr(self, "_shims", None) and self._shims.installed)
        opt = self.state.engine.optimizer if self.state.engine is not None else None
        out["async_cpu_steps_pending"] = getattr(opt, "async_cpuadam_num", None)
        return out

    def teardown(self) -> None:
        engine = self.state.engine if hasattr(self, "state") else None
        worker = getattr(getattr(engine, "optimizer", None), "superoffload_cpu_optimizer", None)
        if worker is not None:  # engine.destroy() does not stop the CPU-Adam worker process
            worker.close()
        super().teardown()
        if getattr(self, "_affinity", None) is not None:
            _set_affinity(self._affinity)
        if hasattr(self, "_shims"):
            self._shims.remove()


def _get_affinity() -> list[int] | None:
    try:
        import psutil

        return list(psutil.Process().cpu_affinity())
    except Exception:  # noqa: BLE001 - affinity is best effort (macOS has none)
        return None


def _set_affinity(cores: list[int]) -> None:
    with contextlib.suppress(Exception):
        import psutil

        psutil.Process().cpu_affinity(cores)
