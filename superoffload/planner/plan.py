"""The planner: choose the SuperOffload engine's knobs for one model, workload and machine.

Every choice is made by the cost model (``costmodel.predict``) or by a memory bound, and each one
leaves a sentence with its numbers in ``Plan.reasons``. The choices carry the engine's config names and
values (``superoffload.options``); ``Plan.engine_options()`` is the dict the engine config merges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from superoffload.options import CastSide, HostOptimizer, RollbackMode
from superoffload.planner import buckets as bk
from superoffload.planner.costmodel import (
    Prediction,
    Workload,
    estimate_memory,
    layer_forward_seconds,
    predict,
)
from superoffload.planner.hardware import GB, LEGACY_HOST_OPTIMIZERS, MB, HardwareProfile
from superoffload.planner.memory import ADAM_STATE, BF16, ROLLBACK_EXTRA_HOST_BYTES, act_bytes_per_token
from superoffload.planner.systems import Options, system_spec
from superoffload.shapes import ModelShape

LINK_SATURATION = 0.90  # bucket = smallest transfer reaching this share of the link's peak
MIN_BUCKETS = 16  # keep at least this many buckets so transfers and host steps pipeline
STAGING_SHARE = 0.05  # bucket staging buffers may use at most this share of the HBM budget
TAIL_STATE_BYTES = ADAM_STATE + BF16  # fp32 master, m, v + the bf16 gradient, per tail param
FULL_COPY_MIN_GAIN = 0.01  # full_copy costs 12 B/param of host memory: take it only for a >= 1 % faster step


class PlanInfeasible(ValueError):
    """The request cannot fit; the message gives bytes needed vs available and what would help, and
    ``memory`` ("host" or "device"), ``need_bytes`` and ``available_bytes`` say it as data."""

    def __init__(self, message: str, memory: str = "", need_bytes: float = 0.0,
                 available_bytes: float = 0.0) -> None:
        super().__init__(message)
        self.memory, self.need_bytes, self.available_bytes = memory, need_bytes, available_bytes


# The plan's fields that are engine config keys (all in superoffload.options.SHARED_KEYS)
ENGINE_KEYS = ("bucket_size", "device_tail_buckets", "speculation", "rollback_mode", "grad_cast", "param_cast",
               "host_optimizer", "flow_layers", "flow_prefetch", "grad_accum")
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
    chips: int = 1  # data-parallel ranks the plan is for (one per chip; the engine shards over them)
    ranks_per_node: int | None = None

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
        return Options(**{**self.engine_options(), "flow_layers": tuple(self.flow_layers)})

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


def _check_workload(seq: int, batch: int, grad_accum: int, chips: int = 1) -> None:
    for name, value in (("seq", seq), ("batch", batch), ("grad_accum", grad_accum), ("chips", chips)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def best_host_optimizer(hw: HardwareProfile) -> str:
    """The host Adam kernel with the highest rate in the profile."""
    return max(hw.host_adam_gbps, key=lambda k: hw.host_adam_gbps[k])


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
              ranks_per_node: int | None = None) -> Plan:
    """Choose flow layers, bucket size, device tail, casting and rollback mode for one rank of ``chips``
    data-parallel ranks (each its own micro-batch ``batch``; its host holds 1/chips of the state)."""
    _check_workload(seq, batch, grad_accum, chips)
    hw = hardware
    w = Workload(shape, seq, batch, activation_checkpointing, chips=chips, ranks_per_node=ranks_per_node)
    budget = float(hw.device_hbm_bytes if hbm_budget is None else hbm_budget)
    n = shape.total_params()
    reasons: list[str] = []
    kind = host_optimizer or best_host_optimizer(hw)
    reasons.append(f"Host Adam kernel: {kind} at {hw.host_adam_gbps[kind]:.0f} GB/s effective "
                   f"({hw.host_adam_gbps[kind] * 1e9 / 28 / 1e9:.2f} Gparam/s at 28 B/param).")
    if chips > 1:
        reasons.append(_chips_reason(w, hw))

    # 1. bucket size from the link curve, bounded by pipelining and staging memory
    bucket = _choose_bucket(n, hw, budget, reasons, chips)

    # 2. host memory and rollback mode
    opts = Options(bucket_size=bucket, host_optimizer=kind, grad_accum=grad_accum)
    rollback = _choose_rollback_mode(w, hw, opts, reasons)
    opts = replace(opts, rollback_mode=rollback)

    # 3. flow layers if HBM forces them
    flow = _choose_flow(w, hw, opts, budget, reasons)
    opts = replace(opts, flow_layers=tuple(flow))

    # 4. casting, by the cost model
    cast = _choose_cast(w, hw, opts, reasons)
    opts = replace(opts, grad_cast=cast, param_cast=cast)

    # 5. device tail buckets: minimise the step under the HBM budget
    tail, pred = _choose_tail(w, hw, opts, budget, reasons)
    opts = replace(opts, device_tail_buckets=tail)

    # 6. speculation: it uses a host that would otherwise wait for backward; when the device *is* the
    # host there is no idle processor, and the speculative pass plus the deferred commit cost cores
    # that backward needs (docs/cost_model.md, planner step 7, has the measurement). Both give the same bits.
    speculation = not hw.device_is_host
    if not speculation:
        reasons.append("Speculation: off: the device is the host, so there is no idle host to overlap "
                       "with backward; validate-then-step is the same arithmetic with one pass fewer.")
        pred = predict("superoffload", w, hw, replace(opts, speculation=False))
    else:
        rollback, pred = _prefer_full_copy(w, hw, replace(opts, rollback_mode=rollback), pred, reasons)
    return Plan(model=shape.name, seq=seq, batch=batch, hardware=hw.name,
                activation_checkpointing=activation_checkpointing, bucket_size=bucket,
                device_tail_buckets=tail, grad_cast=cast, param_cast=cast, flow_layers=list(flow),
                host_optimizer=kind, rollback_mode=rollback, speculation=speculation, hbm_budget_bytes=budget,
                grad_accum=grad_accum, flow_prefetch=opts.flow_prefetch, predicted=pred, reasons=reasons,
                chips=chips, ranks_per_node=ranks_per_node)


def _chips_reason(w: Workload, hw: HardwareProfile) -> str:
    per_node = w.ranks_per_node or min(w.chips, max(1, hw.chips_per_node))
    nodes = math.ceil(w.chips / per_node)
    if not hw.has_interconnect():
        return (f"Chips: {w.chips} data-parallel ranks; {hw.name} has no interconnect numbers, so their "
                "collectives are not charged.")
    across = nodes > 1
    gbps = min(hw.intra_node_gbps, hw.inter_node_gbps) if across else hw.intra_node_gbps  # type: ignore[type-var]
    return (f"Chips: {w.chips} data-parallel ranks ({per_node} per node, {nodes} node{'s' if nodes > 1 else ''}); "
            f"each host holds 1/{w.chips} of the fp32 master and Adam state and steps it; per bucket a fp32 "
            f"reduce-scatter and an all-gather of the weights, per step one all-reduce of the norm, over "
            f"{'the inter-node network' if across else 'the intra-node links'} at {gbps:.0f} GB/s per rank.")


def _choose_bucket(params: int, hw: HardwareProfile, budget: float, reasons: list[str], chips: int = 1) -> int:
    """Elements per bucket: the smallest copy that saturates the link, capped so there are at least
    MIN_BUCKETS buckets to pipeline and the staging buffers stay under STAGING_SHARE of the HBM budget.
    With several chips a rank copies 1/chips of each bucket, so the bucket is chips times larger for the
    copied shard to reach the same size (within the same caps)."""
    sat = saturating_bucket_bytes(hw)
    bucket = max(1, sat // 4) * chips  # fp32 gradient elements (device-cast policy moves 4 B/param)
    bound_pipe = max(1, params // MIN_BUCKETS)
    bound_mem = max(1, int(STAGING_SHARE * budget / (2 * (BF16 + 4) + 2 * 4)))
    chosen = min(bucket, bound_pipe, bound_mem)
    shard = f" (x{chips} chips: each rank copies a 1/{chips} shard)" if chips > 1 else ""
    reasons.append(
        f"Bucket: {sat / MB:.0f} MiB is the smallest copy reaching {LINK_SATURATION:.0%} of the link peak "
        f"(D2H {hw.link('d2h').peak():.0f} GB/s, {hw.link('d2h').bandwidth(sat):.0f} GB/s at that size) "
        f"= {bucket / 1e6:.1f}M fp32 params{shard}"
        + (f"; capped to {chosen / 1e6:.1f}M so there are >= {MIN_BUCKETS} buckets and staging stays "
           f"under {STAGING_SHARE:.0%} of HBM" if chosen < bucket else "") + ".")
    return chosen


def _choose_cast(w: Workload, hw: HardwareProfile, opts: Options, reasons: list[str]) -> str:
    """Where bf16 <-> fp32 casts run, the same side for gradients and parameters: both are simulated and
    the faster wins (a tie goes to the device)."""
    preds = {c: predict("superoffload", w, hw, replace(opts, grad_cast=c, param_cast=c)) for c in ("device", "host")}
    cast = min(preds, key=lambda c: (preds[c].step_time_s, c != "device"))
    link_bw = hw.link("d2h").bandwidth(saturating_bucket_bytes(hw))
    # bytes / (GB/s) is nanoseconds; x1e3 gives picoseconds per parameter
    dev_ps = (6 / hw.device_cast_gbps + 4 / link_bw) * 1e3
    host_ps = (2 / link_bw + 6 / hw.host_cast_gbps) * 1e3
    reasons.append(
        f"Casting: {cast}. Per gradient param, device cast + fp32 copy costs {dev_ps:.1f} ps "
        f"(cast {hw.device_cast_gbps:.0f} GB/s, link {link_bw:.0f} GB/s) vs bf16 copy + "
        f"host cast {host_ps:.1f} ps (host cast {hw.host_cast_gbps:.0f} GB/s, on the pool that also runs "
        f"Adam); predicted step {preds['device'].step_time_s * 1e3:.1f} ms (device) vs "
        f"{preds['host'].step_time_s * 1e3:.1f} ms (host).")
    return cast


def check_feasible(shape: ModelShape, seq: int, batch: int, hardware: HardwareProfile,
                   activation_checkpointing: bool = True, hbm_budget: float | None = None,
                   grad_accum: int = 1, chips: int = 1, ranks_per_node: int | None = None) -> None:
    """Raise PlanInfeasible if no plan fits memory (the memory half of ``make_plan``, no simulation)."""
    _check_workload(seq, batch, grad_accum, chips)
    hw = hardware
    w = Workload(shape, seq, batch, activation_checkpointing, chips=chips, ranks_per_node=ranks_per_node)
    budget = float(hw.device_hbm_bytes if hbm_budget is None else hbm_budget)
    bucket = min(max(1, saturating_bucket_bytes(hw) // 4) * chips, max(1, shape.total_params() // MIN_BUCKETS))
    opts = Options(bucket_size=bucket, host_optimizer=best_host_optimizer(hw), grad_accum=grad_accum)
    reasons: list[str] = []
    opts = replace(opts, rollback_mode=_choose_rollback_mode(w, hw, opts, reasons))
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


def _choose_rollback_mode(w: Workload, hw: HardwareProfile, opts: Options, reasons: list[str]) -> str:
    cap = _host_capacity(w, hw, opts)
    # deferred commit first: no extra memory. full_copy (12 B/param) is considered after the tail is
    # chosen (_prefer_full_copy), by the cost model, when speculation is on
    for mode in ("deferred",):
        need = _host_need(w, hw, replace(opts, rollback_mode=mode))
        if need <= cap:
            reasons.append(
                f"Rollback mode: '{mode}' ({ROLLBACK_EXTRA_HOST_BYTES[mode]} B/param extra host memory; the commit "
                f"pass runs during the next forward); host needs {_gb(need)} of {_gb(cap)}.")
            return mode
    need = _host_need(w, hw, replace(opts, rollback_mode="deferred"))
    per_param = need / max(1, w.shape.total_params())
    raise PlanInfeasible(
        f"{w.shape.name}: host memory needs {need:.3e} bytes ({_gb(need)}, ~{per_param:.1f} B/param for fp32 "
        f"master, Adam m and v and gradients) but {hw.name} has {cap:.3e} bytes ({_gb(cap)}) usable. "
        f"It would fit with a model of at most ~{cap / per_param / 1e9:.1f}B params or more host memory.",
        "host", need, cap)


def _prefer_full_copy(w: Workload, hw: HardwareProfile, opts: Options, pred: Prediction,
                      reasons: list[str]) -> tuple[str, Prediction]:
    """full_copy double-buffers the host state (12 B/param of host memory): its speculative pass writes
    the new state to the spare set and nothing runs after validation, where deferred needs a commit pass
    that competes with the next step's host work. Take it where it fits and the cost model says it wins."""
    alt = replace(opts, rollback_mode="full_copy")
    need, cap = _host_need(w, hw, alt), _host_capacity(w, hw, alt)
    if need > cap:
        return opts.rollback_mode, pred
    alt_pred = predict("superoffload", w, hw, alt)
    if alt_pred.step_time_s >= pred.step_time_s * (1 - FULL_COPY_MIN_GAIN):
        return opts.rollback_mode, pred
    reasons.append(f"Rollback mode: 'full_copy' instead ({ROLLBACK_EXTRA_HOST_BYTES['full_copy']} B/param extra host "
                   f"memory, host needs {_gb(need)} of {_gb(cap)}): no commit pass after validation; predicted "
                   f"step {alt_pred.step_time_s * 1e3:.1f} ms vs {pred.step_time_s * 1e3:.1f} ms with 'deferred'.")
    return "full_copy", alt_pred


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


