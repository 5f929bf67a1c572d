"""The planner: choose the SuperOffload engine's knobs for one model, workload and machine.

Every choice is made by the cost model (``costmodel.predict``) or by a memory bound, and each one
leaves a sentence with its numbers in ``Plan.reasons``. The choices carry the engine's config names and
values (``superoffload.options``); ``Plan.engine_options()`` is the dict the engine config merges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import superoffload.units as units
from superoffload.options import PRECISION_BYTES, CastSide, HostOptimizer, Precision, RollbackMode
from superoffload.planner import buckets as bk
from superoffload.planner.costmodel import (
    Prediction,
    Workload,
    estimate_memory,
    host_share,
    layer_forward_seconds,
    predict,
    ulysses_block_seconds,
)
from superoffload.planner.hardware import ADAM_BYTES_PER_PARAM, GB, LEGACY_HOST_OPTIMIZERS, MB, HardwareProfile
from superoffload.planner.memory import (
    ADAM_STATE,
    BF16,
    OFFLOAD_WINDOW_BLOCKS,
    ROLLBACK_EXTRA_HOST_BYTES,
    act_bytes_per_token,
    block_transient,
    checkpoint_host_bytes,
    loss_transient,
    ulysses_kv_repeat,
)
from superoffload.planner.systems import UNFUSED_GRAD_COPY, UNFUSED_OUT_COPY, Options, system_spec
from superoffload.shapes import ModelShape

LINK_SATURATION = 0.90  # bucket = smallest transfer reaching this share of the link's peak
MIN_BUCKETS = 16  # keep at least this many buckets so transfers and host steps pipeline
STAGING_SHARE = 0.05  # bucket staging buffers may use at most this share of the HBM budget
TAIL_STATE_BYTES = ADAM_STATE + BF16  # fp32 master, m, v + the bf16 gradient, per tail param
FULL_COPY_MIN_GAIN = 0.01  # full_copy costs 12 B/param of host memory: take it only for a >= 1 % faster step
# the bucket sizes the cost model prices against the link rule's (step 1): the rule sees neither the
# per-collective latency of several ranks nor the per-bucket host cost; plus one bucket for the whole model
BUCKET_FACTORS = (0.5, 2, 4, 8)
BUCKET_MIN_GAIN = 0.01  # move off the link rule's bucket only for a >= 1 % faster predicted step
MIN_LOSS_TILE = 1024  # tokens: tiled_token_losses' own default tile; smaller tiles make thin GEMMs
# upload ring depths (engine config upload_slots) the cost model prices when host memory needs the ring
# instead of an upload buffer per bucket; the first is assumed until the bucket and tail are chosen
UPLOAD_SLOTS = (4, 2, 8, 16)
# validate-first instead of speculation (the paper's technique, the engine's default) only for a >= 1 %
# faster predicted step: within the model's resolution the two are the same step
SPECULATION_MIN_GAIN = 0.01
# replicated optimizer state costs chips x the host memory and host Adam work per rank: only for a >= 2 % faster step
REPLICATE_MIN_GAIN = 0.02
UPLOAD_SLOTS_MIN_GAIN = 0.01  # a deeper ring (more pinned slots) only for a >= 1 % faster predicted step
# GraceAdam (the paper's kernel, the engine's default, one fused pass) unless another kernel is >= 1 % cheaper
# per parameter as the engine runs it: a calibration's kernel rates differ by about that between runs
HOST_OPTIMIZER_MIN_GAIN = 0.01
# a model whose Adam state fits on the device is trained there whole (every bucket a tail bucket: the engine
# then costs about what torch's step does, with no host worker, link traffic or host memory to depend on)
# unless keeping some state on the host is predicted >= 1 % faster
ALL_DEVICE_MIN_GAIN = 0.01
# the cast side is chosen at the link rule's bucket, before the bucket, tail and speculation; the plan is made
# again with the other side when, at the final choices, that side is >= 1 % faster (``_recheck_cast``)
CAST_MIN_GAIN = 0.01


class PlanInfeasible(ValueError):
    """The request cannot fit; the message gives bytes needed vs available and what would help, and
    ``memory`` ("host" or "device"), ``need_bytes`` and ``available_bytes`` say it as data."""

    def __init__(self, message: str, memory: str = "", need_bytes: float = 0.0,
                 available_bytes: float = 0.0) -> None:
        super().__init__(message)
        self.memory, self.need_bytes, self.available_bytes = memory, need_bytes, available_bytes


# The plan's fields that are engine config keys (all in superoffload.options.SHARED_KEYS)
ENGINE_KEYS = ("bucket_size", "device_tail_buckets", "speculation", "rollback_mode", "grad_cast", "param_cast",
               "host_optimizer", "flow_layers", "flow_prefetch", "grad_accum", "upload_slots", "replicate")
CAST_KEYS = ("grad_cast", "param_cast")


@dataclass
class Plan:
    model: str
    seq: int
    batch: int
    hardware: str
    activation_checkpointing: bool
    bucket_size: int  # elements
    device_tail_buckets: int
    grad_cast: CastSide
    param_cast: CastSide
    flow_layers: list[int]
    host_optimizer: HostOptimizer
    rollback_mode: RollbackMode
    speculation: bool
    hbm_budget_bytes: float
    grad_accum: int = 1
    flow_prefetch: int = 1  # what the memory estimate assumed (the engine's default)
    predicted: Prediction | None = None
    reasons: list[str] = field(default_factory=list)
    chips: int = 1  # ranks the plan is for (one per chip; the engine shards over them)
    ranks_per_node: int | None = None
    # long sequences (model side, superoffload/sequence; not engine config keys): the Ulysses degree (chips / sp
    # data-parallel groups), activation checkpoints in host memory, tokens per tile of the loss (None: plain)
    sp: int = 1
    offload_checkpoints: bool = False
    loss_tile: int | None = None
    precision: Precision = "bf16"  # the training precision every prediction of the plan was made at
    # per choice (an ENGINE_KEYS name, "cast" for grad_cast + param_cast): what was chosen and its predicted
    # step, the runner-up and its predicted step (None where memory left no other), and why (``_alternative``)
    alternatives: dict[str, dict[str, Any]] = field(default_factory=dict)
    upload_slots: int = 0  # 0: an upload buffer per host bucket; k: a ring of k pinned slots
    replicate: bool = False  # several chips: every rank keeps the whole optimizer state (chosen by _choose_replication)
    # the host the plan was made for (None: the profile's defaults; costmodel.host_share): cores per rank, the
    # compute threads (a device that is the host) and the host optimizer's threads
    cores_per_rank: float | None = None
    compute_threads: int | None = None
    host_threads: int | None = None
    # every technique the plan turns off: knob -> {"technique", "reason", "force"} (``techniques_off``)
    off: dict[str, dict[str, str]] = field(default_factory=dict)

    def engine_options(self, precision: str = "bf16") -> dict[str, Any]:
        """The plan as engine config keys and values, to merge over the engine's defaults. With fp32
        weights there is nothing to cast, so ``grad_cast``/``param_cast`` stay the engine's."""
        out = {k: getattr(self, k) for k in ENGINE_KEYS}
        out["flow_layers"] = list(self.flow_layers)
        if precision == "fp32":
            for k in CAST_KEYS:
                del out[k]
        return out

    def options(self) -> Options:
        """The cost model's options for this plan (what ``predicted`` was computed with)."""
        return Options(**{**self.engine_options(), "flow_layers": tuple(self.flow_layers)}, precision=self.precision)

    def workload(self, shape: ModelShape) -> Workload:
        """The cost model's workload for this plan (``shape``: the model it was made for; a learned position
        table is extended to the plan's sequence as ``make_plan`` does)."""
        return Workload(positions_for(shape, self.seq), self.seq, self.batch, self.activation_checkpointing,
                        chips=self.chips, ranks_per_node=self.ranks_per_node, sp=self.sp,
                        offload_checkpoints=self.offload_checkpoints, loss_tile=self.loss_tile,
                        cores_per_rank=self.cores_per_rank, compute_threads=self.compute_threads,
                        host_threads=self.host_threads, precision=self.precision)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicted"] = self.predicted.to_dict() if self.predicted else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """A plan as ``to_dict`` wrote it, e.g. a run record's ``plan`` block. Blocks written before the
        shared vocabulary (``bucket_size_params``, ``host_adam`` = graceadam | ..., ``exact_mode``,
        ``cast_policy``) are read too, for one more release (docs/cost_model.md, "Field names")."""
        d = _legacy_plan_fields(dict(d))
        if isinstance(d.get("predicted"), Mapping):
            d["predicted"] = Prediction(**d["predicted"])
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown Plan fields: {sorted(unknown)}")
        return cls(**d)


def _legacy_plan_fields(d: dict[str, Any]) -> dict[str, Any]:
    if "bucket_size_params" in d:
        d["bucket_size"] = d.pop("bucket_size_params")
    if "host_adam" in d:
        kind = d.pop("host_adam")
        d["host_optimizer"] = LEGACY_HOST_OPTIMIZERS.get(kind, kind)
    if "exact_mode" in d:
        mode = d.pop("exact_mode")
        d["rollback_mode"] = "deferred" if mode == "none" else mode
    if "cast_policy" in d:
        policy = d.pop("cast_policy")
        d.setdefault("grad_cast", policy)
        d.setdefault("param_cast", policy)
    return d


def _check_workload(seq: int, batch: int, grad_accum: int, chips: int = 1, sp: int | None = None,
                    loss_tile: int | None = None) -> None:
    for name, value in (("seq", seq), ("batch", batch), ("grad_accum", grad_accum), ("chips", chips)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if sp is not None and (not isinstance(sp, int) or isinstance(sp, bool) or sp < 1):
        raise ValueError(f"sp must be a positive integer, got {sp!r}")
    if loss_tile is not None and (not isinstance(loss_tile, int) or isinstance(loss_tile, bool) or loss_tile < 0):
        raise ValueError(f"loss_tile must be a number of tokens >= 0 (0: the plain loss), got {loss_tile!r}")


def positions_for(shape: ModelShape, seq: int) -> ModelShape:
    """The model trained at ``seq``: a learned absolute position table needs ``seq`` rows when the named
    shape has fewer (the harness builds GPT with ``max_seq=seq``, the artifact passes
    ``--max-position-embeddings`` = the sequence length). Shorter sequences keep the named shape."""
    if shape.learned_positions and seq > shape.max_seq:
        return replace(shape, max_seq=seq)
    return shape


def _positions_reason(named: ModelShape, shape: ModelShape, seq: int) -> str:
    extra = shape.total_params() - named.total_params()
    return (f"Positions: {named.name} learns absolute positions and its {named.max_seq:,}-row table cannot "
            f"hold seq {seq:,}; planned with a {seq:,}-row table (as the harness builds the model): "
            f"+{units.count(extra)} params, {units.count(shape.total_params())} in all.")


def _initial_workload(shape: ModelShape, seq: int, batch: int, activation_checkpointing: bool, chips: int,
                      ranks_per_node: int | None, sp: int | None, offload_checkpoints: bool | None,
                      loss_tile: int | None, cores_per_rank: float | None = None, compute_threads: int | None = None,
                      host_threads: int | None = None, precision: Precision | None = None) -> Workload:
    """The request as a Workload: what is given is fixed, what is None starts off (SP 1, checkpoints on the
    device, the plain loss) for ``_choose_long_sequence`` to turn on. ``precision`` selects a profiled
    compute entry of that precision (a bf16 plan is not priced on an fp32 profile's compute)."""
    return Workload(shape, seq, batch, activation_checkpointing, chips=chips, ranks_per_node=ranks_per_node,
                    sp=sp or 1, offload_checkpoints=bool(offload_checkpoints), loss_tile=loss_tile or None,
                    cores_per_rank=cores_per_rank, compute_threads=compute_threads, host_threads=host_threads,
                    precision=precision)


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def host_optimizer_seconds_per_param(hw: HardwareProfile, kind: str, threads: int | None = None) -> float:
    """Seconds per parameter of one host step with `kind` as the engine runs it (at `threads` threads): GraceAdam
    in one fused pass; torch's and DeepSpeed's kernels with the gradient and output copies the engine adds
    around them (systems.UNFUSED_*)."""
    extra = 0.0 if kind == "grace" else UNFUSED_GRAD_COPY + UNFUSED_OUT_COPY
    return (ADAM_BYTES_PER_PARAM + extra) / (hw.host_adam_rate(kind, threads) * 1e9)


def best_host_optimizer(hw: HardwareProfile, threads: int | None = None) -> str:
    """GraceAdam, unless another kernel of the profile is >= HOST_OPTIMIZER_MIN_GAIN cheaper per parameter as
    the engine runs it (``host_optimizer_seconds_per_param``)."""
    cost = {k: host_optimizer_seconds_per_param(hw, k, threads) for k in hw.host_adam_gbps}
    fastest = min(cost, key=lambda k: (cost[k], k != "grace"))
    if "grace" in cost and cost[fastest] > cost["grace"] * (1 - HOST_OPTIMIZER_MIN_GAIN):
        return "grace"
    return fastest


def _choose_host_optimizer(w: Workload, hw: HardwareProfile, requested: str | None, reasons: list[str],
                           alts: dict[str, dict[str, Any]]) -> str:
    """The host Adam kernel (``best_host_optimizer`` at the rank's host threads, or the caller's), with its
    reason and runner-up (priced on the final plan by ``_price_alternatives``)."""
    share = host_share(w, hw)
    cost = {k: host_optimizer_seconds_per_param(hw, k, share.host_threads) for k in hw.host_adam_gbps}
    kind = requested or best_host_optimizer(hw, share.host_threads)
    if kind not in cost:
        raise ValueError(f"host_optimizer {kind!r}: profile {hw.name!r} has rates for {', '.join(sorted(cost))}")
    others = sorted((k for k in cost if k != kind), key=lambda k: cost[k])
    rate = hw.host_adam_rate(kind, share.host_threads)
    priced = ", ".join(f"{k} {cost[k] * 1e12:.0f}" for k in sorted(cost, key=lambda k: cost[k]))
    why = ("as requested" if requested else
           "GraceAdam, one fused pass, unless another kernel is >= "
           f"{HOST_OPTIMIZER_MIN_GAIN:.0%} cheaper per parameter as the engine runs it")
    reasons.append(
        f"Host Adam kernel: {kind} at {rate:.0f} GB/s effective at {share.host_threads} thread(s) "
        f"({rate / ADAM_BYTES_PER_PARAM:.2f} Gparam/s at 28 B/param; {why}). Per parameter as the engine runs "
        f"each (torch and cpuadam unfused: +{UNFUSED_GRAD_COPY + UNFUSED_OUT_COPY:.0f} B for a gradient copy and an "
        f"output copy), in ps: {priced}.")
    alts["host_optimizer"] = {"chosen": kind, "step_s": 0.0, "runner_up": others[0] if others else None,
                              "runner_up_step_s": 0.0 if others else None, "why": why}
    return kind


def _host_reason(w: Workload, hw: HardwareProfile) -> str:
    share = host_share(w, hw)
    given = [f"{k.replace('_', ' ')} {v:g}" for k, v in (("cores_per_rank", w.cores_per_rank),
                                                          ("compute_threads", w.compute_threads),
                                                          ("host_threads", w.host_threads)) if v is not None]
    source = f"as the run sets them ({', '.join(given)})" if given else "the profile's defaults"
    effect = ("host Adam, casts and the collectives' threads overlap the compute" if share.own_core else
              "host Adam, casts and the collectives add to the step: speculation, tail buckets and small buckets "
              "buy no overlap here")
    return f"Host cores, {source}: {share.describe()}; so {effect}."


def saturating_bucket_bytes(hw: HardwareProfile, share: float = LINK_SATURATION) -> int:
    """Smallest transfer size whose D2H and H2D bandwidth both reach ``share`` of their peaks."""
    size = 1.0 * MB
    while size < 16 * 2**30:
        if all(hw.link(d).bandwidth(size) >= share * hw.link(d).peak() for d in ("d2h", "h2d")):
            return int(size)
        size *= 2 ** 0.125
    return int(size)


def make_plan(shape: ModelShape, seq: int, batch: int, hardware: HardwareProfile,
              activation_checkpointing: bool = True, hbm_budget: float | None = None,
              grad_accum: int = 1, host_optimizer: str | None = None, chips: int = 1,
              ranks_per_node: int | None = None, sp: int | None = None, offload_checkpoints: bool | None = None,
              loss_tile: int | None = None, precision: Precision = "bf16", cores_per_rank: float | None = None,
              compute_threads: int | None = None, host_threads: int | None = None,
              replicate: bool | None = None, cast: CastSide | None = None) -> Plan:
    """Choose flow layers, bucket size, device tail, casting and rollback mode for one rank of ``chips``
    ranks: ``chips / sp`` data-parallel groups (each its own micro-batch ``batch``) of ``sp`` Ulysses
    sequence-parallel ranks; each host holds 1/chips of the state. ``precision``: the training precision
    the run uses (fp32 moves 4 B/param where bf16 moves 2 and casts nothing; the costs differ, so do the
    choices).

    Long sequences: ``sp``, ``offload_checkpoints`` and ``loss_tile`` (tokens per tile; 0: the plain
    loss) are taken as given; those left None the planner turns on, in the order of
    ``_choose_long_sequence``, when the device memory does not fit without them.

    The host: ``cores_per_rank`` (a ``--bind-cores`` slice), ``compute_threads`` (a device that is the host:
    torch's threads) and ``host_threads`` (the engine's ``host_threads``), as the run sets them; None takes the
    profile's defaults (``costmodel.host_share``). They price host Adam at the threads the worker has and decide
    whether its work overlaps the compute.

    ``replicate``: with several chips, whether every rank keeps the whole optimizer state (engine config
    ``replicate``); None plans both and keeps the faster (``_choose_replication``).

    ``cast``: the side of both casts (engine config ``grad_cast`` and ``param_cast``); None chooses it
    (``_choose_cast``, then ``_recheck_cast``)."""
    def again(rep: bool | None = replicate, side: CastSide | None = cast) -> Plan:
        return make_plan(shape, seq, batch, hardware, activation_checkpointing=activation_checkpointing,
                         hbm_budget=hbm_budget, grad_accum=grad_accum, host_optimizer=host_optimizer, chips=chips,
                         ranks_per_node=ranks_per_node, sp=sp, offload_checkpoints=offload_checkpoints,
                         loss_tile=loss_tile, precision=precision, cores_per_rank=cores_per_rank,
                         compute_threads=compute_threads, host_threads=host_threads, replicate=rep, cast=side)
    if replicate is None:
        return _choose_replication(lambda rep: again(rep=rep), chips)
    _check_workload(seq, batch, grad_accum, chips, sp, loss_tile)
    hw = hardware
    named, shape = shape, positions_for(shape, seq)
    w = _initial_workload(shape, seq, batch, activation_checkpointing, chips, ranks_per_node, sp,
                          offload_checkpoints, loss_tile, cores_per_rank, compute_threads, host_threads, precision)
    budget = float(hw.device_hbm_bytes if hbm_budget is None else hbm_budget)
    n = shape.total_params()
    reasons: list[str] = []
    alts: dict[str, dict[str, Any]] = {}
    kind = _choose_host_optimizer(w, hw, host_optimizer, reasons, alts)
    if hw.device_is_host or any(v is not None for v in (cores_per_rank, compute_threads, host_threads)):
        reasons.append(_host_reason(w, hw))
    if shape is not named:
        reasons.append(_positions_reason(named, shape, seq))
    chips_at = len(reasons)  # the chips line goes here once the SP degree is known (step 3)

    # 1. bucket size from the link curve, bounded by pipelining and staging memory
    bucket = _choose_bucket(n, hw, budget, reasons, chips)

    # 2. host memory and rollback mode
    if precision not in PRECISION_BYTES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_BYTES)}, got {precision!r}")
    opts = Options(bucket_size=bucket, host_optimizer=kind, grad_accum=grad_accum, precision=precision,
                   replicate=replicate and chips > 1)
    fit = _fit_host_memory(w, hw, opts, reasons)
    rollback = "deferred"
    opts = replace(opts, rollback_mode=rollback)

    # 3. long-sequence pieces, then flow layers, if HBM forces them
    w = _choose_long_sequence(w, hw, opts, budget, reasons, sp is None, offload_checkpoints is None,
                              loss_tile is None)
    if chips > 1:
        reasons.insert(chips_at, _chips_reason(w, hw))
    flow = _choose_flow(w, hw, opts, budget, reasons)
    opts = replace(opts, flow_layers=tuple(flow))

    _flow_alternative(w, hw, opts, budget, flow, alts)

    # 4. casting, by the cost model, among the sides host memory allows (each with its upload ring, if any)
    forced_cast = cast
    cast, slots = _choose_cast(w, hw, opts, reasons, alts, fit, forced_cast)
    opts = replace(opts, grad_cast=cast, param_cast=cast, upload_slots=slots)

    # 5. device tail buckets: minimise the step under the HBM budget
    tail, pred = _choose_tail(w, hw, opts, budget, reasons, alts)
    opts = replace(opts, device_tail_buckets=tail)

    # 6. the bucket size priced: the link rule's against larger and smaller ones and one bucket (each with
    # its own best tail), by the predicted step; with several ranks each bucket is a collective
    bucket, tail, pred = _refine_bucket(w, hw, opts, budget, pred, reasons, alts)
    opts = replace(opts, bucket_size=bucket, device_tail_buckets=tail)
    slots, pred = _choose_upload_slots(w, hw, opts, pred, reasons, alts)
    opts = replace(opts, upload_slots=slots)

    # 7. speculation, priced: it overlaps the host step with backward where the host worker has a processor of
    # its own (a GPU's host; on a device that is the host, a core beside the compute threads, costmodel.host_share);
    # where it has none, the speculative pass and the deferred commit only add host work to the step, and where
    # the host binds validating first can be faster too. Both give the same bits; the predicted step decides
    # (within SPECULATION_MIN_GAIN it speculates)
    rollback, pred = _prefer_full_copy(w, hw, replace(opts, rollback_mode=rollback), pred, reasons, alts)
    on = pred
    # validate-first at its own best bucket (and tail): its host step waits for every bucket's launch, so the
    # per-bucket cost weighs on it differently, and comparing it at the bucket priced speculating missed the
    # pair (larger buckets, validate-first) where it was the faster one
    spoken: list[str] = []
    off_alts: dict[str, dict[str, Any]] = {}
    off_opts = replace(opts, rollback_mode="deferred", speculation=False)
    off_bucket, off_tail, off = _refine_bucket(w, hw, off_opts, budget, predict("superoffload", w, hw, off_opts),
                                               spoken, off_alts)
    if (off_bucket, off_tail) != (bucket, tail):   # and speculation at that bucket, for the same choice of sizes
        at_off = predict("superoffload", w, hw, replace(opts, rollback_mode=rollback, bucket_size=off_bucket,
                                                        device_tail_buckets=off_tail))
        if at_off.step_time_s < on.step_time_s * (1 - BUCKET_MIN_GAIN):
            reasons.append(f"Bucket re-priced: {off_bucket / 1e6:.2f}M params with {off_tail} tail bucket(s), the "
                           f"best validating first, is also faster speculating ({at_off.step_time_s * 1e3:.1f} ms vs "
                           f"{on.step_time_s * 1e3:.1f} ms).")
            alts["bucket_size"] = _alternative(off_bucket, at_off, bucket, on, "faster speculating too, at the size "
                                               "validate-first's search reached from the first choice")
            alts["device_tail_buckets"] = _alternative(off_tail, at_off, tail, on, "the tail validate-first's search "
                                                       "chose for this bucket size, priced speculating")
            bucket, tail, on = off_bucket, off_tail, at_off
            opts = replace(opts, bucket_size=bucket, device_tail_buckets=tail)
            pred = on
    if hw.device_is_host:
        # one memory system: the worker's passes share the bandwidth the compute uses, which the model does not
        # charge, so a predicted tie goes to validate-first, one host pass per bucket instead of two
        speculation = on.step_time_s <= off.step_time_s * (1 - SPECULATION_MIN_GAIN)
    else:
        speculation = off.step_time_s >= on.step_time_s * (1 - SPECULATION_MIN_GAIN)
    shares = hw.device_is_host and not host_share(w, hw).own_core
    if speculation:
        alts["speculation"] = _alternative(True, on, False, off, "the host worker overlaps backward; " + (
            f"speculating is >= {SPECULATION_MIN_GAIN:.0%} faster (on a device that is the host a tie validates first)"
            if hw.device_is_host else f"validate-first only for a >= {SPECULATION_MIN_GAIN:.0%} faster step"))
    else:
        if rollback != "deferred":  # validate-first rolls nothing back: full_copy's 12 B/param buy nothing
            rollback = "deferred"
            reasons[:] = [r for r in reasons if not r.startswith("Rollback mode: 'full_copy' instead")]
        # the bucket (and its tail) were priced speculating: validate-first's own, priced above
        bucket, tail = off_bucket, off_tail
        alts.update(off_alts)
        opts = replace(opts, bucket_size=bucket, device_tail_buckets=tail)
        reasons[:] = [r + " (Priced again validating first, below.)" if r.startswith("Bucket priced") else r
                      for r in reasons]
        reasons.extend(r.replace("Bucket priced:", "Bucket priced validating first:", 1) for r in spoken)
        pred = off
        alts["rollback_mode"] = _alternative("deferred", off, why="speculation is off: nothing to roll back")
        why = ("the host worker has no core beside the compute threads: the speculative pass and the deferred commit "
               "only add to the step" if shares else
               f"the device is the host and speculating is not >= {SPECULATION_MIN_GAIN:.0%} faster: validate-first "
               "does one host pass per bucket instead of two on the memory the compute uses" if hw.device_is_host else
               "the host binds: the speculative pass and the deferred commit cost more host time than the overlap "
               "saves")
        alts["speculation"] = _alternative(False, off, True, on, why)
        reasons.append(f"Speculation: off: {why} (predicted step {off.step_time_s * 1e3:.1f} ms validating first vs "
                       f"{on.step_time_s * 1e3:.1f} ms speculating, same bits). To see it work anyway (commit and "
                       "rollback counts in the record): `-o speculation=true` (bench run), `speculation: true` "
                       "(engine config).")
    _price_alternatives(w, hw, replace(opts, rollback_mode=rollback, speculation=speculation), pred, alts)
    reasons.append(f"Hardware: {hw.name}: {hw.source}.")
    plan = Plan(model=shape.name, seq=seq, batch=batch, hardware=hw.name,
                activation_checkpointing=activation_checkpointing, bucket_size=bucket,
                device_tail_buckets=tail, grad_cast=cast, param_cast=cast, flow_layers=list(flow),
                host_optimizer=kind, rollback_mode=rollback, speculation=speculation, hbm_budget_bytes=budget,
                upload_slots=slots, replicate=opts.replicate,
                grad_accum=grad_accum, flow_prefetch=opts.flow_prefetch, predicted=pred, reasons=reasons,
                chips=chips, ranks_per_node=ranks_per_node, sp=w.sp, offload_checkpoints=w.offload_checkpoints,
                loss_tile=w.loss_tile, precision=precision, alternatives=alts, cores_per_rank=cores_per_rank,
                compute_threads=compute_threads, host_threads=host_threads)
    plan.off = techniques_off(plan, hw, requested={"sp": sp, "offload_checkpoints": offload_checkpoints,
                                                   "loss_tile": loss_tile, "host_optimizer": host_optimizer})
    reasons.extend(f"Off: {o['technique']}: {o['reason']}. To turn it on: {o['force']}."
                   for key, o in plan.off.items() if key != "speculation")  # speculation's own line says it
    return plan if forced_cast is not None else _recheck_cast(plan, lambda side: again(side=side))


