"""The cost model: one training iteration as a data-flow graph, scheduled, turned into a Prediction.

Three iterations are simulated back to back so the next forward waits on the previous step's
parameter returns exactly as it would in steady state; the step time is the distance between the
ends of iterations 2 and 3 (iteration 1 starts with all weights already in place).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import InitVar, asdict, dataclass, field, fields, replace
from typing import Any

from superoffload.options import ENGINE_DEFAULTS, MEMORY_DEFAULTS, SHARED_KEYS, Precision
from superoffload.planner import buckets as bk
from superoffload.planner import overhead as ov
from superoffload.planner.flops import (
    head_forward_flops,
    layer_forward_flops,
    step_hardware_flops,
    step_model_flops,
)
from superoffload.planner.hardware import ADAM_BYTES_PER_PARAM, HardwareProfile, shape_signature, workload_key
from superoffload.planner.memory import (
    ADAM_STATE,
    BF16,
    FP32,
    EngineMemoryInput,
    MemoryEstimate,
    activation_memory,
    checkpoint_host_bytes,
    engine_memory,
    loss_tile_rows,
    ulysses_kv_repeat,
)
from superoffload.planner.schedule import COMPUTE, D2H, H2D, HOST, NET, Graph, Schedule, simulate
from superoffload.planner.systems import Options, SystemSpec, system_spec
from superoffload.shapes import ModelShape

ITERATIONS = 3


@dataclass(frozen=True)
class Workload:
    """What one rank trains, and on which host. ``precision`` was called ``dtype`` (still accepted as a keyword)."""

    shape: ModelShape
    seq: int  # sequence length (the global one under sequence parallelism)
    batch: int  # micro-batch (sequences)
    activation_checkpointing: bool = True
    precision: Precision | None = None  # training precision; a profiled-compute entry must match it when given
    chips: int = 1  # ranks, one per chip, each with its own host; chips / sp data-parallel groups
    ranks_per_node: int | None = None  # None: as many as a node of the profile holds
    # Long sequences (superoffload/sequence, docs/cost_model.md "Long sequences"):
    sp: int = 1  # Ulysses sequence-parallel degree: each group of sp consecutive ranks shares its sequences
    offload_checkpoints: bool = False  # checkpointed blocks' inputs in host memory (ActivationOffloader)
    loss_tile: int | None = None  # tokens per tile of the tiled cross-entropy; None: the plain loss
    # The host a rank may use (docs/cost_model.md, "Host cores per rank"); None: the profile's defaults
    # (host_share). `cores_per_rank`: the cores of the rank's host (a `bench run --bind-cores` slice);
    # `compute_threads`: the threads its compute runs on when the device is the host (torch's intra-op
    # pool); `host_threads`: the host optimizer's threads (engine config `host_threads`)
    cores_per_rank: float | None = None
    compute_threads: int | None = None
    host_threads: int | None = None
    dtype: InitVar[str | None] = None  # the old name of ``precision``

    def __post_init__(self, dtype: str | None) -> None:
        if dtype is not None:
            object.__setattr__(self, "precision", dtype)  # frozen: set once, here
        if self.chips < 1 or (self.ranks_per_node is not None and self.ranks_per_node < 1):
            raise ValueError(f"chips and ranks_per_node must be >= 1, got {self.chips}, {self.ranks_per_node}")
        if not isinstance(self.sp, int) or isinstance(self.sp, bool) or self.sp < 1:
            raise ValueError(f"sp (the sequence-parallel degree) must be a positive integer, got {self.sp!r}")
        if self.sp > 1:
            if self.chips % self.sp:
                raise ValueError(f"sp={self.sp} must divide chips={self.chips} (chips = sp x data-parallel degree)")
            ulysses_kv_repeat(self.shape.heads, self.shape.n_kv_heads, self.sp)  # raises on heads it cannot split
            if self.seq % self.sp:
                raise ValueError(f"seq={self.seq} must be divisible by sp={self.sp} (every rank holds seq/sp tokens)")
        if self.offload_checkpoints and not self.activation_checkpointing:
            raise ValueError("offload_checkpoints keeps activation checkpoints in host memory: it needs "
                             "activation checkpointing")
        if self.loss_tile is not None and (not isinstance(self.loss_tile, int) or isinstance(self.loss_tile, bool)
                                           or self.loss_tile < 1):
            raise ValueError(f"loss_tile must be a positive number of tokens (or None), got {self.loss_tile!r}")
        if self.cores_per_rank is not None and not self.cores_per_rank > 0:
            raise ValueError(f"cores_per_rank must be > 0, got {self.cores_per_rank!r}")
        for name in ("compute_threads", "host_threads"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name} must be a positive integer (or None), got {v!r}")

    @property
    def dp(self) -> int:
        """Data-parallel degree: groups of sp ranks, each with its own micro-batch."""
        return self.chips // self.sp

    @property
    def local_seq(self) -> int:
        """Tokens of each sequence one rank holds (seq / sp)."""
        return self.seq // self.sp

    @property
    def local_tokens(self) -> int:
        """Tokens per micro-batch on one rank (everything but attention runs on these)."""
        return self.local_seq * self.batch

    @property
    def long_sequence(self) -> bool:
        return self.sp > 1 or self.offload_checkpoints or self.loss_tile is not None


@dataclass
class Prediction:
    system: str
    model: str
    params: int
    seq: int
    batch: int
    grad_accum: int
    hardware: str
    step_time_s: float
    gpu_busy_s: float
    gpu_idle_s: float
    tail_s: float  # exposed tail: device idle from the end of backward to the end of the next forward
    stage_s: dict[str, float]  # busy seconds per stage in one steady-state iteration
    tokens_per_s: float
    tflops: float  # model TFLOPS (6N + causal attention, no recompute)
    mfu: float
    hfu: float
    peak_hbm_bytes: float
    host_bytes: float
    fits: bool
    memory: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # several chips: tokens_per_s, tflops, mfu, hfu, memory and step are per chip; these are the totals
    chips: int = 1
    aggregate_tokens_per_s: float | None = None
    # busy seconds per resource in one steady-state iteration (the device's compute stream, each link
    # direction, the host CPU, the network) and the stages that ran on each: a resource busy for most of
    # the step is what bounds it (`binding`)
    resource_s: dict[str, float] = field(default_factory=dict)
    resource_stages: dict[str, list[str]] = field(default_factory=dict)

    def binding(self) -> tuple[str, float] | None:
        """(the busiest resource, its share of the step), or None without a schedule."""
        if not self.resource_s or self.step_time_s <= 0:
            return None
        name = max(self.resource_s, key=lambda r: self.resource_s[r])
        return name, self.resource_s[name] / self.step_time_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ costs
class _Costs:
    """Durations of every op kind for one workload on one profile."""

    def __init__(self, w: Workload, hw: HardwareProfile) -> None:
        lf = layer_forward_flops(w.shape, w.seq, w.batch, w.sp)
        mm = hw.device_matmul_flops
        self.fwd_layer = lf.matmul / mm + attention_seconds(hw, lf.attention)
        self.fwd_head = head_forward_flops(w.shape, w.local_seq, w.batch) / mm
        self.bwd_layer = 2 * self.fwd_layer
        if hw.matmul_curve is not None and hw.elementwise_gbps and hw.op_overhead_s is not None:
            self.fwd_layer, self.fwd_head = _small_op_forward(w, hw, lf.attention)
            # backward: 2x forward, except attention, whose backward/forward ratio calibrate measures
            attn = attention_seconds(hw, lf.attention)
            ratio = hw.attention_bwd_ratio if hw.attention_bwd_ratio is not None else 2.0
            self.bwd_layer = 2 * (self.fwd_layer - attn) + ratio * attn
            # measured activation: forward 1/3, backward 2/3 of its fwd+bwd time (as op_overhead_s)
            gelu = ov.gelu_seconds(w.shape, w.local_tokens, hw)
            if gelu is not None:
                self.fwd_layer += gelu / 3
                self.bwd_layer += 2 * gelu / 3
            # Python work that happens once per forward call (module calls; not doubled in backward)
            self.fwd_layer += ov.block_forward_overhead_s(w.shape, hw)
            self.fwd_head += ov.top_forward_overhead_s(w.shape, hw)
        self.bwd_head = 2 * self.fwd_head
        self.world, self.ranks_per_node = w.chips, w.ranks_per_node
        self.profiled = profiled_compute(w, hw)
        if self.profiled is not None:
            p = self.profiled
            self.fwd_layer, self.bwd_layer = p["block_fwd_s"], p["block_bwd_s"]
            self.fwd_head, self.bwd_head = p["top_fwd_s"], p["top_bwd_s"]
        self.hw = hw
        self._long_sequence(w, hw)

    def _long_sequence(self, w: Workload, hw: HardwareProfile) -> None:
        """Durations of the long-sequence pieces (docs/cost_model.md, "Long sequences"): per block the
        Ulysses all-to-alls (forward: q, k, v in and the output back; backward: their transposes, as many
        bytes), the checkpoint's copy to the host and back, and the tiled loss's extra backward work."""
        sh, p = w.shape, _activation_bytes(w)
        tokens = w.local_tokens
        self.a2a = ulysses_block_seconds(w, hw)
        ckpt = p * sh.hidden * tokens  # one block's input
        self.ckpt_d2h = hw.link("d2h").seconds(ckpt) if w.offload_checkpoints else 0.0
        self.ckpt_h2d = hw.link("h2d").seconds(ckpt) if w.offload_checkpoints else 0.0
        self.loss_tiles = 0
        if w.loss_tile is not None:
            # backward recomputes each tile's logits (the head's forward again), then forms the hidden-state
            # gradient in the training precision and the weight gradient from fp32 copies of h and g into an
            # fp32 accumulator (sequence/loss.py): that GEMM runs at the fp32 rate instead of the bf16 one
            gemm = head_forward_flops(sh, w.local_seq, w.batch)
            self.loss_tiles = -(-tokens // loss_tile_rows(tokens, w.loss_tile))
            self.bwd_head += self.fwd_head + max(0.0, gemm / hw.fp32_matmul_flops() - gemm / hw.device_matmul_flops)
            if hw.op_overhead_s is not None:  # the per-tile loop's dispatches, forward and backward
                self.fwd_head += (self.loss_tiles - 1) * HEAD_OPS * hw.op_overhead_s / 3
                self.bwd_head += (self.loss_tiles - 1) * HEAD_OPS * 2 * hw.op_overhead_s / 3

    def link(self, direction: str, params: float, bytes_per_param: int, real: int,
             pageable: bool = False) -> float:
        curve = self.hw.link(direction, pinned=not pageable)
        return real * curve.seconds(params / real * bytes_per_param)

    def host_cast(self, params: float) -> float:
        return self.hw.cast_seconds(params, on_host=True)

    def device_cast(self, params: float) -> float:
        return self.hw.cast_seconds(params, on_host=False)

    def collective(self, kind: str, nbytes: float, calls: int = 1, worker: bool = False, elem_bytes: int = 4) -> float:
        """`calls` collectives sharing `nbytes` of `elem_bytes`-byte elements (one per bucket of a group: each pays
        its latency, and on CPUs the calibrated cost of one more call beside the compute), issued by the host
        worker thread when `worker` (the calibrated cost of issuing one from there is added)."""
        calls = max(1, calls)
        t = calls * self.hw.collective_seconds(kind, nbytes / calls, self.world, self.ranks_per_node, elem_bytes)
        if t > 0:
            t += calls * self.hw.collective_call_overhead_s()
        if worker and t > 0 and self.hw.collectives and "intra" in self.hw.collectives:
            t += calls * float(self.hw.collectives["intra"].get("worker_issue_s", 0.0))
        return t

    def device_copy(self, params: float) -> float:
        """An fp32 copy on the device: 4 B read + 4 B written per param at the device's copy rate."""
        return params * 2 * FP32 / (self.hw.device_hbm_gbps * 1e9)


