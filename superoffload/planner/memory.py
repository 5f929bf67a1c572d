"""Device (HBM) and host memory of one training configuration, as itemised byte counts.

Activations follow Korthikanti et al. (arXiv 2205.05198) without dropout masks and with flash
attention (no s² score matrix kept): per token and layer, the tensors backward needs, in the training
precision. With full activation checkpointing only each block's input is kept, plus one block's full
working set while it is recomputed and differentiated (activations and their gradients: 2x).
`engine_memory` itemises the SuperOffload engine's own allocations, as its memory ledger measures them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from superoffload.options import (
    ENGINE_DEFAULTS,
    MEMORY_DEFAULTS,
    PRECISION_BYTES,
    CastSide,
    Precision,
    RollbackMode,
)
from superoffload.packing import ShapeTensor, chains, plan_buckets, tail_start
from superoffload.shapes import ModelShape, ulysses_kv_repeat

BF16 = PRECISION_BYTES["bf16"]
FP32 = PRECISION_BYTES["fp32"]
ADAM_STATE = 3 * FP32  # fp32 master, m, v
# host bytes/param that exact rollback keeps: full_copy double-buffers master, m and v
ROLLBACK_EXTRA_HOST_BYTES = {"deferred": 0, "full_copy": ADAM_STATE}


def act_bytes_per_token(shape: ModelShape, precision_bytes: int = BF16, kv_repeat: int = 1) -> int:
    """Activations one block keeps for backward, per token, no checkpointing, in the training precision.

    The tensors of Korthikanti et al.: attention (norm in, norm out, q/k/v, attention output) and MLP
    (residual in, norm out, fc output(s), activation output). The Hugging Face Llama layout keeps more,
    measured on the simulated device's ledger (tests/harness/test_bench_memory.py): its RMSNorm works in
    fp32 (with low-precision weights each norm keeps an fp32 copy of its input) and RoPE keeps q, k and
    their rotated halves. ``kv_repeat``: Ulysses repeats each KV head that many times before its
    all-to-all when SP exceeds the KV heads, and attention keeps the repeated k and v."""
    h, f = shape.hidden, shape.ffn_hidden
    kv = shape.n_kv_heads * shape.head_dim * kv_repeat
    attn = h + h + (h + 2 * kv) + h
    mlp = h + h + f + f + (f if shape.gated_mlp else 0)
    out = precision_bytes * (attn + mlp)
    if shape.family == "hf":
        out += precision_bytes * 2 * (h + kv)  # RoPE: q, k and their rotated halves
        if precision_bytes < FP32:
            out += 2 * FP32 * h  # two RMSNorms keep their input upcast to fp32
    return out


# ---------------------------------------------------------------------------------------------------
# Long sequences (superoffload/sequence): Ulysses SP, checkpoints in host memory, the tiled loss
# ---------------------------------------------------------------------------------------------------
LOSS_BYTES = 3 * FP32  # plain loss backward: fp32 log-softmax, its incoming and outgoing gradients, per token x vocab
# tiled loss backward, per tile row x vocab: the tile's logits (training precision), their fp32 copy, the
# log-softmax, its gradients and the gradient cast back; measured on the simulated device's ledger
# (tests/planner/test_long_seq.py): 16 B with bf16/fp16 logits, 20 B with fp32
TILED_LOSS_BYTES = {BF16: 16, FP32: 20}
OFFLOAD_WINDOW_BLOCKS = 2  # the block input a recompute uses + the previous block's, prefetched (checkpoint.py)


def loss_tile_rows(tokens: int, tile: int) -> int:
    """Rows of the largest tile: ``tiled_token_losses`` splits the tokens into ceil(tokens/tile) near-equal
    tiles."""
    count = max(1, -(-tokens // tile))
    return -(-tokens // count)


def loss_transient(shape: ModelShape, tokens: int, precision_bytes: int = BF16, tile: int | None = None) -> int:
    """Peak bytes of the LM loss's backward on one rank of ``tokens`` tokens.

    Plain: three fp32 [tokens, vocab] tensors. Tiled (``loss_tile`` tokens per tile): the largest tile's
    logits and their gradients (TILED_LOSS_BYTES per row and vocab entry), plus the fp32 [hidden, vocab]
    weight-gradient accumulator and the hidden-state gradient [tokens, hidden], which live through the
    whole backward; at its end the accumulator is cast to the weight's dtype (a second [vocab, hidden])."""
    h, v = shape.hidden, shape.vocab
    if tile is None:
        return tokens * v * LOSS_BYTES
    rows = loss_tile_rows(tokens, tile)
    per_row = TILED_LOSS_BYTES[FP32 if precision_bytes >= FP32 else BF16]
    live = FP32 * h * v + precision_bytes * tokens * h
    return live + max(per_row * rows * v, precision_bytes * h * v)