def _recheck_cast(plan: Plan, plan_with: Callable[[CastSide], Plan]) -> Plan:
    """The cast side was chosen at the link rule's bucket, before the bucket, tail and speculation were; where
    at the plan's final choices the other side is >= CAST_MIN_GAIN faster (``Plan.alternatives``, priced on
    the final plan), the plan is made again with that side (its own bucket, tail and speculation) and the
    faster of the two kept, in tokens/s per chip. (On the 2-core Xeon, gpt-small bf16 at two ranks: device
    casts won at the first, small bucket, where many bf16 reductions cost more; host casts were 12 % faster at
    the bucket the plan went on to choose.)"""
    alt = plan.alternatives.get("cast")
    if (not alt or alt["runner_up_step_s"] is None
            or alt["runner_up_step_s"] >= alt["step_s"] * (1 - CAST_MIN_GAIN)):
        return plan
    try:
        other = plan_with(alt["runner_up"])
    except PlanInfeasible:  # the other side's own bucket, tail or long-sequence pieces do not fit: keep this one
        return plan
    assert plan.predicted is not None and other.predicted is not None
    if other.predicted.tokens_per_s * (1 - CAST_MIN_GAIN) <= plan.predicted.tokens_per_s:
        return plan
    why = (f"planned again: at the bucket, tail and speculation planned with casts on the {plan.grad_cast}, the "
           f"{other.grad_cast} side was >= {CAST_MIN_GAIN:.0%} faster; each side planned through, the faster kept")
    other.alternatives["cast"] = _alternative(other.grad_cast, other.predicted, plan.grad_cast, plan.predicted, why)
    line = (f"Casting: {other.grad_cast}, {why} (predicted {other.predicted.step_time_s * 1e3:.1f} ms vs "
            f"{plan.predicted.step_time_s * 1e3:.1f} ms planned with casts on the {plan.grad_cast}).")
    other.reasons[:] = [line if r.startswith("Casting:") else r for r in other.reasons]
    return other