def _activation_bytes(w: Workload) -> int:
    return FP32 if w.precision == "fp32" else BF16


def ulysses_block_seconds(w: Workload, hw: HardwareProfile) -> float:
    """One block's Ulysses all-to-alls in one direction on one rank: q, k, v sequence-to-heads and the
    attention output back (four calls), each rank's [local tokens, width] tensors in the activation dtype;
    KV heads repeated when SP exceeds them. 0 without sequence parallelism."""
    if w.sp <= 1:
        return 0.0
    sh = w.shape
    rep = ulysses_kv_repeat(sh.heads, sh.n_kv_heads, w.sp)
    width = 2 * sh.heads * sh.head_dim + 2 * sh.n_kv_heads * sh.head_dim * rep  # q, output; k, v
    return hw.all_to_all_seconds(_activation_bytes(w) * w.local_tokens * width, w.sp, w.ranks_per_node, calls=4)


# Per transformer block forward: ~12 dispatched ops (2 norms, 4 GEMMs, attention, activation, 2 residual
# adds, reshapes) and ~(14h + 2f) activation elements read or written per token outside the GEMMs;
# the head adds the logits GEMM and ~4V elements per token of loss traffic. Backward is charged 2x
# (as everywhere in this model). Counts read off superoffload/models/gpt.py, not fitted.
BLOCK_OPS = 12
HEAD_OPS = 6
ACT_BYTES = 4


def _block_gemms(shape, tokens: int) -> list[tuple[int, int, int]]:
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.n_kv_heads * shape.head_dim
    mlp = [(tokens, h, f), (tokens, h, f), (tokens, f, h)] if shape.gated_mlp else [(tokens, h, f), (tokens, f, h)]
    return [(tokens, h, h + 2 * kv), (tokens, h, h)] + mlp


def profiled_compute(w: Workload, hw: HardwareProfile) -> dict[str, Any] | None:
    """The profile's measured compute for this workload (calibrate --workloads), or None when it has
    none whose shape signature and dtype match."""
    if w.sp > 1:  # a profile times one rank holding the whole sequence
        return None
    profiles = hw.compute_profiles or {}
    for key in dict.fromkeys((workload_key(w.shape.name, w.seq, w.batch, w.precision),
                              workload_key(w.shape.name, w.seq, w.batch))):
        entry = profiles.get(key)
        if entry is None or entry.get("shape") != shape_signature(w.shape):
            continue
        if w.precision is None or entry.get("dtype") == w.precision:
            return entry
    return None


