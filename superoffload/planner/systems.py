"""What each modelled system does with a gradient bucket, as a small declarative spec.

The graph builder (``costmodel``) knows one pipeline: device cast -> D2H -> host cast -> host Adam ->
(commit) -> host cast -> H2D -> device cast, plus device Adam for tail buckets and per-layer weight
fetches. A ``SystemSpec`` switches its stages on and off and says what waits for what. How the peers
behave is read from DeepSpeed's and PyTorch's sources and the authors' artifact configs
(docs/cost_model.md, "Systems", gives the sources); where it is inferred rather than read, the comment
says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from superoffload import catalog
from superoffload.options import (
    ENGINE_DEFAULTS,
    SHARED_KEYS,
    CastSide,
    HostOptimizer,
    Precision,
    RollbackMode,
    check_choice,
)

# The systems the cost model compares (superoffload/catalog.py, modelled "compared")
SYSTEMS = tuple(s.name for s in catalog.SYSTEMS if s.modelled == "compared")
# modelled for the paper's figures and the long-sequence harness runs, not in the planner's comparisons of
# SYSTEMS (modelled "paper"): DeepSpeed-Ulysses on ZeRO-3 without offload, the Fig 12 baseline
# (docs/cost_model.md, "Long sequences"; the harness runs it as baselines/ulysses.py)
PAPER_ONLY_SYSTEMS = tuple(s.name for s in catalog.SYSTEMS if s.modelled == "paper")

# Extra host traffic per param that exact rollback costs a speculative step (docs/cost_model.md,
# "Constants and sources"). full_copy is double-buffered: the speculative pass writes the new p, m, v to
# a spare set instead of in place, so the spare lines are read for ownership (12 B) unless the kernel
# uses streaming stores (GraceAdam's x86 paths do; the NEON / SVE paths of a Grace host do not, hence
# 12); commit is a buffer swap. The deferred commit is a second pass after validation (re-reads p, m,
# v, g: ~16 B/param more than one in-place pass, run during the next forward).
ROLLBACK_SPEC_EXTRA = {"full_copy": 12.0, "deferred": 0.0}
ROLLBACK_COMMIT_BYTES = {"full_copy": 0.0, "deferred": 16.0}
# The engine runs torch's and DeepSpeed's CPU Adam kernels unfused (superoffload/engine/host_adam.py, read off
# the code): every pass first copies the gradient into a scratch buffer (`grad.clone()`: the landing buffer
# is never scaled in place; 4 B read + 4 written per param), a pass with an fp32 output copies the new
# weights to it afterwards (`out.copy_(p)`, 8 B; a low-precision output is that copy as a cast, charged as
# the separate host cast), and a speculative pass first copies p, m and v to scratch (or to the spare set;
# 3 x 8 B). GraceAdam does all of it in its one pass. Charged as extra bytes of the step at the kernel's
# effective rate, as the other extra host bytes are.
UNFUSED_GRAD_COPY = 8.0
UNFUSED_OUT_COPY = 8.0
UNFUSED_SPEC_COPY = 24.0
# Gradients cast on the host land in the training precision and no pass casts them on their own: GraceAdam
# reads bf16/fp16 gradients and widens them in registers, the unfused kernels' `grad.float()` is their gradient
# copy (UNFUSED_GRAD_COPY) with a 2-byte read. Either way every pass that reads the gradient (the step, the
# deferred commit) reads 2 B/param less than an fp32 gradient's 4, and nothing more is charged
# (superoffload/engine/host_adam.py; benchmarks/host_cast_costs.py on gpt-small's 10.5M-param shard, one thread: the
# step with bf16 gradients took 0.71x the time of the step with fp32 ones, 0.78x with the bf16 weight copy too).
LOWP_GRAD_READ_SAVING = 2.0

DEEPSPEED_REDUCE_BUCKET = 500_000_000  # DeepSpeed default reduce_bucket_size (elements)
# torch DistributedDataParallel's default bucket_cap_mb = 25 (MiB of gradients per all-reduce bucket)
DDP_BUCKET_BYTES = 25 * 2**20
ARTIFACT_PRISM_BUCKET = 600_000_000  # artifact prism config: reduce_bucket_size = sub_group_size = 6e8
ARTIFACT_PRISM_RATIO = 0.90  # artifact prism config `ratio`


@dataclass
class Options:
    """The knobs a prediction runs with. The first group are SuperOffload engine config keys, with the
    engine's names and values (``superoffload.options``); the defaults are the planner's starting point,
    not the engine's (``Options.from_engine_config`` reads an engine config). The rest configure peers."""

    speculation: bool = True
    device_tail_buckets: int = 0
    bucket_size: int = 8 * 2**20  # elements
    grad_cast: CastSide = "device"
    param_cast: CastSide = "device"
    host_optimizer: HostOptimizer = "grace"
    flow_layers: tuple[int, ...] = ()
    rollback_mode: RollbackMode = "deferred"
    flow_prefetch: int = 1  # blocks fetched ahead of use; the device holds flow_prefetch + 1 flowed blocks
    grad_accum: int = 1
    # training precision: with fp32 weights nothing is cast and every copy moves 4 B/param
    precision: Precision = "bf16"
    grad_clip: float = 1.0  # global-norm clipping threshold, 0 = off (DeepSpeed super_offload then speculates)
    # peers
    # 0: an upload buffer per host bucket (model-sized pinned memory); k: a ring of k slots, the first k
    # buckets in forward order speculate into theirs, the others step at publish (engine config upload_slots)
    upload_slots: int = 0
    # several ranks: every rank keeps the whole optimizer state, gradients all-reduced, no weight all-gather
    replicate: bool = False
    ds_ratio: float = ARTIFACT_PRISM_RATIO
    ds_bucket_size: int = ARTIFACT_PRISM_BUCKET
    zero_bucket_size: int = DEEPSPEED_REDUCE_BUCKET

    @classmethod
    def from_engine_config(cls, cfg: Mapping[str, Any], **peers: Any) -> Options:
        """The options of a run made with engine config ``cfg`` (a ``SuperOffloadConfig.to_dict()``, as run
        records store it): every shared knob is taken as it is; a key the dict lacks (a record written
        before the key existed) gets the engine's default. ``peers``: the peer-only fields."""
        values = {k: cfg.get(k, ENGINE_DEFAULTS[k]) for k in SHARED_KEYS}
        values["flow_layers"] = tuple(values["flow_layers"] or ())
        opts = cls(**values, **peers)
        opts.validate()
        return opts

    @property
    def clipping(self) -> bool:
        return self.grad_clip > 0

    def validate(self) -> None:
        check_choice("grad_cast", self.grad_cast, CastSide)
        check_choice("param_cast", self.param_cast, CastSide)
        check_choice("precision", self.precision, Precision)
        check_choice("host_optimizer", self.host_optimizer, HostOptimizer)
        check_choice("rollback_mode", self.rollback_mode, RollbackMode)
        if self.device_tail_buckets < 0 or self.bucket_size <= 0 or self.grad_accum < 1:
            raise ValueError("device_tail_buckets >= 0, bucket_size > 0, grad_accum >= 1")
        if self.flow_prefetch < 0:
            raise ValueError("flow_prefetch must be >= 0 (blocks fetched ahead; 0 = on demand)")
        if self.grad_clip < 0:
            raise ValueError("grad_clip must be >= 0 (0 = off)")
        if self.upload_slots < 0:
            raise ValueError("upload_slots must be >= 0 (0: an upload buffer per host bucket)")


