"""ZeRO-Offload as the SuperOffload artifact runs it: ZeRO stage 2 + ``offload_optimizer: cpu``.

Stage 2 partitions gradients and optimizer state over data-parallel ranks; the fp32 master weights,
Adam moments and the optimizer step (DeepSpeedCPUAdam, chosen by DeepSpeed for an AdamW config with
CPU offload) live on the host. Parameters stay on the device. Options: ``overlap_comm``,
``reduce_bucket_size``, ``sub_group_size`` (see baselines._deepspeed).
"""

from __future__ import annotations

from typing import Any, ClassVar

from baselines._deepspeed import COMMON_OPTIONS, DeepSpeedSystem, offload_section
from superoffload.harness.system import RunConfig


class ZeroOffloadSystem(DeepSpeedSystem):
    name: ClassVar[str] = "zero_offload"
    OPTIONS: ClassVar[dict[str, Any]] = dict(COMMON_OPTIONS)

    def zero_config(self, run: RunConfig, options: dict[str, Any], pin: bool) -> dict[str, Any]:
        return {
            "stage": 2,
            "offload_optimizer": offload_section(pin),
            "overlap_comm": False,  # stage-2 default; the artifact's zero_offload sets nothing
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": int(5e8),
            "allgather_bucket_size": int(5e8),
            "round_robin_gradients": False,
            "sub_group_size": int(1e9),  # stage-3 knob; written so the record is complete
        }

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        if "offload_param" in run.system_options:
            raise ValueError("zero_offload is ZeRO stage 2, which cannot offload parameters; "
                             "use --system zero_infinity -o offload_param=true")
        return super().validate(run)