def attention_seconds(hw: HardwareProfile, flops: float) -> float:
    """Causal attention forward: at the measured rate for its size when calibrate measured the curve
    (small attentions run far below the large-kernel rate), else at attention_factor of the matmul rate."""
    if hw.attention_curve is not None:
        return flops / (hw.attention_curve.bandwidth(flops) * 1e9) if flops > 0 else 0.0
    return flops / (hw.device_matmul_flops * hw.attention_factor)


def _gemm_seconds(hw: HardwareProfile, m: int, k: int, n: int) -> float:
    flops = 2.0 * m * k * n
    return flops / (hw.matmul_curve.bandwidth(flops) * 1e9)


def _small_op_forward(w: Workload, hw: HardwareProfile, attention_flops: float) -> tuple[float, float]:
    """Forward seconds of one block and of the head with per-GEMM efficiency, elementwise traffic and
    per-op dispatch (used when the profile was measured by calibrate)."""
    sh, tokens = w.shape, w.local_tokens
    gemm = sum(_gemm_seconds(hw, *g) for g in _block_gemms(sh, tokens))
    attn = attention_seconds(hw, attention_flops)
    # the MLP activation's 2f elements of traffic are in its measured time when calibrate measured it
    act = 0 if ov.gelu_seconds(sh, tokens, hw) is not None else 2 * sh.ffn_hidden
    elementwise = tokens * (14 * sh.hidden + act) * ACT_BYTES / (hw.elementwise_gbps * 1e9)
    # op_overhead_s is forward + backward per op; backward is charged 2x the forward below
    layer = gemm + attn + elementwise + BLOCK_OPS * hw.op_overhead_s / 3
    head = (_gemm_seconds(hw, tokens, sh.hidden, sh.vocab)
            + tokens * 4 * sh.vocab * ACT_BYTES / (hw.elementwise_gbps * 1e9) + HEAD_OPS * hw.op_overhead_s / 3)
    return layer, head


def layer_forward_seconds(w: Workload, hw: HardwareProfile) -> float:
    return _Costs(w, hw).fwd_layer


# ------------------------------------------------------------------------------------------ graph
@dataclass
class _IterMarks:
    first_forward: int = -1
    last_forward: int = -1
    last_backward: int = -1
    end: int = -1


def host_cores_per_rank(w: Workload, hw: HardwareProfile) -> float:
    """The cores of one rank's host: ``Workload.cores_per_rank`` when given (a ``bench run --bind-cores``
    slice); else, on a device that is the host, the host's cores over the ranks of a node, which all run on
    them; elsewhere each chip has a host of its own."""
    if w.cores_per_rank is not None:
        return float(w.cores_per_rank)
    if not hw.device_is_host:
        return float(hw.host_cores)
    per_node = w.ranks_per_node or min(w.chips, max(1, hw.chips_per_node))
    return hw.host_cores / max(1, min(w.chips, per_node))


@dataclass(frozen=True)
class HostShare:
    """What one rank's host can give its host worker (docs/cost_model.md, "Host cores per rank")."""

    cores: float  # the rank's cores
    compute_threads: int | None  # threads of the rank's compute when the device is the host (None: a GPU)
    host_threads: int  # threads the host optimizer runs at
    own_core: bool  # the host worker has a core the compute does not use: host work overlaps compute

    def describe(self) -> str:
        compute = "" if self.compute_threads is None else f", compute on {self.compute_threads} thread(s)"
        where = ("its own core(s), beside the compute" if self.own_core
                 else "the core(s) the rank computes on: nothing it does overlaps compute")
        return (f"{self.cores:g} host core(s) per rank{compute}; the host worker ({self.host_threads} optimizer "
                f"thread(s)) runs on {where}")


def host_share(w: Workload, hw: HardwareProfile) -> HostShare:
    """The rank's cores, its compute threads and the host worker's threads, and whether the worker has a core
    of its own. On a device that is the host the compute takes ``compute_threads`` of the rank's cores (the
    run's, else the profile's, else 1) and the worker has a core of its own only when one is left; its
    optimizer threads are the run's ``host_threads``, else the cores left (at least 1), as ``bench run
    --bind-cores`` sets them (harness/placement.py). A GPU's host computes nothing: the worker has its cores
    (its threads: the run's, else the profile's measured count)."""
    cores = host_cores_per_rank(w, hw)
    if not hw.device_is_host:
        threads = w.host_threads or hw.host_adam_threads or max(1, int(cores))
        return HostShare(cores, None, threads, True)
    compute = w.compute_threads or hw.compute_threads or 1
    spare = int(cores + 1e-9) - compute
    threads = w.host_threads or max(1, spare)
    return HostShare(cores, compute, threads, spare >= 1)


