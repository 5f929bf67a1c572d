"""Hardware profiles: the measured or specified numbers the cost model runs on.

A profile is plain data (JSON in, JSON out). Presets are built only from public specifications and
published microbenchmarks; each constant says where it comes from. ``calibrate`` replaces every
number with a measurement of the machine at hand.

Conventions (the cost model relies on them):

* Bandwidths are GB/s with GB = 1e9 bytes. TFLOPS are FLOP/s (not 1e12-scaled) to avoid unit slips.
* ``host_adam_gbps[kind]`` is the *effective* rate of a host AdamW step at 28 bytes/param
  (read fp32 p, g, m, v = 16 B; write p, m, v = 12 B): params/s = gbps * 1e9 / 28. A kernel that moves
  more bytes (PyTorch's multi-pass CPU Adam) simply gets a lower effective number.
* ``*_cast_gbps`` count cast traffic: a bf16<->fp32 cast moves 6 bytes/element (2 read + 4 written or
  the reverse).
* Link curves give GB/s as a function of one transfer's size; between tabulated sizes the bandwidth is
  interpolated linearly in log(size) and clamped at the ends.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from superoffload.shapes import ModelShape

GB = 1e9
GiB = 2**30
MB = 2**20

ADAM_BYTES_PER_PARAM = 28  # fp32 AdamW: read p, g, m, v; write p, m, v
CAST_BYTES_PER_ELEM = 6  # bf16 <-> fp32: 2 bytes one side, 4 the other

# Host Adam kernel names of profiles written by earlier releases -> today's `host_optimizer` names (read
# for one more release; docs/cost_model.md, "Field names").
LEGACY_HOST_OPTIMIZERS = {"graceadam": "grace"}

COLLECTIVES = ("reduce_scatter", "all_gather", "all_reduce")

# Transfer sizes the presets and the calibration tabulate (1 MiB .. 1 GiB, factors of 4).
CURVE_SIZES = [MB * 4**i for i in range(6)]


@dataclass
class Curve:
    """A measured rate as a function of the size of one operation, interpolated in log(size).

    For a link (``h2d_pinned``, ...): GB/s of one host<->device copy vs its size in bytes. For a compute
    curve (``matmul_curve``, ``attention_curve``): GFLOP/s of one call vs its FLOPs. The field names are
    the link's (``sizes``, ``gbps``), as profile JSON files store them.
    """

    sizes: list[int]
    gbps: list[float]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.gbps):
            raise ValueError("Curve needs equally long, non-empty sizes and gbps lists")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError("Curve sizes must be strictly increasing")
        if any(g <= 0 for g in self.gbps):
            raise ValueError("Curve rates must be positive")

    def bandwidth(self, nbytes: float) -> float:
        """The rate at size ``nbytes`` (log-size interpolation, clamped at the ends)."""
        if nbytes <= self.sizes[0]:
            return self.gbps[0]
        if nbytes >= self.sizes[-1]:
            return self.gbps[-1]
        i = bisect_left(self.sizes, nbytes)
        x0, x1 = math.log(self.sizes[i - 1]), math.log(self.sizes[i])
        t = (math.log(nbytes) - x0) / (x1 - x0)
        return self.gbps[i - 1] + t * (self.gbps[i] - self.gbps[i - 1])

    def seconds(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.bandwidth(nbytes) * GB)

    def peak(self) -> float:
        return max(self.gbps)

    @classmethod
    def latency_bandwidth(cls, peak_gbps: float, latency_s: float,
                          sizes: list[int] | None = None) -> Curve:
        """The curve of a link with a fixed per-copy cost: bw(s) = s / (latency + s / peak).

        Used by the presets, which have a spec'd peak but no published size sweep.
        """
        sizes = sizes or CURVE_SIZES
        return cls(sizes=list(sizes),
                   gbps=[s / (latency_s + s / (peak_gbps * GB)) / GB for s in sizes])


LinkCurve = Curve  # the name of earlier releases


@dataclass
class HardwareProfile:
    """One device + its host, as the cost model sees them."""

    name: str
    source: str  # "preset: ..." or "calibrated on <host> at <time>"
    h2d_pinned: Curve
    d2h_pinned: Curve
    h2d_pageable: Curve
    d2h_pageable: Curve
    device_matmul_flops: float  # achievable bf16 dense matmul FLOP/s (large GEMMs)
    device_peak_flops: float  # vendor dense bf16 peak, the denominator of MFU/HFU
    attention_factor: float  # attention kernels run at this fraction of device_matmul_flops
    device_hbm_bytes: int
    device_hbm_gbps: float
    device_cast_gbps: float  # cast traffic GB/s on the device (6 B/elem)
    host_adam_gbps: dict[str, float]  # host_optimizer (grace | torch | cpuadam) -> effective GB/s at 28 B/param
    host_cores: int
    host_memory_bytes: int
    host_cast_gbps: float  # cast traffic GB/s on the host (6 B/elem)
    sync_latency_s: float  # host<->device event round trip charged once per bucket op
    device_reserve_bytes: int = 2 * GiB  # CUDA context, cuBLAS workspace, allocator slack
    host_reserve_bytes: int = 16 * GiB  # OS, runtime, data loader, page cache floor
    device_is_host: bool = False  # "cpu" profile: the device is the CPU and the link is a memcpy
    notes: list[str] = field(default_factory=list)
    # Small-op realism, measured by `calibrate` (None in the presets, which then model GEMMs and
    # attention at large-GEMM speed only): achieved GFLOP/s of one GEMM call vs its FLOPs (a Curve
    # whose "sizes" are FLOPs and "gbps" GFLOP/s), streaming GB/s of elementwise ops (norms, GELU,
    # residual adds, the loss), and the dispatch cost of one small op.
    matmul_curve: Curve | None = None
    elementwise_gbps: float | None = None
    op_overhead_s: float | None = None
    attention_bwd_ratio: float | None = None  # SDPA backward time / forward time (None: 2, like GEMMs)
    # achieved GFLOP/s of one causal SDPA forward vs its FLOPs (a Curve like matmul_curve); None:
    # attention at attention_factor x device_matmul_flops whatever its size
    attention_curve: Curve | None = None
    # Framework overhead, measured by `calibrate` with microbenchmarks of their own (None in the presets:
    # no public spec gives them, and on a large GPU model they are noise; profiles without them keep
    # the model above). Counts (modules, parameter tensors) come from the model structure (overhead.py).
    gelu_elems_per_s: float | None = None  # tanh-GELU, forward + backward, elements/s (compute-bound on CPUs)
    module_call_s: float | None = None  # Python cost of one nn.Module call (a stack of nn.Identity)
    optimizer_tensor_s: float | None = None  # per parameter tensor: clip_grad_norm_ + fused AdamW + zero_grad
    clip_gbps: float | None = None  # global-norm clipping traffic at 12 B/param (norm read, scale read+write)
    # per system: the step machinery (hooks, flattening, communication layer, the engine's per-bucket
    # work) outside the modelled ops, measured on a degenerate model (superoffload/calibrate/systems.py) as
    # {"fixed_s", "per_layer_s", "per_tensor_s", "per_bucket_s", "per_param_s" (+ "per_param_raw_s")}; a
    # profile with launch_op_s below prices the SuperOffload engine's per-bucket launch by its op counts instead
    system_step_s: dict[str, dict[str, float]] | None = None
    # The training thread's time per device call outside autograd, which the SuperOffload engine's launch is
    # made of (overhead.py counts them per bucket): an op that launches a kernel, and a light call (an event
    # record or wait, a stream switch). Measured by `calibrate` on a GPU; the GPU presets carry the values
    # fitted to the first H200 runs (presets.py). None: the engine's launch priced by system_step_s.
    launch_op_s: float | None = None
    device_call_s: float | None = None
    # profiled compute of named workloads (calibrate --workloads; superoffload/calibrate/compute.py): per
    # "MODEL:sSEQ:bBATCH", the forward/backward seconds of one block and of the rest of the harness's
    # model, with the shape signature and dtype they were measured at. Used instead of the op-level terms
    # for a workload whose shape and dtype match; None in the presets.
    compute_profiles: dict[str, dict[str, Any]] | None = None
    # Several chips (data parallel, one rank per chip): collectives are rings over the ranks, charged
    # alpha + (W-1)/W x bytes / bandwidth per rank (docs/cost_model.md, "Several chips"). Bandwidths are
    # per rank and per direction: `intra_node_gbps` between chips of one node (NVLink), `inter_node_gbps`
    # once the ring leaves the node (each chip's own NIC); latencies are per ring step. None: the profile
    # has no interconnect numbers and multi-chip predictions charge no communication (and say so).
    chips_per_node: int = 1
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 10e-6
    # achievable fp32 (no tensor-core) matmul FLOP/s: torch runs an fp32 GEMM as true fp32 unless TF32 is
    # switched on. Only the tiled loss's weight-gradient GEMM runs in fp32 (sequence/loss.py); None: at
    # device_matmul_flops
    device_fp32_matmul_flops: float | None = None
    # collectives measured by `calibrate` on the process group the engine runs with, per link class
    # ("intra": ranks of one node; "inter": across nodes): {"backend", "world", "sizes" (bytes), "seconds":
    # {kind: [...]}, "latency_s": {kind: a}, "gbps": {kind: b}, "worker_issue_s", "dtypes": {"bf16": {"seconds",
    # "latency_s", "gbps"}}, "compute_share" (CPUs: the compute's loss per second of an all-reduce in flight
    # beside it on the same cores, or null; recorded, not used by the cost model), "call_overhead" (CPUs: a
    # gradient all-reduced as K calls beside compute, {"counts", "total_bytes", "compute_s", "seconds", "slope_s",
    # "per_call_s"}: the cost model adds per_call_s per call), "cores_per_rank" (the ranks' bound slices, or
    # null when unbound)} (fp32 at the top; calibrate/collectives.py).
    # When present they replace the link numbers above for that class (docs/cost_model.md, "Collectives").
    collectives: dict[str, dict[str, Any]] | None = None
    # Threads. `compute_threads`: the compute threads the compute rates stand for when the device is the host
    # (calibrate: its --threads; this-cpu: every usable CPU, whose compute it scales to; None: unknown, taken
    # as 1). `host_adam_threads`: the threads `host_adam_gbps` was measured at (None: the whole host, as the
    # presets' published rates are). `host_adam_by_threads`: calibrate's host Adam rates at other thread
    # counts, {"threads": {kind: GB/s}} (JSON keys are strings); the cost model prices a rank's host Adam at
    # the threads the rank's host worker has (docs/cost_model.md, "Host cores per rank").
    compute_threads: int | None = None
    host_adam_threads: int | None = None
    host_adam_by_threads: dict[str, dict[str, float]] | None = None
    # a device that is the host, the worker on a core of its own: seconds of compute lost per second the host
    # worker streams host Adam beside it (shared memory bandwidth, caches, SMT siblings), measured by calibrate
    # (machine._host_interference); None: not measured, taken as 0 (cores that do not interfere)
    host_interference: float | None = None

    # --- derived rates ---------------------------------------------------------------------------
    def host_adam_rate(self, host_optimizer: str, threads: int | None = None) -> float:
        """Effective GB/s (28 B/param) of one host Adam kernel at `threads` threads: the measured rate at the
        largest measured thread count not above `threads` (never extrapolated upward); without measurements
        at other counts, or for `threads` None, the profile's rate."""
        try:
            gbps = self.host_adam_gbps[host_optimizer]
        except KeyError:
            raise ValueError(f"profile {self.name!r} has no host Adam rate for {host_optimizer!r}; "
                             f"has {sorted(self.host_adam_gbps)}") from None
        if threads is None or not self.host_adam_by_threads:
            return gbps
        table = {int(t): r for t, r in self.host_adam_by_threads.items() if host_optimizer in r}
        if self.host_adam_threads is not None:
            table.setdefault(self.host_adam_threads, {host_optimizer: gbps})
        below = [t for t in table if t <= threads]
        # fewer threads than any measurement (calibrate always measures 1): the closest, the fewest measured
        return table[max(below) if below else min(table)][host_optimizer]

    def host_adam_seconds(self, params: float, host_optimizer: str, extra_bytes_per_param: float = 0.0,
                          threads: int | None = None) -> float:
        gbps = self.host_adam_rate(host_optimizer, threads)
        return params * (ADAM_BYTES_PER_PARAM + extra_bytes_per_param) / (gbps * GB)

    def device_adam_seconds(self, params: float) -> float:
        # A fused device AdamW is a streaming kernel like the cast: same achievable GB/s.
        return params * ADAM_BYTES_PER_PARAM / (self.device_cast_gbps * GB)

    def cast_seconds(self, elems: float, on_host: bool) -> float:
        gbps = self.host_cast_gbps if on_host else self.device_cast_gbps
        return elems * CAST_BYTES_PER_ELEM / (gbps * GB)

    def has_interconnect(self) -> bool:
        return bool(self.collectives) or (self.intra_node_gbps is not None and self.inter_node_gbps is not None)

    def collective_seconds(self, kind: str, nbytes: float, world: int, ranks_per_node: int | None = None,
                           elem_bytes: int = 4) -> float:
        """One ring collective over ``world`` ranks; ``nbytes`` is the whole buffer (the gathered output
        of an all-gather, the input of a reduce-scatter, the tensor of an all-reduce).

        reduce-scatter / all-gather: (W-1) steps of latency + (W-1)/W x nbytes / bandwidth per rank;
        all-reduce: twice that (a reduce-scatter then an all-gather). The ring crosses nodes when the
        ranks do not fit in one node (``ranks_per_node`` of them per node, default as many as a node
        holds), and is then limited by the inter-node bandwidth. With calibrated collectives for that link
        class: the measured time at the measured world size (interpolated in log-log between measured
        sizes), else the same ring formula on the latency and bandwidth fitted to the measurement; a 2-byte
        collective (bf16 or fp16, ``elem_bytes``) on the bf16 measurement where the calibration has one (a
        backend reduces another dtype at another speed per byte). 0 for one rank, or when the profile has no
        interconnect numbers."""
        if kind not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, not {kind!r}")
        if world <= 1 or nbytes <= 0 or not self.has_interconnect():
            return 0.0
        per_node = ranks_per_node or min(world, max(1, self.chips_per_node))
        across = math.ceil(world / per_node) > 1
        measured = (self.collectives or {}).get("inter" if across else "intra")
        if measured is not None and elem_bytes == 2 and "bf16" in (measured.get("dtypes") or {}):
            measured = {**measured, **measured["dtypes"]["bf16"]}
        if measured is not None and kind in measured.get("seconds", {}):
            return measured_collective_seconds(measured, kind, nbytes, world)
        if self.intra_node_gbps is None or self.inter_node_gbps is None:
            return 0.0  # calibrated for one link class only, and this ring needs the other
        gbps = min(self.intra_node_gbps, self.inter_node_gbps) if across else self.intra_node_gbps  # type: ignore[type-var]
        latency = self.inter_node_latency_s if across else self.intra_node_latency_s
        one = (world - 1) * latency + (world - 1) / world * nbytes / (gbps * GB)  # type: ignore[operator]
        return 2 * one if kind == "all_reduce" else one

    def collective_call_overhead_s(self) -> float:
        """What one more collective call costs a rank computing beside it, beyond the measured curve's time for
        its bytes: calibrated on CPUs (gloo runs a collective's work on the rank's own cores; calibrate/
        collectives.py `_call_overhead`), 0 elsewhere and on presets."""
        call = ((self.collectives or {}).get("intra") or {}).get("call_overhead") or {}
        return float(call.get("per_call_s", 0.0))

    def all_to_all_seconds(self, nbytes: float, group: int, ranks_per_node: int | None = None,
                           calls: int = 1) -> float:
        """``calls`` all-to-alls over ``group`` ranks, each rank sending and receiving ``nbytes`` in all
        (its whole buffer; the 1/group share that stays on the rank does not move).

        Every call pays one step latency; the bytes go to the other ranks at once. Inside a node
        (the group's consecutive ranks fit ``ranks_per_node``): (group-1)/group x nbytes over the intra-node
        bandwidth. Across nodes the share for ranks on other nodes leaves through the chip's NIC while the
        share for ranks on the same node goes over NVLink: the slower of the two. 0 for one rank, or when
        the profile has no interconnect numbers."""
        if group <= 1 or nbytes <= 0 or not self.has_interconnect():
            return 0.0
        per_node = min(group, ranks_per_node or max(1, self.chips_per_node))
        intra = (per_node - 1) / group * nbytes / (self.intra_node_gbps * GB)  # type: ignore[operator]
        if per_node >= group:
            return calls * self.intra_node_latency_s + intra
        inter = (group - per_node) / group * nbytes / (self.inter_node_gbps * GB)  # type: ignore[operator]
        return calls * self.inter_node_latency_s + max(intra, inter)

    def fp32_matmul_flops(self) -> float:
        return self.device_fp32_matmul_flops or self.device_matmul_flops

    def link(self, direction: str, pinned: bool = True) -> Curve:
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', not {direction!r}")
        return getattr(self, f"{direction}_{'pinned' if pinned else 'pageable'}")

    # --- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareProfile:
        d = dict(d)
        if isinstance(d.get("host_adam_gbps"), dict):  # profiles written before the shared vocabulary
            d["host_adam_gbps"] = {LEGACY_HOST_OPTIMIZERS.get(k, k): v for k, v in d["host_adam_gbps"].items()}
        for key in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "matmul_curve", "attention_curve"):
            if d.get(key) is not None:
                d[key] = Curve(**d[key])
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown HardwareProfile fields: {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically: a reader never sees a half-written profile."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HardwareProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))


def measured_collective_seconds(m: dict[str, Any], kind: str, nbytes: float, world: int) -> float:
    """One collective on a calibrated measurement `m` (a `collectives` entry): the measured curve at its own world
    size (log-log between measured sizes), else the ring on its fitted latency and bandwidth."""
    sizes, secs = m["sizes"], m["seconds"][kind]
    if world == m["world"] and sizes[0] <= nbytes <= sizes[-1]:
        i = min(max(bisect_left(sizes, nbytes), 1), len(sizes) - 1)
        lo, hi = sizes[i - 1], sizes[i]
        f = (math.log(nbytes) - math.log(lo)) / (math.log(hi) - math.log(lo)) if hi > lo else 0.0
        return math.exp(math.log(secs[i - 1]) + f * (math.log(secs[i]) - math.log(secs[i - 1])))
    steps = world - 1  # the fitted per-step latency and per-rank bandwidth, on this ring
    return steps * m["latency_s"][kind] + steps / world * nbytes / (m["gbps"][kind] * GB)


def fit_collective(sizes: list[int], seconds: list[float], world: int) -> tuple[float, float]:
    """(per-step latency s, per-rank GB/s) of a ring collective measured at `world` ranks over `sizes`: the
    smallest messages' time (the best of the first three) is all latency, (W-1) steps of it; the slope from
    there to the largest message is (W-1)/W / bandwidth."""
    steps = max(1, world - 1)
    small = min(seconds[:3])  # the smallest messages (noisy one by one)
    latency = small / steps
    slope = (seconds[-1] - small) / (sizes[-1] - sizes[0]) if sizes[-1] > sizes[0] else 0.0
    gbps = (steps / world) / slope / GB if slope > 0 else float("inf")
    return latency, gbps


def workload_key(model: str, seq: int, batch: int, dtype: str | None = None) -> str:
    """The key of a workload in ``HardwareProfile.compute_profiles``: ``model:sSEQ:bBATCH``, with ``:DTYPE`` for a
    profile in another precision than fp32 (so one profile holds a workload's fp32 and bf16 compute; an fp32
    entry keeps the key profiles had before they held several)."""
    return f"{model}:s{seq}:b{batch}" + (f":{dtype}" if dtype not in (None, "fp32") else "")


def shape_signature(shape: ModelShape) -> str:
    """What must match for a ``compute_profiles`` entry to apply (a name alone may be reused with other
    sizes)."""
    return (f"{shape.family}:L{shape.layers}:h{shape.hidden}:f{shape.ffn_hidden}:a{shape.heads}:"
            f"kv{shape.n_kv_heads}:V{shape.vocab}:g{int(shape.gated_mlp)}:t{int(shape.tied_embeddings)}")


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