@dataclass
class SystemSpec:
    name: str
    bucket_size: int
    device_tail_buckets: int
    host_optimizer: HostOptimizer
    grad_d2h_bytes: int  # bytes/param on the link
    grad_device_cast: bool  # cast bf16 -> fp32 on the device before D2H
    grad_host_cast: bool  # D2H bf16; the host step reads them as they are (LOWP_GRAD_READ_SAVING), no cast pass
    host_waits_backward: bool  # host step only after validation (no speculation)
    grad_device_copy: bool = False  # fp32: the same device pass over the grads is a plain copy (8 B/param)
    spec_extra_bytes: float = 0.0  # extra host bytes/param in the step pass (exactness, fused casts)
    fused_cast_bytes: float = 0.0  # the part of spec_extra_bytes that writes the low-precision upload copy
    lowp_grad_saving: float = 0.0  # bytes/param the step and commit passes read less: low-precision gradients
    commit_bytes: float = 0.0  # a separate commit pass after validation, bytes/param
    return_bytes: int = 2  # H2D bytes/param of the updated parameters (0: no return)
    return_host_cast: bool = False  # separate host cast pass before the upload
    return_device_cast: bool = False  # fp32 upload, cast to bf16 on the device
    return_pageable: bool = False  # upload from a pageable temporary (blocks the host thread)
    return_after_all: bool = False  # uploads start only after every host step (serial write-back)
    # the upload of a bucket's new weights waits for validation (the global norm / finite check). True for
    # every system modelled: the engine keeps speculative weights apart until step() validates them
    # (torch's semantics between backward() and step()); False models writing them into the live
    # weights during backward instead (docs/cost_model.md, "Keeping speculation apart")
    return_waits_validation: bool = True
    forward_waits_all: bool = False  # next forward waits for the whole step (vs per layer)
    upload_slots: int = 0  # SuperOffload's upload ring (0: an upload buffer per host bucket)
    flow_layers: frozenset[int] = field(default_factory=frozenset)
    fetch_bytes: int = 2  # H2D bytes/param of a streamed layer
    fetch_device_cast: bool = False
    all_layers_stream: bool = False  # FSDP offload: every layer fetched for forward and backward
    device_only: bool = False  # torch: no host at all
    flow_prefetch: int = 1  # streamed layers fetched ahead; flow_prefetch + 1 layer buffers on the device
    grad_accum: int = 1
    clipping: bool = False  # global-norm clipping each step (its traffic is charged where measured)
    notes: list[str] = field(default_factory=list)
    # several chips (world > 1; every field below is inert on one chip)
    world: int = 1
    grad_reduce: str | None = None  # "reduce_scatter" (sharded optimizer) | "all_reduce" (DDP) per bucket
    grad_reduce_bytes: int = 0  # bytes/param on the wire
    shard_optimizer: bool = False  # host (or tail) state and the optimizer step cover 1/world of the params
    param_gather_bytes: int = 0  # all-gather of weights, bytes/param: after their return, or per layer
    gather_per_layer: bool = False  # ZeRO-3: partitioned weights all-gathered per layer in forward and backward
    step_allreduce: bool = False  # one small all-reduce per step (global norm / overflow flag)