class _Builder:
    """The data-flow graph of ``ITERATIONS`` training iterations of one system on one workload."""

    def __init__(self, w: Workload, hw: HardwareProfile, spec: SystemSpec) -> None:
        self.w, self.hw, self.spec = w, hw, spec
        self.costs = _Costs(w, hw)
        self.share = host_share(w, hw)
        # a device that is the host, without a core for the host worker beside the compute threads: the
        # worker's ops (optimizer steps, casts) run on the cores the rank computes on, and so do gloo's
        # collectives (CPU threads of the process group), so none of them overlaps compute. With a core of
        # its own the worker's core also runs the collectives' threads
        self.host_shares_compute = hw.device_is_host and not self.share.own_core
        # (calibrate measures what a collective in flight costs the compute beside it, `compute_share`, which
        # would let part of them overlap; not used: under load it reads 0 and the plans it made lost,
        # docs/cost_model.md "Host cores per rank")
        aliases = ({HOST: COMPUTE, NET: COMPUTE} if self.host_shares_compute
                   else {NET: HOST} if hw.device_is_host else None)
        self.graph = Graph(aliases)
        # a device that is the host: the training thread leaves each bucket's gradient reduce-scatter in flight
        # (engine/launch.py `Launcher.launch`; a wait would block the thread, where on CUDA it is a stream wait) and
        # waits only when a launch reuses the staging slot a reduction still reads (`staging_buffers` slots,
        # round robin) and once at the end of backward for them all; on two gloo ranks a reduce-scatter is an
        # all-reduce of the bucket (engine/comm.py)
        self.engine_on_host = hw.device_is_host and spec.name == "superoffload"
        self.staging_slots = int(MEMORY_DEFAULTS["staging_buffers"])
        self._reductions: list[int] = []  # this backward's reduce-scatters, in launch order
        self._blocking: list[int] = []
        # a device that is the host, the worker on a core of its own: its work still slows the compute beside it
        # (memory bandwidth, caches, SMT siblings) by the share calibrate measured; each host op adds that share
        # of its time to the compute stream, from when it can start
        self.interference = (hw.host_interference or 0.0) if hw.device_is_host and self.share.own_core else 0.0
        bucket = w.shape.block_params() if spec.all_layers_stream else spec.bucket_size
        # only SuperOffload splits a tensor larger than a bucket; the peers' buckets hold whole tensors
        self.groups = bk.bucket_groups(w.shape, bucket, spec.device_tail_buckets, last_host=spec.upload_slots,
                                       split=spec.name == "superoffload")
        self.layers = w.shape.layers
        self.world = max(1, spec.world)
        # the share of a bucket (or layer) this rank's optimizer owns
        self.shard = 1.0 / self.world if spec.shard_optimizer else 1.0
        self.gathered = set(range(self.layers)) if (spec.gather_per_layer and self.world > 1) else set()
        self.stream = (set(range(self.layers)) if spec.all_layers_stream else set(spec.flow_layers)) | self.gathered
        self._streamed_units = {bk.layer_unit(i) for i in self.stream}
        self.marks: list[_IterMarks] = []
        # SuperOffload on a device that is the host: the bucket's landing buffer is its gradient buffer
        # and the parameters are views of the upload buffer (engine/bucket.py), so nothing crosses a "link"
        # (except an fp32 upload that the device then casts); with several ranks the reduced shard lands
        # in a buffer of its own
        self.link_aliased = hw.device_is_host and spec.name == "superoffload" and self.world == 1
        self._norm_ops = []

    # weight fetch for a streamed layer, honouring the prefetch buffer slots
    def _fetch(self, it: int, layer: int, deps: list[int], slot_users: list[int], tag: str) -> list[int]:
        """A streamed layer's weights before its use: H2D of the host copy (of this rank's shard with
        several ranks) [+ device cast], then with several ranks an all-gather of the layer; a ZeRO-3
        partitioned layer (gather_per_layer) only needs the all-gather."""
        spec = self.spec
        params = self.w.shape.block_params()
        slots = spec.flow_prefetch + 1  # the layer in use and those fetched ahead
        slot_free = slot_users[-slots] if len(slot_users) >= slots else None
        before = deps + [slot_free]
        if layer not in self.gathered:
            shard = params / self.world if self.world > 1 else params
            t = self.costs.link("h2d", shard, spec.fetch_bytes, 1)
            f = self.graph.add(f"it{it}.fetch_{tag}{layer}", H2D, t, before, "weight_fetch", it)
            if spec.fetch_device_cast:
                t_cast = self.costs.device_cast(shard)
                f = self.graph.add(f"it{it}.fetchcast{layer}", COMPUTE, t_cast, [f], "device_cast", it)
            before = [f]
        if self.world > 1:
            per = spec.param_gather_bytes or spec.fetch_bytes
            t = self.costs.collective("all_gather", params * per, elem_bytes=per)
            before = [self.graph.add(f"it{it}.gather_{tag}{layer}", NET, t, before, "all_gather", it)]
        return before

    def build(self, iterations: int = ITERATIONS) -> Graph:
        graph = self.graph
        unit_ready: dict[str, list[int]] = {}  # previous step's ops a unit's next use waits for
        step_done: int | None = None
        prev_compute: int | None = None
        slot_users: list[int] = []  # ops using a flowed layer's buffer, in order (prefetch slots)
        for it in range(iterations):
            marks = _IterMarks()
            waits = self._waits(step_done, unit_ready)
            iter_ops: list[int] = []
            for micro in range(self.spec.grad_accum):
                first = micro == 0  # only the first micro-batch's forward waits for the previous step
                prev = self._forward(it, prev_compute, waits if first else _no_waits, slot_users, marks, first)
                prev_compute = self._backward(it, prev, slot_users, micro == self.spec.grad_accum - 1, iter_ops)
            marks.last_backward = prev_compute
            # validation: global norm / finite flag from every bucket's partials (all-reduced across ranks)
            check = [prev_compute] + self._norm_ops
            if self.world > 1 and self.spec.step_allreduce:
                t = self.costs.collective("all_reduce", 16.0)
                check = [graph.add(f"it{it}.norm_allreduce", NET, t, check, "all_reduce", it)]
            validate = graph.barrier(f"it{it}.validate", check, it)
            unit_ready, step_ops = self._finish_buckets(it, validate)
            step_done = graph.barrier(f"it{it}.step_done", [validate] + step_ops, it)
            marks.end = graph.barrier(f"it{it}.end", [step_done] + iter_ops, it)
            self.marks.append(marks)
        return graph

    def _waits(self, step_done: int | None, unit_ready: dict[str, list[int]]) -> Callable[[str], list[int]]:
        """What a unit's first use in the next forward waits for: the whole previous step (peers) or
        that unit's own parameter return (SuperOffload); nothing in the first iteration."""
        def waits(unit: str) -> list[int]:
            if step_done is None:
                return []
            return [step_done] if self.spec.forward_waits_all else list(unit_ready.get(unit, []))

        return waits

    def _forward(self, it: int, prev: int | None, waits: Callable[[str], list[int]], slot_users: list[int],
                 marks: _IterMarks, first_micro: bool) -> int:
        """One micro-batch's forward: embedding, blocks (fetching flowed ones), head. Returns the last op.

        Long sequences: each block's input is copied to the host (checkpoint offload; a side stream that
        first waits for the compute stream, so after the op that produced the input, overlapping the block),
        and each block's Ulysses all-to-alls follow its compute on the communication stream."""
        graph, costs = self.graph, self.costs
        prev = graph.barrier(f"it{it}.fwd_emb", [prev] + waits(bk.EMB), it)
        self._ckpt_d2h: list[int] = []
        for i in range(self.layers):
            unit = bk.layer_unit(i)
            if i in self.stream:
                deps = [prev] + self._fetch(it, i, waits(unit), slot_users, "f")
            else:
                deps = [prev] + waits(unit)
            if self.w.offload_checkpoints:
                self._ckpt_d2h.append(graph.add(f"it{it}.ckpt_d2h{i}", D2H, costs.ckpt_d2h, [prev], "ckpt_d2h", it))
            prev = graph.add(f"it{it}.fwd{i}", COMPUTE, costs.fwd_layer, deps, "forward", it)
            if marks.first_forward < 0:
                marks.first_forward = prev
            if i in self.stream:
                slot_users.append(prev)
            prev = self._all_to_all(it, f"f{i}", prev)
        head_waits = waits(bk.FINAL) + (waits(bk.EMB) if self.w.shape.tied_embeddings else [])
        prev = graph.add(f"it{it}.fwd_head", COMPUTE, costs.fwd_head, [prev] + head_waits, "forward", it)
        if marks.first_forward < 0:
            marks.first_forward = prev
        if first_micro:
            marks.last_forward = prev
        return prev

    def _all_to_all(self, it: int, tag: str, prev: int) -> int:
        """A block's four Ulysses all-to-alls (sequence parallelism only), after its compute."""
        if self.w.sp <= 1:
            return prev
        return self.graph.add(f"it{it}.a2a_{tag}", NET, self.costs.a2a, [prev], "all_to_all", it)

    def _backward(self, it: int, prev: int, slot_users: list[int], last_micro: bool, iter_ops: list[int]) -> int:
        """One micro-batch's backward: head, blocks last to first (recomputed when checkpointing, flowed
        ones fetched again), embedding; each unit's gradients start their buckets' path as they complete.
        Returns the last op.

        Offloaded checkpoints come back as ActivationOffloader brings them (sequence/checkpoint.py): the
        last block's input on demand (its recompute waits for the copy), every other block's input is
        prefetched when the next block's recompute starts, i.e. after the compute queued before it, on the
        same side stream as the forward's copies (so after them)."""
        graph, costs = self.graph, self.costs
        grad_ready: dict[str, int] = {}
        prev = graph.add(f"it{it}.bwd_head", COMPUTE, costs.bwd_head, [prev], "backward", it)
        grad_ready[bk.FINAL] = prev
        emitted = self._emit_ready(it, grad_ready, 0, last_micro, iter_ops)
        offload = self.w.offload_checkpoints and self.w.activation_checkpointing
        fetched: int | None = None
        if offload:  # on demand: the side stream waits for the compute queued so far and its own copies
            fetched = graph.add(f"it{it}.ckpt_h2d{self.layers - 1}", H2D, costs.ckpt_h2d,
                                [prev, self._ckpt_d2h[-1]], "ckpt_h2d", it)
        for i in reversed(range(self.layers)):
            deps = [prev] + self._take_blocking()
            if i in self.stream:
                deps += self._fetch(it, i, [], slot_users, "b")
            if self.w.activation_checkpointing:
                if offload:
                    deps.append(fetched)
                    # the unpack of block i prefetches block i-1's input
                    fetched = (graph.add(f"it{it}.ckpt_h2d{i - 1}", H2D, costs.ckpt_h2d, [prev, fetched],
                                         "ckpt_h2d", it) if i > 0 else None)
                prev = graph.add(f"it{it}.rec{i}", COMPUTE, costs.fwd_layer, deps, "recompute", it)
                prev = self._all_to_all(it, f"r{i}", prev)
                deps = [prev]
            prev = graph.add(f"it{it}.bwd{i}", COMPUTE, costs.bwd_layer, deps, "backward", it)
            if i in self.stream:
                slot_users.append(prev)
            prev = self._all_to_all(it, f"b{i}", prev)
            grad_ready[bk.layer_unit(i)] = prev
            emitted = self._emit_ready(it, grad_ready, emitted, last_micro, iter_ops)
        prev = graph.barrier(f"it{it}.bwd_emb", [prev] + self._take_blocking(), it)
        grad_ready[bk.EMB] = prev
        self._emit_ready(it, grad_ready, emitted, last_micro, iter_ops)
        if self._reductions:  # backward returns once every reduce-scatter left in flight is done
            prev = graph.barrier(f"it{it}.bwd_end", [prev] + self._take_blocking() + self._reductions, it)
            self._reductions = []
        return prev

    def _host_op(self, name: str, duration: float, deps: list[int], kind: str, it: int) -> int:
        """A host worker op, and the compute it costs beside it (``interference``)."""
        op = self.graph.add(name, HOST, duration, deps, kind, it)
        if self.interference > 0 and duration > 0:
            self.graph.add(f"{name}.beside", COMPUTE, self.interference * duration, deps, "host_interference", it)
        return op

    def _take_blocking(self) -> list[int]:
        """The collectives the training thread has waited for since the last compute op (then forgotten)."""
        out, self._blocking = self._blocking, []
        return out

    # -- bucket stages up to the host step --------------------------------------------------------
    _norm_ops: list[int]
    _pending: list[dict[str, Any]]

    def _emit_ready(self, it: int, grad_ready: dict[str, int], emitted: int, last_micro: bool,
                    iter_ops: list[int]) -> int:
        if emitted == 0:
            self._norm_ops, self._pending = [], []
        while emitted < len(self.groups) and self.groups[emitted].last_unit in grad_ready:
            if last_micro:
                self._pending.append(self._grad_path(it, emitted, grad_ready[self.groups[emitted].last_unit]))
            emitted += 1
        return emitted

    def _reduce(self, it: int, j: int, last: int, n: float) -> int:
        """With several ranks: the bucket's gradient reduced across them (reduce-scatter, or DDP's
        all-reduce) on the network, in bucket order."""
        spec = self.spec
        if self.world <= 1 or spec.grad_reduce is None:
            return last
        kind = spec.grad_reduce
        if self.engine_on_host and kind == "reduce_scatter" and self.world == 2:
            kind = "all_reduce"  # engine/comm.py: on two gloo ranks the engine all-reduces the bucket, keeps its slice
        t = self.costs.collective(kind, n * spec.grad_reduce_bytes, calls=self.groups[j].real_buckets,
                                  elem_bytes=spec.grad_reduce_bytes)
        op = self.graph.add(f"it{it}.{spec.grad_reduce}{j}", NET, t, [last], spec.grad_reduce, it)
        self._norm_ops.append(op)
        if self.engine_on_host:
            # this launch reuses the slot of the reduction `staging_slots` launches back: the thread waits for it
            reused = len(self._reductions) - self.staging_slots
            if reused >= 0:
                self._blocking.append(self._reductions[reused])
            self._reductions.append(op)
        return op

    def _grad_path(self, it: int, j: int, ready: int) -> dict[str, Any]:
        spec, graph, costs, group = self.spec, self.graph, self.costs, self.groups[j]
        n, real = group.params, group.real_buckets
        if spec.name == "superoffload":  # the launch's machinery, on the training thread, in backward
            t = ov.engine_launch_overhead_s(self.hw, n, real, on_device=group.on_device)
            if t > 0:
                ready = graph.add(f"it{it}.launch{j}", COMPUTE, t, [ready], "system_overhead", it)
                self._norm_ops.append(ready)
        if group.on_device or spec.device_only:
            return {"j": j, "ready": self._reduce(it, j, ready, n), "device": True}
        last = ready
        if spec.grad_device_cast:
            last = graph.add(f"it{it}.gcast{j}", COMPUTE, costs.device_cast(n), [last], "device_cast", it)
            self._norm_ops.append(last)
        elif spec.grad_device_copy:
            last = graph.add(f"it{it}.gcopy{j}", COMPUTE, costs.device_copy(n), [last], "device_copy", it)
            self._norm_ops.append(last)
        last = self._reduce(it, j, last, n)
        shard = n * self.shard
        if not self.link_aliased:
            t = costs.link("d2h", shard, spec.grad_d2h_bytes, real)
            last = graph.add(f"it{it}.d2h{j}", D2H, t, [last], "d2h", it)
        # grad_host_cast: no pass of its own; the host step reads the low-precision gradient (systems.py,
        # LOWP_GRAD_READ_SAVING)
        return {"j": j, "ready": last, "device": False}

    # -- host step, commit, parameter return, device tail -----------------------------------------
    def _finish_buckets(self, it: int, validate: int) -> tuple[dict[str, list[int]], list[int]]:
        unit_ready: dict[str, list[int]] = {}
        step_ops: list[int] = []
        adams = self._steps(it, validate, unit_ready, step_ops)
        self._returns(it, validate, adams, unit_ready, step_ops)
        step_ops += self._step_overheads(it, validate, step_ops)
        return unit_ready, step_ops

    def _steps(self, it: int, validate: int, unit_ready: dict[str, list[int]],
               step_ops: list[int]) -> list[tuple[int, int]]:
        """Each bucket group's optimizer step: device Adam for the tail (after validation), host Adam
        (after validation unless speculating) and its commit pass. Returns (group, host Adam op)."""
        spec, graph, hw = self.spec, self.graph, self.hw
        adams: list[tuple[int, int]] = []
        commits: list[tuple[int, int]] = []
        # an upload ring (upload_slots): only the first buckets in forward order have a slot to speculate
        # into; the others step when step() publishes them, after validation, in forward order
        at_publish = [p for p in self._pending if spec.upload_slots and not p["device"]
                      and not self.groups[p["j"]].first_forward and not spec.host_waits_backward]
        # validating first, the engine submits the buckets' steps after validation in the order the next forward
        # needs them, the last-arriving (first layers) first (engine/validate.py `Validator.validate_and_apply`):
        # the worker queue is FIFO, so the graph adds them in that order; speculative passes go in arrival order
        pending = list(reversed(self._pending)) if spec.host_waits_backward else self._pending
        for p in pending:
            if any(p is q for q in at_publish):
                continue
            group = self.groups[p["j"]]
            shard = group.params * self.shard
            if p["device"]:
                t = (group.params * ADAM_BYTES_PER_PARAM / (ov.torch_adam_gbps(hw) * 1e9) if spec.device_only
                     else hw.device_adam_seconds(shard))
                op = graph.add(f"it{it}.dadam{p['j']}", COMPUTE, t, [p["ready"], validate], "device_adam", it)
                op = self._gather_weights(it, f"d{p['j']}", op, group.params, group.real_buckets)
                for unit, _ in group.pieces:
                    unit_ready.setdefault(unit, []).append(op)
                step_ops.append(op)
                continue
            deps = [p["ready"]] + ([validate] if spec.host_waits_backward else [])
            t = (hw.host_adam_seconds(shard, spec.host_optimizer, spec.spec_extra_bytes, self.share.host_threads)
                 + group.real_buckets * hw.sync_latency_s)
            adam = self._host_op(f"it{it}.hadam{p['j']}", t, deps, "host_adam", it)
            step_ops.append(adam)
            if spec.commit_bytes:
                commits.append((p["j"], adam))
            adams.append((p["j"], adam))
        for p in reversed(at_publish):
            adams.append((p["j"], self._step_at_publish(it, p, validate, step_ops)))
        # the deferred commit passes run after every bucket's return (the worker's queue order)
        commit_gbps = hw.host_adam_rate(spec.host_optimizer, self.share.host_threads)
        for j, adam in commits:
            commit_t = self.groups[j].params * self.shard * spec.commit_bytes / (commit_gbps * 1e9)
            step_ops.append(self._host_op(f"it{it}.commit{j}", commit_t, [adam, validate], "host_commit", it))
        return adams

    def _step_at_publish(self, it: int, p: dict[str, Any], validate: int, step_ops: list[int]) -> int:
        """A bucket without an upload slot: deferred, one pass writing state and weights after validation;
        full_copy, the out-of-place pass during backward (no weights) and the weights cast from the new
        master at publish. Returns the op the bucket's return waits for."""
        spec, hw = self.spec, self.hw
        group = self.groups[p["j"]]
        shard = group.params * self.shard
        latency = group.real_buckets * hw.sync_latency_s
        if spec.commit_bytes:  # deferred
            t = (hw.host_adam_seconds(shard, spec.host_optimizer, spec.spec_extra_bytes, self.share.host_threads)
                 + latency)
            op = self._host_op(f"it{it}.padam{p['j']}", t, [p["ready"], validate], "host_adam", it)
        else:
            t = hw.host_adam_seconds(shard, spec.host_optimizer, spec.spec_extra_bytes - spec.fused_cast_bytes,
                                     self.share.host_threads)
            adam = self._host_op(f"it{it}.hadam{p['j']}", t + latency, [p["ready"]], "host_adam", it)
            step_ops.append(adam)
            op = self._host_op(f"it{it}.pcast{p['j']}", self.costs.host_cast(shard), [adam, validate],
                           "host_cast", it)
        step_ops.append(op)
        return op

    def _returns(self, it: int, validate: int, adams: list[tuple[int, int]], unit_ready: dict[str, list[int]],
                 step_ops: list[int]) -> None:
        """The updated parameters' way back after each host step: host cast, H2D (pinned or pageable, per
        bucket or after all steps), device cast; what each unit's next use waits for."""
        spec, graph, costs = self.spec, self.graph, self.costs
        all_adams = graph.barrier(f"it{it}.adams_done", [a for _, a in adams] + [validate], it)
        # the weights are published in the order the next forward needs them, first layers first (the engine's
        # finalize order after validation): uploads and all-gathers queue in that order
        for j, adam in sorted(adams, key=lambda ja: -ja[0]):
            group = self.groups[j]
            streamed = sum(n for u, n in group.pieces if self._is_streamed(u))
            resident = group.params - streamed
            last = adam
            if spec.return_host_cast:
                t = costs.host_cast(group.params * self.shard)
                last = self._host_op(f"it{it}.rcast{j}", t, [last], "host_cast", it)
            for unit, _ in group.pieces:
                if self._is_streamed(unit):
                    unit_ready.setdefault(unit, []).append(last)  # next fetch reads the host copy
            if spec.return_bytes and resident and not (self.link_aliased and not spec.return_device_cast):
                deps = ([last] + ([validate] if spec.return_waits_validation else [])
                        + ([all_adams] if spec.return_after_all else []))
                mine = resident * self.shard  # with several ranks each returns its shard
                t = costs.link("h2d", mine, spec.return_bytes, group.real_buckets, pageable=spec.return_pageable)
                last = graph.add(f"it{it}.h2d{j}", H2D, t, deps, "h2d", it)
                if spec.return_pageable:
                    # a pageable copy is staged by the calling host thread: it blocks the host pool too
                    step_ops.append(graph.add(f"it{it}.h2dwait{j}", HOST, t, deps, "host_copy_wait", it))
                if spec.return_device_cast:
                    t = costs.device_cast(mine)
                    last = graph.add(f"it{it}.rdcast{j}", COMPUTE, t, [last], "device_cast", it)
                last = self._gather_weights(it, str(j), last, resident, group.real_buckets, worker=True)
                for unit, _ in group.pieces:
                    if not self._is_streamed(unit):
                        unit_ready.setdefault(unit, []).append(last)
                step_ops.append(last)
            else:
                if self.link_aliased:  # the step writes the weights in place: their next use waits for it
                    for unit, _ in group.pieces:
                        if not self._is_streamed(unit):
                            unit_ready.setdefault(unit, []).append(last)
                step_ops.append(last)

    def _gather_weights(self, it: int, tag: str, last: int, params: float, calls: int = 1,
                        worker: bool = False) -> int:
        """With several ranks: the updated weights of a bucket all-gathered after the rank's shard is back
        (systems whose weights stay partitioned gather per layer instead, in ``_fetch``); `calls` buckets,
        issued by the host worker when `worker` (SuperOffload's return)."""
        spec = self.spec
        if self.world <= 1 or not spec.param_gather_bytes or spec.gather_per_layer or spec.all_layers_stream:
            return last
        t = self.costs.collective("all_gather", params * spec.param_gather_bytes, calls=calls,
                                  worker=worker and spec.name == "superoffload", elem_bytes=spec.param_gather_bytes)
        return self.graph.add(f"it{it}.all_gather{tag}", NET, t, [last], "all_gather", it)

    def _step_overheads(self, it: int, validate: int, step_ops: list[int]) -> list[int]:
        """Per-step framework work after backward: torch.optim's per-tensor loop and clipping (systems
        stepping with torch AdamW; with the host steps, or on the device for torch), and the system's own
        step machinery, Python on the main thread: it holds the compute stream, and for the peers, whose
        step() runs the optimizer synchronously, it comes after the whole step."""
        spec, graph, shape, hw = self.spec, self.graph, self.w.shape, self.hw
        ops = []
        # torch.optim's loop is the peers' (FSDP offload, torch) step; our engine with host_optimizer "torch" runs
        # torch's Adam on each flat bucket, no per-tensor loop (its per-bucket cost is charged at the launch)
        torch_optim = spec.host_optimizer == "torch" and spec.name != "superoffload"
        opt_t = ov.optimizer_overhead_s(shape, hw, spec.clipping) if torch_optim else 0.0
        if opt_t > 0:
            res = COMPUTE if spec.device_only else HOST
            ops.append(graph.add(f"it{it}.opt_overhead", res, opt_t, [validate], "optimizer_overhead", it))
        # SuperOffload's per-bucket and per-parameter machinery is charged at each bucket's launch (_grad_path)
        sys_t = ov.system_step_overhead_s(spec.name, shape, hw, per_bucket_and_param=spec.name != "superoffload")
        if sys_t > 0:
            after = [validate] + (step_ops + ops if spec.forward_waits_all else [])
            ops.append(graph.add(f"it{it}.sys_overhead", COMPUTE, sys_t, after, "system_overhead", it))
        return ops

    def _is_streamed(self, unit: str) -> bool:
        return unit in self._streamed_units