def ulysses_buffers(shape: ModelShape, tokens: int, precision_bytes: int = BF16, sp: int = 1) -> int:
    """A block's all-to-all buffers on one rank (superoffload/sequence/ulysses.py): an all-to-all of a
    [tokens, width] tensor holds its contiguous send copy and the receive buffer while the reshaped result
    is written, so two copies of the widest of q, k, v and the attention output; with KV repetition also
    the repeated k and v."""
    if sp <= 1:
        return 0
    rep = ulysses_kv_repeat(shape.heads, shape.n_kv_heads, sp)
    kv = shape.n_kv_heads * shape.head_dim * rep
    widest = max(shape.heads * shape.head_dim, kv)
    return precision_bytes * tokens * (2 * widest + (2 * kv if rep > 1 else 0))


def activation_memory(shape: ModelShape, seq: int, batch: int, checkpointing: bool,
                      precision_bytes: int = BF16, *, sp: int = 1, offload_checkpoints: bool = False,
                      loss_tile: int | None = None) -> dict[str, int]:
    """The model's device memory at the peak of a step on one rank, in two terms:

    - `activations`: what forward keeps for backward: every block's tensors, or with full activation
      checkpointing only each block's input; with the checkpoints in host memory
      (``offload_checkpoints``) only the window the offloader holds on the device, the input the
      recompute uses and the previous block's, prefetched (OFFLOAD_WINDOW_BLOCKS);
    - `backward_transients`: the larger of the loss backward's (`loss_transient`: three fp32 [tokens,
      vocab] tensors, or the tile's with ``loss_tile``) and a block's backward (its activation gradients;
      with checkpointing also its recomputed activations; with SP > 1 its all-to-all buffers).

    ``seq`` is the global sequence length; a rank of ``sp`` sequence-parallel ranks holds seq*batch/sp
    tokens of every activation (attention's whole-sequence q/k/v for heads/sp heads are as many elements).
    Checked against the simulated device's ledger (tests/harness/test_bench_memory.py,
    tests/planner/test_long_seq.py): for small-hidden models the peak is in the loss backward."""
    tokens = seq * batch // sp
    if checkpointing:
        blocks = min(OFFLOAD_WINDOW_BLOCKS, shape.layers) if offload_checkpoints else shape.layers
        kept = blocks * precision_bytes * shape.hidden * tokens
    else:
        kept = shape.layers * _full_layer(shape, tokens, precision_bytes, sp)
    block = block_transient(shape, seq, batch, checkpointing, precision_bytes, sp)
    loss = loss_transient(shape, tokens, precision_bytes, loss_tile)
    return {"activations": kept, "backward_transients": max(loss, block)}


def _full_layer(shape: ModelShape, tokens: int, precision_bytes: int, sp: int) -> int:
    rep = ulysses_kv_repeat(shape.heads, shape.n_kv_heads, sp) if sp > 1 else 1
    return act_bytes_per_token(shape, precision_bytes, rep) * tokens


