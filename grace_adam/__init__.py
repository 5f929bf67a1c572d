"""grace_adam: fused, multi-threaded, SIMD host Adam kernel (AVX2 / AVX-512 / NEON / SVE / scalar).

See docs/grace_adam.md for the exactness contract, the build and the measured performance.
"""

from grace_adam._backend import (
    available_isas,
    get_num_threads,
    isa,
    native_available,
    set_num_threads,
)
from grace_adam.functional import adam_step, grad_stats
from grace_adam.optim import GraceAdam
from grace_adam.pool import configure_for_training, cpus_beside_training, get_affinity, set_affinity

__all__ = [
    "GraceAdam",
    "adam_step",
    "available_isas",
    "configure_for_training",
    "cpus_beside_training",
    "get_affinity",
    "get_num_threads",
    "grad_stats",
    "isa",
    "native_available",
    "set_affinity",
    "set_num_threads",
]