def _no_waits(unit: str) -> list[int]:
    """Micro-batches after the first wait for nothing of the previous step (the first already did)."""
    return []


# ------------------------------------------------------------------------------------------ memory
def flow_slots(flow_prefetch: int, flowed_layers: int) -> int:
    """Device buffers of flowed layers at peak: ``flow_prefetch + 1`` (the block in use plus those
    fetched ahead), but no more than there are flowed layers."""
    return min(flow_prefetch + 1, flowed_layers)


def estimate_memory(w: Workload, hw: HardwareProfile, spec: SystemSpec, opts: Options) -> MemoryEstimate:
    """Itemised peak device and host bytes (see docs/cost_model.md for each term's reasoning)."""
    sh = w.shape
    n = sh.total_params()
    layer = sh.block_params()
    m = MemoryEstimate()
    m.device.update(activation_memory(sh, w.seq, w.batch, w.activation_checkpointing, sp=w.sp,
                                      offload_checkpoints=w.offload_checkpoints, loss_tile=w.loss_tile))
    m.device["reserve"] = hw.device_reserve_bytes
    m.host["reserve"] = hw.host_reserve_bytes
    if w.offload_checkpoints and w.activation_checkpointing:
        m.host["activation_checkpoints"] = checkpoint_host_bytes(sh, w.seq, w.batch, sp=w.sp)
        m.pinned_keys.add("activation_checkpoints")
    if spec.grad_accum > 1 and not spec.device_only:
        m.device["grad_accum_buffer"] = BF16 * n
    world = max(1, spec.world)
    shard = 1.0 / world if spec.shard_optimizer else 1.0  # the share of the state this rank holds
    if spec.name == "superoffload":
        # the engine's own allocations, as its memory ledger counts them (memory.engine_memory)
        inp = engine_memory_input(opts, world=world, device_is_host=hw.device_is_host, sp=w.sp,
                                  offload_checkpoints=w.offload_checkpoints, loss_tile=w.loss_tile)
        mem = engine_memory(sh, w.seq, w.batch, w.activation_checkpointing, inp)
        mem.device["reserve"] = hw.device_reserve_bytes
        mem.host["reserve"] = hw.host_reserve_bytes
        return mem
    if spec.name == "ulysses":
        # ZeRO-3 without offload: this rank's partition of the bf16 weights, bf16 gradients and fp32 master,
        # m and v (16 B/param over the world); the unit being used (a layer, or the largest embedding table:
        # gathered like a layer) plus the prefetched layers; the full gradient of a gathered unit before its
        # reduce-scatter; DeepSpeed's reduce bucket
        wte = sh.vocab * sh.hidden
        wpe = sh.max_seq * sh.hidden if sh.learned_positions else 0
        biggest = max(layer, wte, wpe)
        m.device["params_bf16"] = BF16 * n * shard
        m.device["grads_bf16"] = BF16 * n * shard
        m.device["optimizer_state"] = ADAM_STATE * n * shard
        m.device["gathered_params"] = BF16 * (biggest + spec.flow_prefetch * layer) if world > 1 else 0
        m.device["unit_grads_bf16"] = BF16 * biggest
        m.device["grad_staging"] = BF16 * min(spec.bucket_size, n)
        return m
    if spec.device_only:
        # fp32 params + fp32 grads + Adam m, v, plus autocast's bf16 weight copies kept for backward
        m.device["params_fp32"] = FP32 * n
        m.device["grads_fp32"] = FP32 * n
        m.device["adam_mv"] = 2 * FP32 * n
        m.device["autocast_bf16_weights"] = BF16 * n
        if world > 1:
            m.device["ddp_gradient_buckets"] = FP32 * n  # DDP's buckets keep a second copy of the grads
        return m
    _, tail = bk.split_params(sh, spec.device_tail_buckets, spec.bucket_size, split=spec.name == "superoffload")
    streamed = layer * len(spec.flow_layers)
    if spec.all_layers_stream:
        # two layers in flight: fp32 staging + bf16 copy, plus one layer's fp32 and bf16 grads
        m.device["layer_buffers"] = (spec.flow_prefetch + 1) * layer * (FP32 + BF16) + layer * (FP32 + BF16)
        m.device["params_bf16_resident"] = BF16 * (n - layer * sh.layers)  # embedding/head stay
        m.host["params_fp32"] = FP32 * n * shard
        m.host["grads_fp32"] = FP32 * n * shard
        m.host["adam_mv"] = 2 * FP32 * n * shard
        return m
    if spec.gather_per_layer and world > 1:
        # ZeRO-3 partitions: this rank's share of the weights, plus the gathered layers in flight (the
        # embedding, gathered like a layer, when it is larger)
        biggest = max(layer, sh.embedding_params())
        m.device["params_bf16"] = BF16 * n * shard
        m.device["gathered_params"] = (spec.flow_prefetch + 1) * BF16 * biggest
    else:
        m.device["params_bf16"] = BF16 * (n - streamed)
    if streamed:
        # the engine holds at most 1 + flow_prefetch flowed blocks at once, never more than flow
        # (its weight_flow stats: peak_resident_blocks)
        m.device["flow_prefetch_slots"] = flow_slots(spec.flow_prefetch, len(spec.flow_layers)) * BF16 * layer
        m.host["flow_bf16_copy"] = BF16 * streamed
    m.device["tail_optimizer_state"] = (ADAM_STATE + BF16) * tail * shard
    bucket = min(spec.bucket_size, n)
    m.device["layer_grads_bf16"] = BF16 * layer  # a block's grads before they are bucketed
    in_flight = 2  # buckets being cast / copied at once
    m.device["grad_staging"] = in_flight * bucket * (BF16 + (FP32 if spec.grad_device_cast else 0))
    if spec.return_device_cast:
        m.device["return_staging"] = in_flight * bucket * FP32
    host_params = (n - tail) * shard
    m.host["master_m_v"] = ADAM_STATE * host_params
    # gradients stay on the host until the optimizer step
    m.host["grads_fp32"] = FP32 * host_params
    return m


