"""ZeRO-Infinity as the SuperOffload artifact configures it, plus the textbook variant.

Artifact (default): ZeRO stage 3 + ``offload_optimizer: cpu`` and **no** parameter offload; the four
stage3_* residency knobs at 1e12 keep every parameter gathered on the device (nothing is ever
re-partitioned or prefetched), so only gradients and the optimizer go to the host.

``-o offload_param=true``: the textbook ZeRO-Infinity (CPU flavour): parameters are offloaded to host
memory as well. The residency knobs then go back to DeepSpeed's defaults, because at 1e12 they would
keep every parameter resident and the offload would do nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar

from baselines._common import as_bool
from baselines._deepspeed import COMMON_OPTIONS, DeepSpeedSystem, offload_section
from superoffload.harness.system import RunConfig

RESIDENT = int(1e12)
# DeepSpeed 0.19's defaults for the stage3_* knobs, written out for the offload_param variant
STAGE3_DEFAULTS = {"stage3_max_live_parameters": int(1e9), "stage3_max_reuse_distance": int(1e9),
                   "stage3_prefetch_bucket_size": int(5e7), "stage3_param_persistence_threshold": int(1e5)}


def stage3_base(pin: bool, *, offload_param: bool, resident: bool) -> dict[str, Any]:
    """Stage 3 + CPU optimizer offload. ``resident``: the artifact's zero_infinity residency knobs
    (1e12); otherwise DeepSpeed's defaults, written out."""
    zero: dict[str, Any] = {
        "stage": 3,
        "offload_optimizer": offload_section(pin),
        "overlap_comm": True,  # stage-3 default (None resolves to true for stage 3)
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": int(5e8),
        "allgather_bucket_size": int(5e8),
        "round_robin_gradients": False,
        "sub_group_size": int(1e9),
    }
    if offload_param:
        zero["offload_param"] = offload_section(pin)
    if resident:
        zero.update({key: RESIDENT for key in STAGE3_DEFAULTS})
    else:
        zero.update(STAGE3_DEFAULTS)
    return zero


class ZeroInfinitySystem(DeepSpeedSystem):
    name: ClassVar[str] = "zero_infinity"
    OPTIONS: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, "offload_param": as_bool}

    def zero_config(self, run: RunConfig, options: dict[str, Any], pin: bool) -> dict[str, Any]:
        offload_param = options.get("offload_param", False)
        return stage3_base(pin, offload_param=offload_param, resident=not offload_param)