def system_spec(system: str, opts: Options, total_params: int, world: int = 1) -> SystemSpec:
    spec = _system_spec(system, opts, total_params)
    spec.clipping = opts.clipping
    if opts.precision == "fp32":
        _without_casts(spec)
    if world > 1:
        _data_parallel(spec, opts, world)
    return spec


def _data_parallel(spec: SystemSpec, opts: Options, world: int) -> None:
    """The collectives each system adds on ``world`` data-parallel ranks (one per chip), read from the
    systems' sources (docs/cost_model.md, "Several chips"); "[inferred]" where it is not written there.

    - superoffload (superoffload/engine/comm.py): each bucket's gradient copied into a flat buffer (fp32,
      cast on the device), SUM reduce-scatter in its dtype, the rank's shard D2H, host Adam on the shard,
      the shard's weights H2D and an all-gather of the bucket's weights in the training precision; one
      all-reduce of Σ norm² (fp64) per step. With ``grad_cast: host`` the flat gradient stays
      in the training precision: reduce-scattered and moved in it, cast by the host kernel.
    - zero_offload / zero_infinity (DeepSpeed ZeRO-2 / ZeRO-3 with every parameter persistent, as the
      artifact configures it): per reduce bucket a reduce of each partition to its owner (reduce-scatter
      volume) in the training dtype [inferred: DeepSpeed's communication_data_type defaults to it],
      CPU-Adam on the partition, its weights back, then an all-gather of the weights.
    - ds_superoffload (ZeRO-3, stage3 defaults): reduce-scatter per sub-group, partitioned weights
      all-gathered per layer in forward and again in backward.
    - fsdp_offload (FSDP2 + CPUOffloadPolicy): per layer the shard is copied H2D and all-gathered in the
      param dtype for forward and for backward; gradients reduce-scattered in fp32 (reduce_dtype), the
      shard copied D2H; torch AdamW on the shard.
    - superoffload with ``replicate``: each bucket's flat gradient all-reduced in its dtype, every rank
      moves, steps and returns the whole bucket; no all-gather and no norm all-reduce (engine/norms.py).
    - torch (DistributedDataParallel): fp32 gradients all-reduced per 25 MiB bucket during backward;
      every rank keeps and steps the whole model.
    """
    lowp = 2 if opts.precision != "fp32" else 4
    spec.world = world
    spec.step_allreduce = True
    if spec.name == "ulysses":
        # ZeRO-3 over every rank (DeepSpeed folds the SP group into ZeRO's data-parallel group): weights,
        # gradients and Adam state partitioned; each layer all-gathered for forward and again for backward,
        # gradients reduce-scattered per reduce bucket, all in the training dtype; Adam on the device
        spec.shard_optimizer = True
        spec.grad_reduce, spec.grad_reduce_bytes = "reduce_scatter", lowp
        spec.gather_per_layer, spec.param_gather_bytes = True, lowp
        return
    if spec.name == "torch":
        spec.grad_reduce, spec.grad_reduce_bytes = "all_reduce", 4
        spec.bucket_size = DDP_BUCKET_BYTES // 4
        spec.device_tail_buckets = 1 << 30  # every bucket steps on the device
        spec.step_allreduce = False  # the averaged gradients are identical: clipping is local
        return
    if spec.name == "superoffload" and opts.replicate:
        spec.grad_reduce, spec.grad_reduce_bytes = "all_reduce", spec.grad_d2h_bytes
        spec.step_allreduce = False
        return
    spec.shard_optimizer = True
    spec.grad_reduce = "reduce_scatter"
    if spec.name == "superoffload":
        spec.grad_reduce_bytes = spec.grad_d2h_bytes  # the dtype the flat gradient is reduced and moved in
        spec.param_gather_bytes = lowp
    elif spec.name in ("zero_offload", "zero_infinity"):
        spec.grad_reduce_bytes = lowp
        spec.param_gather_bytes = lowp
    elif spec.name == "ds_superoffload":
        spec.grad_reduce_bytes = lowp
        spec.gather_per_layer = True
        spec.param_gather_bytes = lowp  # per layer, not after the step
    elif spec.name == "fsdp_offload":
        spec.grad_reduce_bytes = 4
        spec.fetch_bytes = 4  # the fp32 shard crosses the link, then is all-gathered in the param dtype
        spec.param_gather_bytes = lowp
        spec.step_allreduce = opts.clipping