def engine_memory_input(engine: Options | Mapping[str, Any], *, world: int = 1, device_is_host: bool = False,
                        sp: int = 1, offload_checkpoints: bool = False,
                        loss_tile: int | None = None) -> EngineMemoryInput:
    """What the SuperOffload engine's memory depends on (``memory.engine_memory``), built here only: the planner
    prices a prediction's Options with it and ``bench memory`` the engine config it ran.

    ``engine``: the planner's Options, or an engine config dict (``SuperOffloadConfig.to_dict()``, as run records
    keep it; a key it lacks takes the engine's default). The rest are the run's facts: ranks, whether the device
    is the host, and the long-sequence pieces that set the model's share."""
    cfg = asdict(engine) if isinstance(engine, Options) else engine
    keys = {f.name for f in fields(EngineMemoryInput)} & {*SHARED_KEYS, *MEMORY_DEFAULTS}
    values = {k: cfg.get(k, MEMORY_DEFAULTS.get(k, ENGINE_DEFAULTS.get(k))) for k in keys}
    values["amsgrad"] = (cfg.get("optimizer") or {}).get("amsgrad", MEMORY_DEFAULTS["amsgrad"])
    values["flow_layers"] = tuple(values["flow_layers"] or ())
    return EngineMemoryInput(**values, world=world, device_is_host=device_is_host, sp=sp,
                             offload_checkpoints=offload_checkpoints, loss_tile=loss_tile)