def _choose_replication(plan_with: Callable[[bool], Plan], chips: int) -> Plan:
    """With several chips: the plan with the optimizer state sharded over the ranks and the one with every
    rank holding all of it (each bucket all-reduced and stepped whole, no weight all-gather), each planned
    through (bucket, tail, casts, speculation and long-sequence pieces chosen for it); the replicated one only
    where it fits and is >= REPLICATE_MIN_GAIN faster, for it costs chips x the host memory and host Adam work
    per rank. Faster in tokens/s per chip, not step time: the two may choose different SP degrees, and so train
    different numbers of tokens per step."""
    sharded = plan_with(False)
    if chips == 1:
        return sharded
    try:
        rep = plan_with(True)
    except PlanInfeasible as e:
        why = (f"replicated does not fit in {e.memory} memory ({_gb(e.need_bytes)} needed, "
               f"{_gb(e.available_bytes)} usable)")
        sharded.alternatives["replicate"] = _alternative(False, sharded.predicted, True, None, why)
        sharded.reasons.insert(-1, f"Optimizer state: sharded over the {chips} ranks; {why}.")
        return sharded
    s, r = sharded.predicted.tokens_per_s, rep.predicted.tokens_per_s
    take = s <= r * (1 - REPLICATE_MIN_GAIN)
    chosen, other = (rep, sharded) if take else (sharded, rep)
    why = (f"replicated is >= {REPLICATE_MIN_GAIN:.0%} faster: one all-reduce per bucket and no all-gather cost less "
           f"than stepping 1/{chips} of the state saves" if take else
           f"sharded holds 1/{chips} of the host state and Adam work per rank; replicated (one all-reduce per bucket, "
           f"no all-gather) is not >= {REPLICATE_MIN_GAIN:.0%} faster")
    chosen.alternatives["replicate"] = _alternative(chosen.replicate, chosen.predicted, other.replicate,
                                                    other.predicted, why)
    sp = f", which plans sp={other.sp}" if other.sp != chosen.sp else ""
    chosen.reasons.insert(-1, f"Optimizer state: {'replicated on every rank' if take else 'sharded over the ranks'}: "
                              f"{why} (predicted {chosen.predicted.tokens_per_s:,.0f} tokens/s per chip vs "
                              f"{other.predicted.tokens_per_s:,.0f} {'sharded' if take else 'replicated'}{sp}; same "
                              f"bits at two ranks). To force it: `-o replicate={str(not take).lower()}` (bench run), "
                              f"`replicate: {str(not take).lower()}` (engine config).")
    return chosen


