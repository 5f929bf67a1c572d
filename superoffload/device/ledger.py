"""The memory ledger: device bytes by category over time, and host bytes by kind.

Categories of device memory (what the planner's memory model budgets):
  weights     the model's low-precision weights that stay resident (flat per-bucket buffers)
  grads       gradients held by autograd (`param.grad`) until the engine has flattened them
  staging     the flat gradient staging ring and the shard buffers of a bucket in flight
  tail_state  device tail buckets: fp32 master, exp_avg, exp_avg_sq and gradient shard
  flow        weights of flowed blocks while resident (fetched before use, released after)
  activations everything else the model's forward and backward allocate (measured where the backend
              can see it: the simulated device, or CUDA's allocator minus the categories above)

Host memory is `pinned` (transfer buffers, DMA-able) or `pageable`; `needed` is the bytes the buffers
need, `allocated` what was actually allocated for them (the difference is allocator rounding).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

DEVICE_CATEGORIES = ("weights", "grads", "staging", "tail_state", "flow", "activations")
HOST_KINDS = ("pinned", "pageable")


class MemoryLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live: Counter[str] = Counter()
        self.peak_total = 0
        self.at_peak: dict[str, int] = {}
        self.peak_by_category: Counter[str] = Counter()
        self.host_needed: Counter[str] = Counter()
        self.host_allocated: Counter[str] = Counter()
        self.host_by_category: Counter[str] = Counter()

    # --- device ------------------------------------------------------------------------------------
    def alloc(self, category: str, nbytes: int) -> None:
        if category not in DEVICE_CATEGORIES:
            raise ValueError(f"unknown device memory category {category!r}; one of {DEVICE_CATEGORIES}")
        with self._lock:
            self.live[category] += nbytes
            self.peak_by_category[category] = max(self.peak_by_category[category], self.live[category])
            total = sum(self.live.values())
            if total > self.peak_total:
                self.peak_total = total
                self.at_peak = dict(self.live)

    def free(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.live[category] -= nbytes

    def move(self, src: str, dst: str, nbytes: int) -> None:
        """Bytes already counted change category (an op's output becomes a held gradient)."""
        with self._lock:
            self.live[src] -= nbytes
            self.live[dst] += nbytes
            self.peak_by_category[dst] = max(self.peak_by_category[dst], self.live[dst])

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_total = sum(self.live.values())
            self.at_peak = dict(self.live)
            self.peak_by_category = Counter(self.live)

    # --- host --------------------------------------------------------------------------------------
    def host_alloc(self, kind: str, category: str, needed: int, allocated: int) -> None:
        if kind not in HOST_KINDS:
            raise ValueError(f"unknown host memory kind {kind!r}; one of {HOST_KINDS}")
        with self._lock:
            self.host_needed[kind] += needed
            self.host_allocated[kind] += allocated
            self.host_by_category[category] += needed

    def host_free(self, kind: str, category: str, needed: int, allocated: int) -> None:
        with self._lock:
            self.host_needed[kind] -= needed
            self.host_allocated[kind] -= allocated
            self.host_by_category[category] -= needed

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {
                "device_peak_bytes": self.peak_total,
                "device_at_peak": {c: int(self.at_peak.get(c, 0)) for c in DEVICE_CATEGORIES},
                "device_peak_by_category": {c: int(self.peak_by_category.get(c, 0)) for c in DEVICE_CATEGORIES},
                "device_live": {c: int(self.live.get(c, 0)) for c in DEVICE_CATEGORIES},
                "host_needed_bytes": {k: int(self.host_needed.get(k, 0)) for k in HOST_KINDS},
                "host_allocated_bytes": {k: int(self.host_allocated.get(k, 0)) for k in HOST_KINDS},
                "host_by_category": dict(self.host_by_category),
            }