# ------------------------------------------------------------------------------------------ predict
def predict(system: str, w: Workload, hw: HardwareProfile, opts: Options | None = None,
            hbm_budget: float | None = None, spec_changes: Mapping[str, Any] | None = None) -> Prediction:
    """Predicted steady-state step of ``system`` on ``hw``; ``fits`` says whether memory allows it.
    ``spec_changes``: SystemSpec fields replaced, to price a design alternative (what-if studies)."""
    opts = opts or Options()
    sh = w.shape
    spec = system_spec(system, opts, sh.total_params(), world=w.chips)
    if spec_changes:
        spec = replace(spec, **spec_changes)
    b = _Builder(w, hw, spec)
    graph = b.build()
    sched = simulate(graph)
    return _summarise(system, w, hw, opts, spec, b, sched, hbm_budget)


def _memory_fits(mem: MemoryEstimate, hw: HardwareProfile, hbm_budget: float | None = None) -> bool:
    budget = hw.device_hbm_bytes if hbm_budget is None else hbm_budget
    if hw.device_is_host:  # one memory holds both
        return mem.device_total + mem.host_total <= hw.host_memory_bytes
    return mem.device_total <= budget and mem.host_total <= hw.host_memory_bytes


def fits_memory(system: str, w: Workload, hw: HardwareProfile, opts: Options | None = None) -> bool:
    """``predict(...).fits`` without the simulation: the same memory estimate against the same limits."""
    opts = opts or Options()
    spec = system_spec(system, opts, w.shape.total_params(), world=w.chips)
    return _memory_fits(estimate_memory(w, hw, spec, opts), hw)