def _ms(s: float | None) -> str:
    return "not priced" if s is None else f"{s * 1e3:.1f} ms"


def techniques_off(plan: Plan, hw: HardwareProfile,
                   requested: Mapping[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """Every technique the plan turns off (or, for casting, the side it does not take): knob -> the technique's
    name, the one-line reason, and how to force it on (`bench run -o`, the engine config, or the harness flag
    for the model-side pieces). What the caller fixed (``requested``) is reported as requested."""
    requested = requested or {}
    alts = plan.alternatives
    off: dict[str, dict[str, str]] = {}
    pred = plan.predicted
    hbm = (f" (device needs {_gb(pred.peak_hbm_bytes)} of {_gb(plan.hbm_budget_bytes)})" if pred is not None
           else "")

    def runner(key: str) -> str:
        a = alts.get(key) or {}
        if a.get("runner_up") is None:
            return ""
        return (f" (predicted step {_ms(a.get('step_s'))}; with {key}={_value(a['runner_up'])} "
                f"{_ms(a.get('runner_up_step_s'))})")

    if not plan.speculation:
        off["speculation"] = {
            "technique": "speculation-then-validation",
            "reason": (alts.get("speculation") or {}).get("why", "off") + runner("speculation"),
            "force": "`-o speculation=true` (bench run), `speculation: true` (engine config)"}
    if plan.device_tail_buckets == 0:
        off["device_tail_buckets"] = {
            "technique": "bucketization repartitioning (device tail buckets)",
            "reason": (alts.get("device_tail_buckets") or {}).get("why", "none chosen") + runner("device_tail_buckets"),
            "force": "`-o device_tail_buckets=N` (bench run), `device_tail_buckets: N` (engine config): the last N "
                     "buckets of backward step on the device"}
    if not plan.flow_layers:
        off["flow_layers"] = {
            "technique": "adaptive weight offloading (weight flow)",
            "reason": (alts.get("flow_layers") or {}).get("why", "every layer fits on the device") + hbm,
            "force": "`-o flow_layers=[L,...]` (bench run), `flow_layers: [L, ...]` (engine config): those blocks' "
                     "weights live on the host and are fetched ahead of use"}
    if plan.precision == "fp32":
        off["cast"] = {"technique": "Superchip-aware casting (grad_cast / param_cast)",
                       "reason": "fp32 training: weights and gradients move as they are (4 B/param), nothing is cast",
                       "force": "train in bf16 or fp16 (`--dtype bf16`), then `-o grad_cast=host -o param_cast=host` "
                                "(or device)"}
    else:
        other = "host" if plan.grad_cast == "device" else "device"
        off["cast"] = {"technique": f"casting on the {other}",
                       "reason": f"casts on the {plan.grad_cast}: " + (alts.get("cast") or {}).get("why", "")
                       + runner("cast"),
                       "force": f"`-o grad_cast={other} -o param_cast={other}` (bench run), `grad_cast: {other}` and "
                                f"`param_cast: {other}` (engine config)"}
    if plan.host_optimizer != "grace" and "grace" in hw.host_adam_gbps:
        off["host_optimizer"] = {
            "technique": "GraceAdam (the fused host Adam kernel)",
            "reason": f"{plan.host_optimizer} " + ("as requested" if requested.get("host_optimizer") else
                                                   "is cheaper per parameter on this profile")
                      + runner("host_optimizer"),
            "force": "`-o host_optimizer=grace` (bench run), `host_optimizer: grace` (engine config)"}
    # the model-side pieces of long sequences: the planner turns them on only where device memory needs them
    fits = ("device memory fits without it" if plan.flow_layers == [] else
            f"weight flow alone ({len(plan.flow_layers)} layers) fits device memory") + hbm
    if plan.chips > 1 and plan.sp == 1:
        off["sp"] = {"technique": "Ulysses sequence parallelism",
                     "reason": "as requested" if requested.get("sp") is not None else fits,
                     "force": "`bench run --sp K` (K divides the ranks and the heads), `make_plan(sp=K)`"}
    if plan.activation_checkpointing and not plan.offload_checkpoints:
        off["offload_checkpoints"] = {
            "technique": "activation checkpoints in host memory",
            "reason": "as requested" if requested.get("offload_checkpoints") is not None else fits,
            "force": "`bench run --offload-checkpoints`, `make_plan(offload_checkpoints=True)`"}
    if plan.loss_tile is None:
        off["loss_tile"] = {"technique": "the tiled loss",
                            "reason": "as requested" if requested.get("loss_tile") is not None else fits,
                            "force": "`bench run --loss-tile T` (tokens per tile), `make_plan(loss_tile=T)`"}
    return off


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:,}" if isinstance(v, int) else str(v)


def _price_alternatives(w: Workload, hw: HardwareProfile, opts: Options, pred: Prediction,
                        alts: dict[str, dict[str, Any]]) -> None:
    """Each choice was priced when it was made, before the later ones; price every chosen value and runner-up
    again on the final plan, changing that one knob (the bucket's runner-up with its own tail), so that
    each pair compares like with like and the chosen step is the plan's."""
    for key, alt in alts.items():
        if alt["step_s"] is not None:
            alt["step_s"] = pred.step_time_s
        if alt["runner_up_step_s"] is None:
            continue
        knob = {"grad_cast": alt["runner_up"], "param_cast": alt["runner_up"]} if key == "cast" \
            else {key: alt["runner_up"], **alt.get("runner_up_with", {})}
        alt["runner_up_step_s"] = predict("superoffload", w, hw, replace(opts, **knob)).step_time_s


def _alternative(chosen: Any, chosen_pred: Prediction | None, runner_up: Any = None,
                 runner_pred: Prediction | None = None, why: str = "") -> dict[str, Any]:
    """One choice for ``Plan.alternatives``: values as the engine config spells them, steps in seconds."""
    return {"chosen": chosen, "step_s": chosen_pred.step_time_s if chosen_pred else None,
            "runner_up": runner_up, "runner_up_step_s": runner_pred.step_time_s if runner_pred else None,
            "why": why}


def _chips_reason(w: Workload, hw: HardwareProfile) -> str:
    per_node = w.ranks_per_node or min(w.chips, max(1, hw.chips_per_node))
    nodes = math.ceil(w.chips / per_node)
    ranks = (f"{w.chips} data-parallel ranks" if w.sp == 1
             else f"{w.chips} ranks = {w.dp} data-parallel group{'s' if w.dp > 1 else ''} x sp {w.sp}")
    if not hw.has_interconnect():
        return (f"Chips: {ranks}; {hw.name} has no interconnect numbers, so their "
                "collectives are not charged.")
    across = nodes > 1
    measured = (hw.collectives or {}).get("inter" if across else "intra")
    if measured is not None:
        lat, gbps_m = measured["latency_s"], measured["gbps"]
        link = (f"as calibrated on {measured['world']} {measured['backend']} ranks (reduce-scatter "
                f"{lat['reduce_scatter'] * 1e6:.0f} us per ring step + {gbps_m['reduce_scatter']:.2f} GB/s, "
                f"all-gather {lat['all_gather'] * 1e6:.0f} us + {gbps_m['all_gather']:.2f} GB/s)")
    elif hw.intra_node_gbps is None or hw.inter_node_gbps is None:
        link = "with no numbers for this link class, so not charged"
    else:
        gbps = min(hw.intra_node_gbps, hw.inter_node_gbps) if across else hw.intra_node_gbps
        link = f"at {gbps:.0f} GB/s per rank"
    return (f"Chips: {ranks} ({per_node} per node, {nodes} node{'s' if nodes > 1 else ''}); "
            f"each host holds 1/{w.chips} of the fp32 master and Adam state and steps it; per bucket a "
            f"reduce-scatter of the gradient (its dtype: see Casting) and an all-gather of the weights, per "
            f"step one all-reduce of the norm, over "
            f"{'the inter-node network' if across else 'the intra-node links'} {link}.")


def _choose_bucket(params: int, hw: HardwareProfile, budget: float, reasons: list[str], chips: int = 1) -> int:
    """Elements per bucket: the smallest copy that saturates the link, capped so there are at least
    MIN_BUCKETS buckets to pipeline and the staging buffers stay under STAGING_SHARE of the HBM budget.
    With several chips a rank copies 1/chips of each bucket, so the bucket is chips times larger for the
    copied shard to reach the same size (within the same caps)."""
    sat = saturating_bucket_bytes(hw)
    bucket = max(1, sat // 4) * chips  # fp32 gradient elements (device-cast policy moves 4 B/param)
    bound_pipe = max(1, params // MIN_BUCKETS)
    bound_mem = _staging_cap(budget)
    chosen = min(bucket, bound_pipe, bound_mem)
    shard = f" (x{chips} chips: each rank copies a 1/{chips} shard)" if chips > 1 else ""
    reasons.append(
        f"Bucket: {sat / MB:.0f} MiB is the smallest copy reaching {LINK_SATURATION:.0%} of the link peak "
        f"(D2H {hw.link('d2h').peak():.0f} GB/s, {hw.link('d2h').bandwidth(sat):.0f} GB/s at that size) "
        f"= {bucket / 1e6:.1f}M fp32 params{shard}"
        + (f"; capped to {chosen / 1e6:.1f}M so there are >= {MIN_BUCKETS} buckets and staging stays "
           f"under {STAGING_SHARE:.0%} of HBM" if chosen < bucket else "") + ".")
    return chosen


def _refine_bucket(w: Workload, hw: HardwareProfile, opts: Options, budget: float, pred: Prediction,
                   reasons: list[str], alts: dict[str, dict[str, Any]]) -> tuple[int, int, Prediction]:
    """The link rule's bucket (step 1) against BUCKET_FACTORS times it and one bucket for the whole model,
    each with its own best device tail, under the same staging and HBM bounds: the rule sees neither the
    latency every bucket's collectives pay with several ranks (calibrated: HardwareProfile.collectives) nor
    the per-bucket host cost; the cost model prices both. Returns (bucket, tail, prediction)."""
    base, n = opts.bucket_size, w.shape.total_params()
    cap = _staging_cap(budget)
    results: dict[int, tuple[int, Prediction]] = {base: (opts.device_tail_buckets, pred)}
    _, tail_params = bk.split_params(w.shape, opts.device_tail_buckets, base)
    for b in sorted({max(1, min(n, int(base * f))) for f in BUCKET_FACTORS} | {n}):
        # priced with about the same tail params (its own tail is searched once it wins: a tail search
        # per candidate would multiply the planner's time)
        t = _tail_holding(w, b, tail_params)
        o = replace(opts, bucket_size=b, device_tail_buckets=t)
        if b in results or b > cap:
            continue
        # a tail that filled HBM at the rule's bucket may not fit in larger buckets' granularity: one bucket
        # fewer until it does (skipping the candidate instead kept a GPU plan at thousands of small buckets)
        while o.device_tail_buckets and _device_need(w, hw, o) > budget:
            o = replace(o, device_tail_buckets=o.device_tail_buckets - 1)
        if _device_need(w, hw, o) > budget:
            continue
        t = o.device_tail_buckets
        results[b] = (t, predict("superoffload", w, hw, o))
    best = min(results, key=lambda b: (results[b][1].step_time_s, b))
    if results[best][1].step_time_s > pred.step_time_s * (1 - BUCKET_MIN_GAIN):
        best = base
    tail_alts: dict[str, dict[str, Any]] = {}
    if best != base:
        results[best] = _choose_tail(w, hw, replace(opts, bucket_size=best, device_tail_buckets=0), budget, [],
                                     tail_alts)
    others = [b for b in results if b != best]
    runner = min(others, key=lambda b: results[b][1].step_time_s) if others else None
    tail, p = results[best]
    priced = ", ".join(f"{b / 1e6:.2f}M {results[b][1].step_time_s * 1e3:.1f} ms" for b in sorted(results))
    collectives = (f"; with {w.chips} ranks every bucket is a reduce-scatter and an all-gather"
                   + (" (their latency calibrated)" if hw.collectives else "") if w.chips > 1 else "")
    reasons.append(
        f"Bucket priced: {best / 1e6:.2f}M params ({math.ceil(n / best)} bucket(s)), predicted step "
        f"{p.step_time_s * 1e3:.1f} ms; candidates {priced}{collectives}."
        + ("" if best == base else f" The link rule's {base / 1e6:.2f}M predicts {pred.step_time_s * 1e3:.1f} ms"
           f"; device tail re-chosen for it: {tail} bucket(s)."))
    alts["bucket_size"] = _alternative(best, p, runner, results[runner][1] if runner else None,
                                       "the fastest predicted step of the candidates (each with its best "
                                       f"tail); the link rule's unless another is >= {BUCKET_MIN_GAIN:.0%} faster")
    if runner is not None:
        alts["bucket_size"]["runner_up_with"] = {"device_tail_buckets": results[runner][0]}
    alts.update(tail_alts)
    return best, tail, p


def _tail_holding(w: Workload, bucket: int, params: int) -> int:
    """The fewest last buckets of size `bucket` holding at least `params` params (0 for none)."""
    if params <= 0:
        return 0
    held = 0
    for i, b in enumerate(reversed(bk.pack_buckets(w.shape, bucket)), 1):
        held += sum(p for _, p in b)
        if held >= params:
            return i
    return i


def _staging_cap(budget: float) -> int:
    """Elements per bucket whose staging buffers (two bf16 + fp32 gradient slots, two fp32 returns) stay
    under STAGING_SHARE of the HBM budget."""
    return max(1, int(STAGING_SHARE * budget / (2 * (BF16 + 4) + 2 * 4)))


def _choose_cast(w: Workload, hw: HardwareProfile, opts: Options, reasons: list[str],
                 alts: dict[str, dict[str, Any]], fit: Mapping[str, int],
                 forced: CastSide | None = None) -> tuple[str, int]:
    """Where bf16 <-> fp32 casts run, the same side for gradients and parameters: both are simulated and
    the faster wins (a tie goes to the device), among the sides host memory allows (``fit``: side ->
    the upload ring it needs, ``_fit_host_memory``); ``forced``: that side (make_plan's ``cast``). Returns
    (side, upload_slots)."""
    if forced is not None and forced not in fit:
        raise PlanInfeasible(f"cast={forced!r}: with casts on the {forced} the host buffers do not fit host "
                             f"memory; leave cast to the planner or cast on the {next(iter(fit))}", memory="host")
    if forced is not None and opts.precision != "fp32":
        preds = {c: predict("superoffload", w, hw, replace(opts, grad_cast=c, param_cast=c, upload_slots=fit[c]))
                 for c in fit}
        other = next((c for c in preds if c != forced), None)
        alts["cast"] = _alternative(forced, preds[forced], other, preds.get(other) if other else None,
                                    "asked for (make_plan's cast)")
        reasons.append(f"Casting: {forced}: asked for.")
        return forced, fit[forced]
    if opts.precision == "fp32":
        reasons.append("Casting: none: fp32 weights and gradients move as they are (grad_cast / param_cast "
                       "keep the engine's defaults).")
        alts["cast"] = _alternative("device", None, why="fp32: nothing is cast")
        return "device", fit["device"]
    if len(fit) == 1:
        (cast, slots), = fit.items()
        alts["cast"] = _alternative(cast, predict("superoffload", w, hw, replace(
            opts, grad_cast=cast, param_cast=cast, upload_slots=slots)), why="host memory binds: the other side "
            "does not fit (fp32 gradients land in 4 B/param where bf16 need 2)")
        reasons.append(f"Casting: {cast}: host memory binds; with casts on the other side it does not fit.")
        return cast, slots
    preds = {c: predict("superoffload", w, hw, replace(opts, grad_cast=c, param_cast=c, upload_slots=fit[c]))
             for c in ("device", "host")}
    cast = min(preds, key=lambda c: (preds[c].step_time_s, c != "device"))
    other = "host" if cast == "device" else "device"
    alts["cast"] = _alternative(cast, preds[cast], other, preds[other],
                                "grad_cast and param_cast on the same side; the faster predicted step")
    link_bw = hw.link("d2h").bandwidth(saturating_bucket_bytes(hw))
    # bytes / (GB/s) is nanoseconds; x1e3 gives picoseconds per parameter. Cast on the host, the gradient has
    # no cast pass of its own: the host step reads the bf16 landing as it is (2 B, not 4)
    dev_ps = (6 / hw.device_cast_gbps + 4 / link_bw) * 1e3
    host_ps = 2 / link_bw * 1e3
    reasons.append(
        f"Casting: {cast}. Per gradient param, device cast + fp32 copy costs {dev_ps:.1f} ps "
        f"(cast {hw.device_cast_gbps:.0f} GB/s, link {link_bw:.0f} GB/s) vs {host_ps:.1f} ps for the bf16 copy, "
        "which the host step reads without a cast pass; predicted step "
        f"{preds['device'].step_time_s * 1e3:.1f} ms (device) vs "
        f"{preds['host'].step_time_s * 1e3:.1f} ms (host)."
        + (f" With {w.chips} chips the side also sets the reduce-scatter's dtype: fp32 (4 B/param on the "
           f"network) with device casts, {opts.precision} (2 B/param, summed in {opts.precision} as "
           "DeepSpeed's default communication_data_type does) with host casts."
           if w.chips > 1 and opts.precision != "fp32" else ""))
    return cast, fit[cast]


def check_feasible(shape: ModelShape, seq: int, batch: int, hardware: HardwareProfile,
                   activation_checkpointing: bool = True, hbm_budget: float | None = None,
                   grad_accum: int = 1, chips: int = 1, ranks_per_node: int | None = None,
                   sp: int | None = None, offload_checkpoints: bool | None = None,
                   loss_tile: int | None = None) -> None:
    """Raise PlanInfeasible if no plan fits memory (the memory half of ``make_plan``, no simulation; the
    long-sequence arguments as there)."""
    _check_workload(seq, batch, grad_accum, chips, sp, loss_tile)
    hw = hardware
    shape = positions_for(shape, seq)
    w = _initial_workload(shape, seq, batch, activation_checkpointing, chips, ranks_per_node, sp,
                          offload_checkpoints, loss_tile)
    budget = float(hw.device_hbm_bytes if hbm_budget is None else hbm_budget)
    bucket = min(max(1, saturating_bucket_bytes(hw) // 4) * chips, max(1, shape.total_params() // MIN_BUCKETS))
    opts = Options(bucket_size=bucket, host_optimizer=best_host_optimizer(hw), grad_accum=grad_accum)
    reasons: list[str] = []
    fit = _fit_host_memory(w, hw, opts, reasons)
    cast = "device" if "device" in fit else "host"
    opts = replace(opts, grad_cast=cast, param_cast=cast, upload_slots=fit[cast])
    w = _choose_long_sequence(w, hw, opts, budget, reasons, sp is None, offload_checkpoints is None,
                              loss_tile is None)
    _choose_flow(w, hw, opts, budget, reasons)


def _device_need(w: Workload, hw: HardwareProfile, opts: Options) -> float:
    spec = system_spec("superoffload", opts, w.shape.total_params(), world=w.chips)
    return estimate_memory(w, hw, spec, opts).device_total


def _host_need(w: Workload, hw: HardwareProfile, opts: Options) -> float:
    spec = system_spec("superoffload", opts, w.shape.total_params(), world=w.chips)
    return estimate_memory(w, hw, spec, opts).host_total


def _host_capacity(w: Workload, hw: HardwareProfile, opts: Options) -> float:
    # on a CPU-only machine host and "device" share one memory
    return hw.host_memory_bytes - (_device_need(w, hw, opts) if hw.device_is_host else 0.0)


def _fit_host_memory(w: Workload, hw: HardwareProfile, opts: Options, reasons: list[str]) -> dict[str, int]:
    """Host memory, with the deferred rollback (0 B/param extra; full_copy, 12 B/param more, is priced
    after the tail is chosen: ``_prefer_full_copy``). Per cast side, the upload ring it needs: 0 where an
    upload buffer per bucket fits, else ``UPLOAD_SLOTS[0]`` slots where that fits; a side that does not
    fit even then is left out (with bf16, host casts land gradients in 2 B/param where device casts land
    fp32 in 4). Raises PlanInfeasible, with the leanest configuration's bytes by category, when no side fits."""
    opts = replace(opts, rollback_mode="deferred")
    sides = ("device",) if opts.precision == "fp32" else ("device", "host")
    fit: dict[str, int] = {}
    leanest = None
    for side in sides:
        for slots in (0, UPLOAD_SLOTS[0]):
            o = replace(opts, grad_cast=side, param_cast=side, upload_slots=slots)
            need, cap = _host_need(w, hw, o), _host_capacity(w, hw, o)
            if leanest is None or need < leanest[0]:
                leanest = (need, cap, o)
            if need <= cap:
                fit[side] = slots
                break
    need, cap, lean = leanest
    if not fit:
        n = max(1, w.shape.total_params())
        per_param = need / n
        spec = system_spec("superoffload", lean, n, world=w.chips)
        by_cat = ", ".join(f"{k} {v / n:.1f}" for k, v in estimate_memory(w, hw, spec, lean).host.items() if v)
        raise PlanInfeasible(
            f"{w.shape.name}: host memory needs {need:.3e} bytes ({_gb(need)}, ~{per_param:.1f} B/param: {by_cat}; "
            f"with casts on the {lean.grad_cast} and a {lean.upload_slots}-slot upload ring, the leanest "
            f"configuration) but {hw.name} has {cap:.3e} bytes ({_gb(cap)}) usable. It would fit with a model "
            f"of at most ~{units.count(cap / per_param)} params, more chips or more host memory.",
            "host", need, cap)
    first = sides[0]
    if fit.get(first) == 0:
        reasons.append(f"Rollback mode: 'deferred' ({ROLLBACK_EXTRA_HOST_BYTES['deferred']} B/param extra host "
                       f"memory; the commit pass runs during the next forward); host needs "
                       f"{_gb(_host_need(w, hw, opts))} of {_gb(_host_capacity(w, hw, opts))}.")
    else:
        reasons.append(host_binding_reason(w, hw, opts, fit))
    return fit


def host_binding_reason(w: Workload, hw: HardwareProfile, opts: Options, fit: Mapping[str, int]) -> str:
    """What binds host memory, per category in B/param: the upload buffers of the default configuration
    against what fits."""
    n = max(1, w.shape.total_params())
    base = replace(opts, grad_cast="device", param_cast="device", upload_slots=0, rollback_mode="deferred")
    spec = system_spec("superoffload", base, n, world=w.chips)
    est = estimate_memory(w, hw, spec, base)
    cap = _host_capacity(w, hw, base)
    cats = ", ".join(f"{k} {v / n:.2f}" for k, v in est.host.items() if v)
    ways = "; ".join(f"casts on the {side} with " + (f"a {k}-slot upload ring" if k else "upload buffers")
                     + f" ({_gb(_host_need(w, hw, replace(base, grad_cast=side, param_cast=side, upload_slots=k)))})"
                     for side, k in fit.items())
    return (f"Host memory binds: rollback 'deferred' with device casts and an upload buffer per bucket needs "
            f"{_gb(est.host_total)} of {_gb(cap)} ({est.host_total / n:.2f} B/param: {cats}); what fits: {ways}.")


def _choose_upload_slots(w: Workload, hw: HardwareProfile, opts: Options, pred: Prediction,
                         reasons: list[str], alts: dict[str, dict[str, Any]]) -> tuple[int, Prediction]:
    """The upload ring's depth, by the cost model, where host memory needed the ring: an upload buffer per
    bucket again if it now fits (the device tail holds some state), else the shallowest ring within
    ``UPLOAD_SLOTS_MIN_GAIN`` of the fastest. The ring costs host time at publish: buckets without a
    slot step after validation instead of during backward."""
    if not opts.upload_slots:
        alts["upload_slots"] = _alternative(0, pred, why="an upload buffer per host bucket fits host memory")
        return 0, pred
    cache = {opts.upload_slots: pred}
    buffers_fit = _host_need(w, hw, replace(opts, upload_slots=0)) <= _host_capacity(w, hw, opts)
    for k in ((0,) if buffers_fit else ()) + UPLOAD_SLOTS:
        if k not in cache:
            cache[k] = predict("superoffload", w, hw, replace(opts, upload_slots=k))
    fastest = min(p.step_time_s for p in cache.values())
    best = min(cache, key=lambda k: (cache[k].step_time_s > fastest * (1 + UPLOAD_SLOTS_MIN_GAIN),
                                     k != 0, k))
    others = [k for k in cache if k != best]
    runner = min(others, key=lambda k: (cache[k].step_time_s, k))
    alts["upload_slots"] = _alternative(best, cache[best], runner, cache[runner],
                                        "host memory needs the ring" if not buffers_fit else
                                        "the fastest predicted step (upload buffers fit with this tail)")
    if best:
        need = _host_need(w, hw, replace(opts, upload_slots=best))
        reasons.append(
            f"Upload ring: {best} pinned slots of the largest host shard instead of an upload buffer per bucket "
            f"(host needs {_gb(need)} of {_gb(_host_capacity(w, hw, opts))}): the first {best} buckets in forward "
            f"order speculate into their slot, the others step at publish; predicted step "
            f"{cache[best].step_time_s * 1e3:.1f} ms"
            + ("" if buffers_fit else " (upload buffers do not fit)")
            + "; depths priced: " + ", ".join(f"{k} {p.step_time_s * 1e3:.1f} ms" for k, p in sorted(cache.items()))
            + ".")
    return best, cache[best]


def _prefer_full_copy(w: Workload, hw: HardwareProfile, opts: Options, pred: Prediction,
                      reasons: list[str], alts: dict[str, dict[str, Any]]) -> tuple[str, Prediction]:
    """full_copy double-buffers the host state (12 B/param of host memory): its speculative pass writes
    the new state to the spare set and nothing runs after validation, where deferred needs a commit pass
    that competes with the next step's host work. Take it where it fits and the cost model says it wins."""
    alt = replace(opts, rollback_mode="full_copy")
    need, cap = _host_need(w, hw, alt), _host_capacity(w, hw, alt)
    if need > cap:
        alts["rollback_mode"] = _alternative(opts.rollback_mode, pred, "full_copy", None,
                                             f"full_copy does not fit host memory ({_gb(need)} of {_gb(cap)})")
        return opts.rollback_mode, pred
    alt_pred = predict("superoffload", w, hw, alt)
    if alt_pred.step_time_s >= pred.step_time_s * (1 - FULL_COPY_MIN_GAIN):
        alts["rollback_mode"] = _alternative(opts.rollback_mode, pred, "full_copy", alt_pred,
                                             f"full_copy costs 12 B/param of host memory: taken only for a "
                                             f">= {FULL_COPY_MIN_GAIN:.0%} faster step")
        return opts.rollback_mode, pred
    alts["rollback_mode"] = _alternative("full_copy", alt_pred, opts.rollback_mode, pred,
                                         f"fits host memory ({_gb(need)} of {_gb(cap)}) and predicts a faster step")
    reasons.append(f"Rollback mode: 'full_copy' instead ({ROLLBACK_EXTRA_HOST_BYTES['full_copy']} B/param extra host "
                   f"memory, host needs {_gb(need)} of {_gb(cap)}): no commit pass after validation; predicted "
                   f"step {alt_pred.step_time_s * 1e3:.1f} ms vs {pred.step_time_s * 1e3:.1f} ms with 'deferred'.")
    return "full_copy", alt_pred


def _sp_ok(w: Workload, sp: int) -> bool:
    """Whether Ulysses can run this workload over ``sp`` of its chips."""
    if w.chips % sp or w.seq % sp:
        return False
    try:
        ulysses_kv_repeat(w.shape.heads, w.shape.n_kv_heads, sp)
    except ValueError:
        return False
    return True


def _precision_bytes(opts: Options) -> int:
    return PRECISION_BYTES[opts.precision]


def _choose_tile(w: Workload, opts: Options) -> tuple[int | None, int, int]:
    """The loss tile when the plain loss's backward is the largest transient: the largest power of two below
    the rank's tokens whose tiled backward is no larger than a block's, at least MIN_LOSS_TILE (the sequence
    package's default tile). Returns (tile or None, plain bytes, block bytes)."""
    sh, p, tokens = w.shape, _precision_bytes(opts), w.local_tokens
    plain = loss_transient(sh, tokens, p, None)
    block = block_transient(sh, w.seq, w.batch, w.activation_checkpointing, p, w.sp)
    if plain <= block or tokens <= MIN_LOSS_TILE:
        return None, plain, block
    tile = 1 << (tokens - 1).bit_length() - 1  # the largest power of two below tokens
    while tile > MIN_LOSS_TILE and loss_transient(sh, tokens, p, tile) > block:
        tile //= 2
    tile = max(tile, MIN_LOSS_TILE)
    return (tile if loss_transient(sh, tokens, p, tile) < plain else None), plain, block


def _choose_long_sequence(w: Workload, hw: HardwareProfile, opts: Options, budget: float, reasons: list[str],
                          auto_sp: bool, auto_offload: bool, auto_tile: bool) -> Workload:
    """The long-sequence pieces (superoffload/sequence) the request needs. What the caller gave is kept; what
    it left to the planner (``auto_*``) is turned on only where weight flow alone cannot fit HBM (every layer
    flowing): these pieces are the model's, which the training script must build with them, while flow is
    the engine's own, and at long sequences a flowed layer's fetch hides under its compute. Then:

    1. the SP degree: the given one, or (left to the planner) the smallest among the divisors of the chips
       that Ulysses can split the heads and the sequence over at which some combination of 2 fits;
    2. at that degree, among checkpoints on the device or in host memory (where the host has room) and the
       plain or the tiled loss (where the plain loss's backward is the largest transient; tile: the largest
       power of two whose backward is no larger than a block's, at least MIN_LOSS_TILE), each with the
       fewest flowed layers that fit, the one with the fastest predicted step (ties: fewer pieces).

    Returns the workload with the pieces chosen (with every piece on at the largest degree when nothing fits,
    for ``_raise_hbm`` to report); each choice leaves a reason."""
    def need(x: Workload) -> float:  # with every layer flowing
        return _device_need(x, hw, replace(opts, flow_layers=tuple(range(x.shape.layers))))

    requested = []
    if w.offload_checkpoints:
        requested.append(_offload_reason(w, hw, opts, "as requested"))
    if w.loss_tile is not None:
        p = _precision_bytes(opts)
        requested.append(f"Loss: tiled, {w.loss_tile:,} tokens per tile, as requested "
                         f"({_gb(loss_transient(w.shape, w.local_tokens, p, w.loss_tile))} at its peak instead of "
                         f"{_gb(loss_transient(w.shape, w.local_tokens, p))}).")
    if _device_need(w, hw, opts) <= budget or need(w) <= budget:  # nothing needed, or weight flow suffices
        if w.sp > 1:
            reasons.append(_sp_reason(w, hw, "as requested"))
        reasons.extend(requested)
        return w
    degrees = [w.sp] + ([d for d in range(w.sp + 1, w.chips + 1) if _sp_ok(w, d)] if auto_sp else [])
    for sp in degrees:
        at = replace(w, sp=sp)
        offloads = [at.offload_checkpoints]
        if (auto_offload and not at.offload_checkpoints and at.activation_checkpointing
                and at.shape.layers > OFFLOAD_WINDOW_BLOCKS):
            alt = replace(at, offload_checkpoints=True)
            if _host_need(alt, hw, opts) <= _host_capacity(alt, hw, opts):
                offloads.append(True)
        tiles = [at.loss_tile]
        if auto_tile and at.loss_tile is None:
            tile = _choose_tile(at, opts)[0]
            if tile is not None:
                tiles.append(tile)
        combos = [replace(at, offload_checkpoints=o, loss_tile=t) for t in tiles for o in offloads]
        fitting = [c for c in combos if need(c) <= budget]
        if fitting:
            break
    if not fitting:
        return combos[-1]
    steps = [predict("superoffload", c, hw, replace(opts, flow_layers=tuple(_choose_flow(c, hw, opts, budget, []))))
             .step_time_s for c in fitting]
    best = min(range(len(fitting)), key=lambda i: (steps[i], i))
    chosen = fitting[best]
    why = f"every layer flowing still needs {_gb(need(w))} > {_gb(budget)} at sp={w.sp}"
    if chosen.sp > 1:
        reasons.append(_sp_reason(chosen, hw, "as requested" if chosen.sp == w.sp else (
            f"{why}; the smallest degree that fits among those Ulysses can use on {w.chips} chips "
            f"({', '.join(map(str, degrees))})")))
        bare = replace(chosen, offload_checkpoints=w.offload_checkpoints, loss_tile=w.loss_tile)
        why = f"at sp={chosen.sp} every layer flowing still needs {_gb(need(bare))} without it"
    reasons.extend(requested)
    if len(fitting) > 1:
        reasons.append("Long sequences: predicted step, each with the fewest flowed layers that fit: "
                       + "; ".join(f"{_pieces(c)} {t * 1e3:.1f} ms" for c, t in zip(fitting, steps, strict=True))
                       + f"; the fastest: {_pieces(chosen)}.")
    if chosen.loss_tile is not None and chosen.loss_tile != w.loss_tile:
        p = _precision_bytes(opts)
        _, plain, block = _choose_tile(replace(chosen, loss_tile=None), opts)
        reasons.append(
            f"Loss: tiled, {chosen.loss_tile:,} tokens per tile ({why}): the plain loss's backward holds three fp32 "
            f"[{chosen.local_tokens:,} tokens, {chosen.shape.vocab:,} vocab] tensors ({_gb(plain)}), more than a "
            f"block's backward ({_gb(block)}); tiled it holds "
            f"{_gb(loss_transient(chosen.shape, chosen.local_tokens, p, chosen.loss_tile))} (the largest "
            f"power-of-two tile not above the block's: a tile's logits, the fp32 weight-gradient accumulator, the "
            f"hidden-state gradient). Backward recomputes each tile's logits and forms the weight gradient in fp32.")
    if chosen.offload_checkpoints and not w.offload_checkpoints:
        reasons.append(_offload_reason(chosen, hw, opts, f"{why}; host needs {_gb(_host_need(chosen, hw, opts))} "
                                                         f"of {_gb(_host_capacity(chosen, hw, opts))}"))
    return chosen


def _pieces(w: Workload) -> str:
    on = (["checkpoints in host memory"] if w.offload_checkpoints else []) + \
         ([f"loss tile {w.loss_tile:,}"] if w.loss_tile is not None else [])
    return " + ".join(on) or "neither piece"


def _sp_reason(w: Workload, hw: HardwareProfile, why: str) -> str:
    sh = w.shape
    per_node = min(w.sp, w.ranks_per_node or max(1, hw.chips_per_node))
    link = "NVLink inside a node" if per_node >= w.sp else f"the network ({per_node} of the {w.sp} ranks per node)"
    a2a = ulysses_block_seconds(w, hw)
    return (f"Sequence parallelism: sp={w.sp} (Ulysses; {why}): each rank holds {w.local_seq:,} of the {w.seq:,} "
            f"tokens of each sequence and attends over all of them for {sh.heads // w.sp} of {sh.heads} heads; "
            f"{w.dp} data-parallel group{'s' if w.dp > 1 else ''}. Per block 4 all-to-alls (q, k, v, output) in "
            f"forward, again in recompute, their transposes in backward, over {link}: {a2a * 1e3:.2f} ms each time.")


def _offload_reason(w: Workload, hw: HardwareProfile, opts: Options, why: str) -> str:
    sh, p = w.shape, _precision_bytes(opts)
    one = p * sh.hidden * w.local_tokens
    host = checkpoint_host_bytes(sh, w.seq, w.batch, p, w.sp)
    t = hw.link("d2h").seconds(one)
    return (f"Checkpoints: in host memory ({why}): checkpointing keeps every block's input on the device "
            f"({sh.layers} x {_gb(one)} = {_gb(sh.layers * one)}); offloaded the device holds "
            f"{min(OFFLOAD_WINDOW_BLOCKS, sh.layers)} (the recompute's and the prefetched one) and pinned host memory "
            f"{_gb(host)}. Each input crosses the link once each way ({t * 1e3:.2f} ms), overlapped with the "
            f"blocks' compute.")


def _choose_flow(w: Workload, hw: HardwareProfile, opts: Options, budget: float,
                 reasons: list[str]) -> list[int]:
    sh = w.shape
    need = _device_need(w, hw, opts)
    if need <= budget:
        reasons.append(f"Weights: all {sh.layers} layers weight-stationary; HBM needs {_gb(need)} of "
                       f"{_gb(budget)} budget.")
        return []
    layer = sh.block_params()
    per_layer_saving = BF16 * layer
    slots = (opts.flow_prefetch + 1) * BF16 * layer
    k = math.ceil((need - budget + slots) / per_layer_saving)
    if k > sh.layers or _device_need(w, hw, replace(opts, flow_layers=tuple(range(sh.layers)))) > budget:
        _raise_hbm(w, hw, opts, budget)
    flow = list(range(sh.layers - k, sh.layers))
    while _device_need(w, hw, replace(opts, flow_layers=tuple(flow))) > budget and len(flow) < sh.layers:
        flow.insert(0, flow[0] - 1)
    # the estimate charged every prefetch slot; fewer flowed layers than slots need fewer buffers
    while len(flow) > 1 and _device_need(w, hw, replace(opts, flow_layers=tuple(flow[1:]))) <= budget:
        flow.pop(0)
    t_fetch = hw.link("h2d").seconds(BF16 * layer)
    t_fwd = layer_forward_seconds(w, hw)
    hides = t_fetch <= t_fwd
    reasons.append(
        f"Weights: HBM would need {_gb(need)} > {_gb(budget)}; {len(flow)} of {sh.layers} layers flow "
        f"(the last ones: their host step finishes first), saving {_gb(BF16 * layer * len(flow))}. "
        f"A layer's bf16 fetch takes {t_fetch * 1e3:.2f} ms vs {t_fwd * 1e3:.2f} ms of forward compute, "
        + ("so the prefetch hides." if hides else "so the prefetch is EXPOSED (needed to fit anyway)."))
    return flow


def _flow_alternative(w: Workload, hw: HardwareProfile, opts: Options, budget: float, flow: list[int],
                      alts: dict[str, dict[str, Any]]) -> None:
    """Flow is a memory choice: the fewest layers that fit. The runner-up is one layer fewer, which does not
    fit (no prediction), or, with none flowing, the first layer that would."""
    if flow:
        fewer = flow[1:]
        need = _device_need(w, hw, replace(opts, flow_layers=tuple(fewer)))
        alts["flow_layers"] = _alternative(list(flow), None, list(fewer), None,
                                           f"the fewest flowing layers that fit: {len(fewer)} would need "
                                           f"{_gb(need)} of {_gb(budget)}")
    else:
        alts["flow_layers"] = _alternative([], None, why="every layer's weights fit on the device")


def _raise_hbm(w: Workload, hw: HardwareProfile, opts: Options, budget: float) -> None:
    sh = w.shape
    all_flow = replace(opts, flow_layers=tuple(range(sh.layers)))
    need = _device_need(w, hw, all_flow)
    per_seq = act_bytes_per_token(sh) * w.local_seq
    hints = [f"every layer already flowing still needs {need:.3e} bytes"]
    on = ([f"sp={w.sp}"] if w.sp > 1 else []) + (["checkpoints in host memory"] if w.offload_checkpoints else []) \
        + ([f"loss tile {w.loss_tile}"] if w.loss_tile is not None else [])
    if on:
        hints[0] += " with " + ", ".join(on)
    more_sp = [d for d in range(w.sp + 1, w.chips + 1) if _sp_ok(w, d)]
    if more_sp:
        hints.append(f"more sequence parallelism (sp={more_sp[-1]} holds seq/{more_sp[-1]} tokens per rank)")
    if w.activation_checkpointing and not w.offload_checkpoints and sh.layers > OFFLOAD_WINDOW_BLOCKS:
        alt = replace(w, offload_checkpoints=True)
        host, cap = _host_need(alt, hw, opts), _host_capacity(alt, hw, opts)
        hints.append("activation checkpoints in host memory" + (
            "" if host <= cap else f" (with more host memory: they need {_gb(host)} of {_gb(cap)})"))
    if w.loss_tile is None and _choose_tile(w, opts)[0] is not None:
        hints.append("a tiled loss")
    if w.batch > 1:
        per_seq_total = per_seq * (3 if w.activation_checkpointing else sh.layers)
        hints.append(f"a smaller micro-batch (each sequence costs ~{_gb(per_seq_total)} of activations)")
    if not w.activation_checkpointing:
        ck = _device_need(replace(w, activation_checkpointing=True), hw, all_flow)
        hints.append(f"activation checkpointing (recompute) would need {_gb(ck)}")
    hints.append("a shorter sequence or a larger HBM budget")
    raise PlanInfeasible(
        f"{sh.name} seq {w.seq} batch {w.batch}: device memory needs {need:.3e} bytes ({_gb(need)}) but the "
        f"budget is {budget:.3e} bytes ({_gb(budget)}). Would help: " + "; ".join(hints) + ".",
        "device", need, budget)


def _choose_tail(w: Workload, hw: HardwareProfile, opts: Options, budget: float,
                 reasons: list[str], alts: dict[str, dict[str, Any]]) -> tuple[int, Prediction]:
    if hw.device_is_host:
        # one processor: a tail bucket moves work from a host step that overlaps backward (on the worker)
        # to a serial step after it, on the same cores; the cost model cannot see that contention
        reasons.append("Device tail: 0 buckets: the device is the host itself, so a tail bucket only moves a "
                       "host worker's step onto the training thread, on the same cores: never faster.")
        pred = predict("superoffload", w, hw, replace(opts, device_tail_buckets=0))
        alts["device_tail_buckets"] = _alternative(0, pred, why="the device is the host: a tail bucket's step moves "
                                                   "from the host worker onto the training thread, on the same "
                                                   "cores; not priced")
        return 0, pred
    # the engine's buckets (whole tensors, uneven), last first: as many as their state fits in HBM
    free = budget - _device_need(w, hw, opts)
    max_tail = 0
    packed = bk.pack_buckets(w.shape, opts.bucket_size)
    for b in reversed(packed):
        free -= TAIL_STATE_BYTES * sum(n for _, n in b) / w.chips  # each rank keeps its shard of the state
        if free < 0:
            break
        max_tail += 1
    while max_tail and _device_need(w, hw, replace(opts, device_tail_buckets=max_tail)) > budget:
        max_tail -= 1
    cache: dict[int, Prediction] = {}

    def run(t: int) -> Prediction:
        if t not in cache:
            cache[t] = predict("superoffload", w, hw, replace(opts, device_tail_buckets=t))
        return cache[t]

    grid = sorted({round(max_tail * i / 8) for i in range(9)})
    for t in grid:
        run(t)
    best = min(cache, key=lambda t: (cache[t].step_time_s, t))
    step = max(1, max_tail // 8)
    for t in range(max(0, best - step), min(max_tail, best + step) + 1, max(1, step // 4)):
        run(t)
    best = min(cache, key=lambda t: (round(cache[t].step_time_s, 9), t))
    why = f"the fastest predicted step of {len(cache)} tails priced (room for up to {max_tail})"
    whole = max_tail == len(packed) > 0
    if whole and cache[max_tail].step_time_s <= cache[best].step_time_s * (1 + ALL_DEVICE_MIN_GAIN):
        best = max_tail
        why = (f"every bucket's Adam state fits on the device: trained there whole unless some on the host is "
               f">= {ALL_DEVICE_MIN_GAIN:.0%} faster ({len(cache)} tails priced)")
    p0, pb = cache[0], cache[best]
    others = [t for t in cache if t != best]
    runner = min(others, key=lambda t: (cache[t].step_time_s, t)) if others else None
    alts["device_tail_buckets"] = _alternative(best, pb, runner, cache[runner] if runner is not None else None, why)
    _, tail_params = bk.split_params(w.shape, best, opts.bucket_size)
    reasons.append(
        f"Device tail: {best} bucket(s) ({tail_params / 1e6:.0f}M params, "
        f"{_gb(TAIL_STATE_BYTES * tail_params)} of HBM; room for up to {max_tail}) keep their Adam on the "
        f"device. Exposed tail "
        f"{p0.tail_s * 1e3:.1f} ms -> {pb.tail_s * 1e3:.1f} ms, step {p0.step_time_s * 1e3:.1f} ms -> "
        f"{pb.step_time_s * 1e3:.1f} ms; device idle {pb.gpu_idle_s * 1e3:.1f} ms per step.")
    return best, pb