def block_transient(shape: ModelShape, seq: int, batch: int, checkpointing: bool, precision_bytes: int = BF16,
                    sp: int = 1) -> int:
    """A block's backward on one rank: its activation gradients (with checkpointing also its recomputed
    activations: 2x its activations) and, with SP > 1, its all-to-all buffers."""
    tokens = seq * batch // sp
    full_layer = _full_layer(shape, tokens, precision_bytes, sp)
    return (2 if checkpointing else 1) * full_layer + ulysses_buffers(shape, tokens, precision_bytes, sp)


def checkpoint_host_bytes(shape: ModelShape, seq: int, batch: int, precision_bytes: int = BF16,
                          sp: int = 1) -> int:
    """Host bytes of the offloaded checkpoints at the peak (the start of backward): every block's input,
    [batch, seq/sp, hidden] in the training precision (ActivationOffloader's ``peak_host_bytes``)."""
    return shape.layers * precision_bytes * shape.hidden * (seq * batch // sp)


@dataclass
class MemoryEstimate:
    device: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    pinned_keys: set[str] = field(default_factory=set)  # host entries that are page-locked

    @property
    def pinned_total(self) -> float:
        return sum(v for k, v in self.host.items() if k in self.pinned_keys)

    @property
    def device_total(self) -> float:
        return sum(self.device.values())

    @property
    def host_total(self) -> float:
        return sum(self.host.values())

    def to_dict(self) -> dict:
        return {"device": dict(self.device), "host": dict(self.host), "pinned_keys": sorted(self.pinned_keys),
                "device_total": self.device_total, "host_total": self.host_total,
                "pinned_total": self.pinned_total}


# ---------------------------------------------------------------------------------------------------
# The SuperOffload engine's memory, allocation by allocation (what its ledger measures)
# ---------------------------------------------------------------------------------------------------
HOST_ALIGN = 64  # bytes: every carved host buffer starts on a cache line (engine/buffers.py)
NORM_BYTES = 8  # the fp64 norm of each bucket (device; engine/norms.py)
PINNED_KEYS = frozenset({"landing", "upload", "flow_stores"})


@dataclass(frozen=True)
class EngineMemoryInput:
    """The engine config keys and run facts its memory depends on. The keys have the engine's names, types and
    defaults (superoffload.options); ``costmodel.engine_memory_input`` builds one from an engine config or the
    planner's Options."""

    precision: Precision = ENGINE_DEFAULTS["precision"]
    bucket_size: int = ENGINE_DEFAULTS["bucket_size"]
    device_tail_buckets: int = ENGINE_DEFAULTS["device_tail_buckets"]
    flow_layers: tuple[int, ...] = tuple(ENGINE_DEFAULTS["flow_layers"])
    flow_prefetch: int = ENGINE_DEFAULTS["flow_prefetch"]
    grad_cast: CastSide = ENGINE_DEFAULTS["grad_cast"]
    param_cast: CastSide = ENGINE_DEFAULTS["param_cast"]
    rollback_mode: RollbackMode = ENGINE_DEFAULTS["rollback_mode"]
    amsgrad: bool = MEMORY_DEFAULTS["amsgrad"]
    grad_accum: int = ENGINE_DEFAULTS["grad_accum"]
    staging_buffers: int = MEMORY_DEFAULTS["staging_buffers"]
    upload_slots: int = ENGINE_DEFAULTS["upload_slots"]
    replicate: bool = ENGINE_DEFAULTS["replicate"]
    # run facts
    world: int = 1
    device_is_host: bool = False
    # the model side of a long-sequence run (superoffload/sequence): Ulysses degree, checkpoints in host
    # memory, tokens per tile of the loss (None: the plain loss)
    sp: int = 1
    offload_checkpoints: bool = False
    loss_tile: int | None = None


def _aligned(n: int) -> int:
    return -(-n // HOST_ALIGN) * HOST_ALIGN


@functools.lru_cache(maxsize=64)
def _engine_buckets(param_tensors: tuple[tuple[str, int], ...], bucket_size: int, world: int,
                    flow_layers: tuple[int, ...]) -> tuple[Any, ...]:
    tensors = [ShapeTensor(f"{unit}.{i}", n, unit=unit) for i, (unit, n) in enumerate(param_tensors)]
    flowed = {f"L{i}" for i in flow_layers}
    order = list(reversed(range(len(tensors))))
    return tuple(plan_buckets(tensors, order, bucket_size, 0, world,
                              segment=lambda t: t.unit if t.unit in flowed else None))


class _Packed:
    """The engine's buckets reduced to what its memory depends on, with prefix sums over arrival order, so
    that pricing a tail of k buckets (the planner tries many) costs O(1), not a pass over thousands of
    buckets: `host(k)` sums the first k buckets (the host ones), the rest are the tail."""

    def __init__(self, buckets: tuple[Any, ...], shards: int) -> None:
        self.count = len(buckets)
        self.total_padded = sum(b.padded for b in buckets)
        self.resident_padded = sum(b.padded for b in buckets if b.flow_block is None)
        blocks: dict[Any, int] = {}
        for b in buckets:
            if b.flow_block is not None:
                blocks[b.flow_block] = blocks.get(b.flow_block, 0) + b.padded
        self.flow_block_padded = list(blocks.values())
        self.largest_padded = max((b.padded for b in buckets), default=0)
        parts = [b.padded // shards for b in buckets]  # what one rank holds of each bucket
        self.shard_prefix = _prefix(parts)
        self.aligned_prefix = {w: _prefix([_aligned(n * w) for n in parts]) for w in (BF16, FP32)}
        self.padded_max = _prefix_max([b.padded for b in buckets])
        self.padded_suffix_max = _prefix_max([b.padded for b in reversed(buckets)])[::-1]  # [k]: max over [k, count)
        self.shard_max = _prefix_max(parts)
        # flowed chains (one host store each): (index of the chain's last bucket, its aligned bytes per byte width)
        pos = {id(b): i for i, b in enumerate(buckets)}
        self.flow_chains = [(pos[id(c[-1])], sum(b.padded // shards for b in c))
                            for c in chains([b for b in buckets if b.flow_block is not None])]


def _prefix(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _prefix_max(xs: list[int]) -> list[int]:
    out = [0]
    for x in xs:
        out.append(max(out[-1], x))
    return out


@functools.lru_cache(maxsize=64)
def _packed(param_tensors: tuple[tuple[str, int], ...], bucket_size: int, world: int,
            flow_layers: tuple[int, ...], shards: int) -> _Packed:
    """Buckets packed for `world` ranks (the geometry does not depend on replication), each rank holding
    1/`shards` of each (`shards`: the world, or 1 when replicated)."""
    return _Packed(_engine_buckets(param_tensors, bucket_size, world, flow_layers), shards)


def _aligned_sum(pk: _Packed, width: int, k: int) -> int:
    """Sum over the first k buckets of their shard's bytes at `width` bytes per element, each aligned."""
    return pk.aligned_prefix[width][k]


def engine_memory(shape: ModelShape, seq: int, batch: int, checkpointing: bool, m: EngineMemoryInput) -> MemoryEstimate:
    """Peak device bytes and host bytes of one rank of the engine, by the categories of its memory
    ledger (superoffload/device/ledger.py). Each term is an allocation the engine makes:

    device: `weights` (every resident bucket's flat weights, padded), `flow` (the flowed blocks resident
    at once), `tail_state` (fp32 master, m, v, gradient shard of tail buckets), `staging` (the ring of
    flat-gradient slots, the reduced-shard slots with several ranks, the bucket norms, the fp32 landing
    slot of param_cast "device"), `grads` (with accumulation, autograd's gradients held between
    micro-batches), `activations` and `backward_transients` (the model's, in the training precision:
    `activation_memory`);
    host: pinned `landing`, `upload` (one buffer per host bucket's shard, or with ``upload_slots`` = k a
    ring of k slots of the largest host shard), `norms`, `flow_stores`, `activation_checkpoints` (the
    model's offloaded checkpoints, ``offload_checkpoints``); pageable `master_m_v` and `spare`
    (full_copy). On a device that is the host nothing is pinned and landing/upload are pageable. ``seq`` is the global
    sequence length; with ``m.sp`` > 1 the model's terms are one rank's share."""
    p = PRECISION_BYTES[m.precision]
    lowp = m.precision != "fp32"
    world = m.world
    shards = 1 if m.replicate else world
    pk = _packed(tuple(shape.param_tensors()), m.bucket_size, world, tuple(m.flow_layers), shards)
    k = tail_start(pk.count, m.device_tail_buckets)  # buckets [0, k) are host buckets, [k, count) the tail
    gbytes = p if (lowp and m.grad_cast == "host") else FP32  # flattened, reduced and moved in this
    ubytes = p if (lowp and m.param_cast == "host") else FP32
    est = MemoryEstimate()
    dev, host = est.device, est.host
    dev["weights"] = p * pk.resident_padded
    if pk.flow_block_padded:
        slots = min(m.flow_prefetch + 1, len(pk.flow_block_padded))
        dev["flow"] = p * slots * max(pk.flow_block_padded)
    dev["tail_state"] = (5 if m.amsgrad else 4) * FP32 * (pk.shard_prefix[-1] - pk.shard_prefix[k])
    # replicated, a bucket's norm is taken per rank's part (engine/norms.py)
    staging = NORM_BYTES * pk.count * (world if m.replicate else 1)
    # the buckets whose flat gradient passes the staging ring (engine/build.py staging_ring): host buckets
    # unless the device is the host and a bucket is not split across ranks (flattened into its landing
    # buffer); tail buckets with several ranks (reduced before their fp32 gradient takes them)
    host_in_ring = k if not (m.device_is_host and shards == 1) else 0
    tail_in_ring = pk.count - k if world > 1 else 0
    if host_in_ring or tail_in_ring:
        largest = max(pk.padded_max[k] if host_in_ring else 0, pk.padded_suffix_max[k] if tail_in_ring else 0)
        staging += m.staging_buffers * largest * gbytes
        if shards > 1 and (not m.device_is_host or gbytes != FP32):  # the reduce-scatter's output slots
            staging += m.staging_buffers * (largest // shards) * gbytes
    if lowp and m.param_cast == "device" and not m.device_is_host and k:
        staging += FP32 * pk.shard_max[k]
    dev["staging"] = staging
    if m.grad_accum > 1:
        dev["grads"] = p * shape.total_params()
    dev.update(activation_memory(shape, seq, batch, checkpointing, p, sp=m.sp,
                                 offload_checkpoints=m.offload_checkpoints, loss_tile=m.loss_tile))
    state = (4 if m.amsgrad else 3) * FP32
    if k:  # each host bucket's shard: landing, upload, master/m/v (and spare), each aligned
        host["landing"] = _aligned_sum(pk, gbytes, k)
        if not m.upload_slots:
            host["upload"] = _aligned_sum(pk, ubytes, k)
        host["master_m_v"] = state // FP32 * _aligned_sum(pk, FP32, k)
        if m.rollback_mode == "full_copy":
            host["spare"] = state // FP32 * _aligned_sum(pk, FP32, k)
    stores = [n for last, n in pk.flow_chains if last < k]  # one store per chain of flowed host buckets
    if stores:
        host["flow_stores"] = sum(_aligned(n * p) for n in stores)
    if m.upload_slots and k:
        host["upload"] = m.upload_slots * _aligned(pk.shard_max[k] * ubytes)
    if m.offload_checkpoints and checkpointing:
        host["activation_checkpoints"] = checkpoint_host_bytes(shape, seq, batch, p, m.sp)
    est.pinned_keys = set() if m.device_is_host else set(PINNED_KEYS) | ({"activation_checkpoints"} & set(host))
    return est