def _summarise(system: str, w: Workload, hw: HardwareProfile, opts: Options, spec: SystemSpec,
               b: _Builder, sched: Schedule, hbm_budget: float | None) -> Prediction:
    sh = w.shape
    it = ITERATIONS - 1
    t0, t1 = sched.finish[b.marks[it - 1].end], sched.finish[b.marks[it].end]
    period = t1 - t0
    # the exposed tail: device idle between the end of backward and the end of the next forward, i.e.
    # time the device waits for parameters (device Adam in that window is work, not tail)
    tail = sched.idle(COMPUTE, sched.finish[b.marks[it - 1].last_backward],
                      sched.finish[b.marks[it].last_forward])
    tokens = w.local_tokens * spec.grad_accum  # this rank's (1/sp of its group's sequences)
    model_flops = step_model_flops(sh, w.seq, tokens)  # attention over the global sequence
    hw_flops = step_hardware_flops(sh, w.seq, w.batch, spec.grad_accum, w.activation_checkpointing, w.sp)
    mem = estimate_memory(w, hw, spec, opts)
    fits = _memory_fits(mem, hw, hbm_budget)
    stages = {k: v for k, v in sched.kind_time(it).items() if v > 0}
    resource_s: dict[str, float] = {}
    resource_stages: dict[str, list[str]] = {}
    g = sched.graph
    for res, dur, kind, op_it in zip(g.resources, g.durations, g.kinds, g.iterations, strict=True):
        if op_it == it and res is not None and dur > 0:
            resource_s[res] = resource_s.get(res, 0.0) + dur
            kinds = resource_stages.setdefault(res, [])
            if kind not in kinds:
                kinds.append(kind)
    # device work per step: the compute stream's work of one iteration. Not the work that falls inside the
    # window [end of it-1, end of it]: the last simulated iteration's forward starts before that window
    # (it waits only for its layers' returns) and no later iteration fills its end, so the window's
    # share undercounts (gpt-1b at Fig 10: 75 ms of 111 ms where each iteration does 110 ms of work)
    busy = min(period, resource_s.get(COMPUTE, 0.0))
    notes = list(spec.notes)
    if b.host_shares_compute:
        notes.append(f"{b.share.cores:g} host core(s) per rank, compute on {b.share.compute_threads} thread(s): the "
                     "host's work (optimizer steps, casts) and the collectives run on the rank's compute core, not "
                     "beside it")
    if (hw.device_is_host and hw.compute_threads is not None and b.share.compute_threads is not None
            and b.share.compute_threads != hw.compute_threads):
        notes.append(f"compute rates measured at {hw.compute_threads} thread(s), the run computes on "
                     f"{b.share.compute_threads}: compute predicted at the measured rates (calibrate --threads "
                     f"{b.share.compute_threads} measures the run's)")
    if w.chips > 1 and not hw.has_interconnect():
        notes.append(f"{hw.name} has no interconnect bandwidths: the collectives of {w.chips} chips cost nothing here")
    return Prediction(
        system=system, model=sh.name, params=sh.total_params(), seq=w.seq, batch=w.batch,
        grad_accum=spec.grad_accum, hardware=hw.name, step_time_s=period, gpu_busy_s=busy,
        gpu_idle_s=max(0.0, period - busy), tail_s=max(0.0, tail), stage_s=stages,
        resource_s=resource_s, resource_stages=resource_stages,
        tokens_per_s=tokens / period, tflops=model_flops / period / 1e12,
        mfu=model_flops / period / hw.device_peak_flops, hfu=hw_flops / period / hw.device_peak_flops,
        peak_hbm_bytes=mem.device_total, host_bytes=mem.host_total, fits=fits, memory=mem.to_dict(),
        options={"bucket_size": spec.bucket_size, "device_tail_buckets": spec.device_tail_buckets,
                 "host_optimizer": spec.host_optimizer, "speculation": not spec.host_waits_backward,
                 "flow_layers": sorted(spec.flow_layers),
                 "grad_cast": "device" if spec.grad_device_cast else ("host" if spec.grad_host_cast else None),
                 "activation_checkpointing": w.activation_checkpointing,
                 "compute": "profiled" if b.costs.profiled is not None else "op-model",
                 **({"chips": w.chips, "ranks_per_node": w.ranks_per_node} if w.chips > 1 else {}),
                 **({"sp": w.sp, "offload_checkpoints": w.offload_checkpoints, "loss_tile": w.loss_tile}
                    if w.long_sequence else {})},
        notes=notes, chips=w.chips, aggregate_tokens_per_s=tokens / period * w.chips)