def _raise_hbm(w: Workload, hw: HardwareProfile, opts: Options, budget: float) -> None:
    sh = w.shape
    all_flow = replace(opts, flow_layers=tuple(range(sh.layers)))
    need = _device_need(w, hw, all_flow)
    per_seq = act_bytes_per_token(sh) * w.seq
    hints = [f"every layer already flowing still needs {need:.3e} bytes"]
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
                 reasons: list[str]) -> tuple[int, Prediction]:
    if hw.device_is_host:
        # one processor: a tail bucket moves work from a host step that overlaps backward (on the worker)
        # to a serial step after it, on the same cores; the cost model cannot see that contention
        reasons.append("Device tail: 0 buckets: the device is the host itself, so a tail bucket only turns "
                       "an overlapped host step into a serial one on the same cores.")
        return 0, predict("superoffload", w, hw, replace(opts, device_tail_buckets=0))
    # the engine's buckets (whole tensors, uneven), last first: as many as their state fits in HBM
    free = budget - _device_need(w, hw, opts)
    max_tail = 0
    for b in reversed(bk.pack_buckets(w.shape, opts.bucket_size)):
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
    p0, pb = cache[0], cache[best]
    _, tail_params = bk.split_params(w.shape, best, opts.bucket_size)
    reasons.append(
        f"Device tail: {best} bucket(s) ({tail_params / 1e6:.0f}M params, "
        f"{_gb(TAIL_STATE_BYTES * tail_params)} of HBM; room for up to {max_tail}) keep their Adam on the "
        f"device. Exposed tail "
        f"{p0.tail_s * 1e3:.1f} ms -> {pb.tail_s * 1e3:.1f} ms, step {p0.step_time_s * 1e3:.1f} ms -> "
        f"{pb.step_time_s * 1e3:.1f} ms; device idle {pb.gpu_idle_s * 1e3:.1f} ms per step.")
    return best, pb