def _without_casts(spec: SystemSpec) -> None:
    """fp32 training: weights, grads and state share one dtype, so every cast stage goes. The device
    pass that cast gradients into the offload buffer (DeepSpeed's contiguous gradient buckets, the
    engine's bucket buffer) remains as a copy; every copy on the link moves fp32."""
    spec.grad_device_copy = spec.grad_device_cast
    spec.grad_device_cast = spec.grad_host_cast = False
    spec.grad_d2h_bytes = 4 if spec.grad_d2h_bytes else 0
    spec.return_bytes = 4 if spec.return_bytes else 0
    spec.return_host_cast = spec.return_device_cast = False
    spec.spec_extra_bytes -= spec.fused_cast_bytes
    spec.fused_cast_bytes = 0.0
    spec.spec_extra_bytes += spec.lowp_grad_saving  # the gradients land in fp32
    if spec.commit_bytes:
        spec.commit_bytes += spec.lowp_grad_saving
    spec.lowp_grad_saving = 0.0
    spec.fetch_bytes = 4
    spec.fetch_device_cast = False


def _system_spec(system: str, opts: Options, total_params: int) -> SystemSpec:
    opts.validate()
    if system == "superoffload":
        device_cast = opts.grad_cast == "device"
        param_device_cast = opts.param_cast == "device"
        fused_return_cast = not param_device_cast and opts.host_optimizer == "grace"
        spec_extra = ROLLBACK_SPEC_EXTRA[opts.rollback_mode] if opts.speculation else 0.0
        commit = ROLLBACK_COMMIT_BYTES[opts.rollback_mode] if opts.speculation else 0.0
        if opts.host_optimizer != "grace":  # the unfused kernels' copies (UNFUSED_*, above)
            out_copy = UNFUSED_OUT_COPY if (param_device_cast or opts.precision == "fp32") else 0.0
            spec_extra += UNFUSED_GRAD_COPY + out_copy + (UNFUSED_SPEC_COPY if opts.speculation else 0.0)
            commit += UNFUSED_GRAD_COPY if commit else 0.0
        saving = 0.0 if device_cast else LOWP_GRAD_READ_SAVING
        return SystemSpec(
            name=system, bucket_size=opts.bucket_size, device_tail_buckets=opts.device_tail_buckets,
            host_optimizer=opts.host_optimizer,
            grad_d2h_bytes=4 if device_cast else 2, grad_device_cast=device_cast,
            grad_host_cast=not device_cast,
            host_waits_backward=not opts.speculation,
            # GraceAdam writes the bf16 upload copy in the same pass (+2 B) when parameters cast on the host
            spec_extra_bytes=spec_extra + (2.0 if fused_return_cast else 0.0) - saving,
            fused_cast_bytes=2.0 if fused_return_cast else 0.0, lowp_grad_saving=saving,
            commit_bytes=commit - saving if commit else 0.0,
            return_bytes=4 if param_device_cast else 2, return_device_cast=param_device_cast,
            return_host_cast=not param_device_cast and not fused_return_cast,
            flow_layers=frozenset(opts.flow_layers), flow_prefetch=opts.flow_prefetch,
            grad_accum=opts.grad_accum, upload_slots=opts.upload_slots)
    if system == "ds_superoffload":
        # ZeRO-3 sub-groups; the first (1 - ratio) share in flat order (= last in backward) stays on the
        # GPU. Since DeepSpeed PR #7906 the CPU step overlaps backward only without clipping. Grads are
        # cast with .float() on the GPU and copied fp32 [A]. Parameters return serially at the end
        # through copy_(fp32 cpu -> bf16 gpu), which casts on the CPU into a pageable temporary
        # [inferred from PyTorch copy_ semantics].
        n_buckets = max(1, round(total_params / opts.ds_bucket_size))
        tail = int((1.0 - opts.ds_ratio) * n_buckets)
        return SystemSpec(
            name=system, bucket_size=opts.ds_bucket_size, device_tail_buckets=tail, host_optimizer="cpuadam",
            grad_d2h_bytes=4, grad_device_cast=True, grad_host_cast=False,
            host_waits_backward=opts.clipping,
            return_bytes=2, return_host_cast=True, return_pageable=True, return_after_all=True,
            forward_waits_all=True, grad_accum=opts.grad_accum,
            notes=["speculation " + ("off (clipping on)" if opts.clipping else "on (clipping off)")])
    if system in ("zero_offload", "zero_infinity"):
        # ZeRO-2 (zero_offload) / ZeRO-3 with resident params (zero_infinity as the artifact configures
        # it): gradients stream to the host during backward (copy_ bf16 gpu -> fp32 cpu casts on the
        # GPU [inferred]); DeepSpeed CPU-Adam runs after backward; parameters return through the
        # same pageable copy_ path; the next forward starts after the whole step.
        return SystemSpec(
            name=system, bucket_size=opts.zero_bucket_size, device_tail_buckets=0, host_optimizer="cpuadam",
            grad_d2h_bytes=4, grad_device_cast=True, grad_host_cast=False, host_waits_backward=True,
            return_bytes=2, return_host_cast=True, return_pageable=True,
            return_after_all=system == "zero_offload",  # ZeRO-3 copies back per sub-group
            forward_waits_all=True, grad_accum=opts.grad_accum)
    if system == "fsdp_offload":
        # FSDP2 + CPUOffloadPolicy: fp32 sharded params live on the host; each layer is copied H2D
        # (fp32) and cast for forward and again for backward (reshard after forward); fp32 grads are
        # copied D2H per layer; torch's CPU AdamW runs after backward; nothing returns.
        layer = 1  # buckets are per layer; size set by the builder from the shape
        return SystemSpec(
            name=system, bucket_size=layer, device_tail_buckets=0, host_optimizer="torch",
            grad_d2h_bytes=4, grad_device_cast=True, grad_host_cast=False, host_waits_backward=True,
            return_bytes=0, forward_waits_all=True, all_layers_stream=True, fetch_bytes=4,
            fetch_device_cast=True, flow_prefetch=opts.flow_prefetch, grad_accum=opts.grad_accum)
    if system == "ulysses":
        # DeepSpeed-Ulysses with ZeRO-3 and no offload (the artifact's `ulysses` mode,
        # experiment/sequence_length/ulysses.json: stage 3, overlap_comm false, default buckets): gradients
        # reduce-scattered per DeepSpeed's default reduce bucket, the fused Adam on the device after backward
        # (every bucket is a device "tail" bucket), the next forward after the whole step. host_optimizer is
        # unused (nothing steps on the host).
        return SystemSpec(name=system, bucket_size=opts.zero_bucket_size, device_tail_buckets=1 << 30,
                          host_optimizer="torch", grad_d2h_bytes=0, grad_device_cast=False, grad_host_cast=False,
                          host_waits_backward=True, return_bytes=0, forward_waits_all=True,
                          flow_prefetch=opts.flow_prefetch, grad_accum=opts.grad_accum,
                          notes=["DeepSpeed-Ulysses, ZeRO-3 on the device (no offload)"])
    if system == "torch":
        return SystemSpec(name=system, bucket_size=max(1, total_params), device_tail_buckets=1,
                          host_optimizer="torch", grad_d2h_bytes=0, grad_device_cast=False,
                          grad_host_cast=False, host_waits_backward=True, return_bytes=0,
                          forward_waits_all=True, device_only=True, grad_accum=opts.grad_accum)
    raise ValueError(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS + PAPER_ONLY_SYSTEMS)}")
