"""The paper's numbers the figures put beside ours. Each value's source and status tag (V = verbatim from
an authors' source, S = a third-party summary, unverified against the paper's text) are listed in
docs/paper_numbers.md."""

from __future__ import annotations

# GraceAdam table [V] (the DeepSpeed blog's GraceAdam image): seconds per full Adam step.
GRACE_ADAM_TABLE = {  # params -> {kernel: seconds}
    1e9: {"pt-cpu": 0.289, "cpu-adam": 0.098, "grace-adam": 0.082},
    2e9: {"pt-cpu": 0.531, "cpu-adam": 0.198, "grace-adam": 0.160},
    4e9: {"pt-cpu": 0.958, "cpu-adam": 0.393, "grace-adam": 0.316},
    8e9: {"pt-cpu": 1.834, "cpu-adam": 0.769, "grace-adam": 0.608},
}

# Largest model on one GH200 (billions of parameters, status) per harness system name.
LARGEST_MODEL_B = {"superoffload": (25.0, "V"), "zero_offload": (15.0, "S"), "torch": (3.5, "S")}

# Ablation: per-technique throughput factor [S], keyed by the workflow's technique names.
ABLATION_FACTORS = {
    "host_optimizer": 1.104,
    "cast_policy": 1.127,
    "speculation": 1.45,
    "device_tail_buckets": 1.141,
}
ABLATION_TOTAL = 2.06

# STV rollbacks [V] (project page): 93 clipping events in steps 1000-80000 of BLOOM pre-training.
ROLLBACK_RATE = 93 / 79000

# Blog claim [V]: GPU utilization ~50% (ZeRO-Offload) -> >80% (SuperOffload).
GPU_UTIL = {"zero_offload": 0.5, "superoffload": 0.8}


# The paper's GraceAdam table's columns, by the kernel names of `superoffload bench adam`
# (superoffload/harness/adam_bench.schema.json); PT-CPU is torch's CPU Adam, either implementation.
ADAM_KERNEL_COLUMN = {
    "grace_adam": "grace-adam",
    "deepspeed_cpu_adam": "cpu-adam",
    "torch_fused": "pt-cpu",
    "torch_foreach": "pt-cpu",
}
