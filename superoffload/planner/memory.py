"""Device (HBM) and host memory of one training configuration, as itemised byte counts.

Activations follow Korthikanti et al. (arXiv 2205.05198) without dropout masks and with flash
attention (no s² score matrix kept): per token and layer, the tensors backward needs, in the training
precision. With full activation checkpointing only each block's input is kept, plus one block's full
working set while it is recomputed and differentiated (activations and their gradients: 2x).
`engine_memory` itemises the SuperOffload engine's own allocations, as its memory ledger measures them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from superoffload.shapes import ModelShape

BF16 = 2
FP32 = 4
ADAM_STATE = 3 * FP32  # fp32 master, m, v
# host bytes/param that exact rollback keeps: full_copy double-buffers master, m and v
ROLLBACK_EXTRA_HOST_BYTES = {"deferred": 0, "full_copy": ADAM_STATE}


def act_bytes_per_token(shape: ModelShape, precision_bytes: int = BF16) -> int:
    """Activations one block keeps for backward, per token, no checkpointing, in the training precision.

    The tensors of Korthikanti et al.: attention (norm in, norm out, q/k/v, attention output) and MLP
    (residual in, norm out, fc output(s), activation output). The Hugging Face Llama layout keeps more,
    measured on the simulated device's ledger (tests/harness/test_bench_memory.py): its RMSNorm works in
    fp32 (with low-precision weights each norm keeps an fp32 copy of its input) and RoPE keeps q, k and
    their rotated halves."""
    h, f = shape.hidden, shape.ffn_hidden
    kv = shape.n_kv_heads * shape.head_dim
    attn = h + h + (h + 2 * kv) + h
    mlp = h + h + f + f + (f if shape.gated_mlp else 0)
    out = precision_bytes * (attn + mlp)
    if shape.family == "hf":
        out += precision_bytes * 2 * (h + kv)  # RoPE: q, k and their rotated halves
        if precision_bytes < FP32:
            out += 2 * FP32 * h  # two RMSNorms keep their input upcast to fp32
    return out


def activation_memory(shape: ModelShape, seq: int, batch: int, checkpointing: bool,
                      precision_bytes: int = BF16) -> dict[str, int]:
    """The model's device memory at the peak of a step, in two terms:

    - `activations`: what forward keeps for backward: every block's tensors, or with full activation
      checkpointing only each block's input;
    - `backward_transients`: the larger of the loss backward's (the fp32 log-softmax kept for backward
      and its incoming and outgoing fp32 gradients: three [tokens, vocab] tensors) and a block's
      backward (its activation gradients; with checkpointing also its recomputed activations).

    Checked against the simulated device's ledger (tests/harness/test_bench_memory.py): for small-hidden
    models the peak is in the loss backward."""
    tokens = seq * batch
    full_layer = act_bytes_per_token(shape, precision_bytes) * tokens
    if checkpointing:
        kept, block = shape.layers * precision_bytes * shape.hidden * tokens, 2 * full_layer
    else:
        kept, block = shape.layers * full_layer, full_layer
    loss = tokens * shape.vocab * 3 * FP32
    return {"activations": kept, "backward_transients": max(loss, block)}


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


def layer_params(shape: ModelShape) -> int:
    return shape.block_params()


# ---------------------------------------------------------------------------------------------------
# The SuperOffload engine's memory, allocation by allocation (what its ledger measures)
# ---------------------------------------------------------------------------------------------------
HOST_ALIGN = 64  # bytes: every carved host buffer starts on a cache line (engine/buffers.py)
NORM_BYTES = 8  # the fp64 squared norm of each bucket (device) and of each host shard (pinned)
PRECISION_BYTES = {"fp32": FP32, "bf16": BF16, "fp16": BF16}
PINNED_KEYS = frozenset({"landing", "upload", "norms", "flow_stores"})


@dataclass(frozen=True)
class EngineMemoryInput:
    """The engine config keys and run facts its memory depends on."""

    precision: str = "bf16"
    bucket_size: int = 1 << 24
    device_tail_buckets: int = 0
    flow_layers: tuple[int, ...] = ()
    flow_prefetch: int = 1
    grad_cast: str = "device"
    param_cast: str = "host"
    rollback_mode: str = "deferred"
    amsgrad: bool = False
    grad_accum: int = 1
    staging_buffers: int = 2
    world: int = 1
    device_is_host: bool = False


def _aligned(n: int) -> int:
    return -(-n // HOST_ALIGN) * HOST_ALIGN


def engine_buckets(shape: ModelShape, m: EngineMemoryInput) -> list[Any]:
    """The engine's buckets for this shape (superoffload.packing, in the usual arrival order)."""
    from superoffload.packing import ShapeTensor, plan_buckets

    tensors = [ShapeTensor(f"{unit}.{i}", n, unit=unit) for i, (unit, n) in enumerate(shape.param_tensors())]
    flowed = {f"L{i}" for i in m.flow_layers}
    order = list(reversed(range(len(tensors))))
    return plan_buckets(tensors, order, m.bucket_size, m.device_tail_buckets, m.world,
                        segment=lambda t: t.unit if t.unit in flowed else None)


def engine_memory(shape: ModelShape, seq: int, batch: int, checkpointing: bool, m: EngineMemoryInput) -> MemoryEstimate:
    """Peak device bytes and host bytes of one rank of the engine, by the categories of its memory
    ledger (superoffload/device/ledger.py). Each term is an allocation the engine makes:

    device: `weights` (every resident bucket's flat weights, padded), `flow` (the flowed blocks resident
    at once), `tail_state` (fp32 master, m, v, gradient shard of tail buckets), `staging` (the ring of
    flat-gradient slots, the reduced-shard slots with several ranks, the bucket norms, the fp32 landing
    slot of param_cast "device"), `grads` (with accumulation, autograd's gradients held between
    micro-batches), `activations` and `backward_transients` (the model's, in the training precision:
    `activation_memory`);
    host: pinned `landing`, `upload`, `norms`, `flow_stores`; pageable `master_m_v` and `spare`
    (full_copy). On a device that is the host nothing is pinned and landing/upload are pageable."""
    p = PRECISION_BYTES[m.precision]
    lowp = m.precision != "fp32"
    world = m.world
    buckets = engine_buckets(shape, m)
    host_b = [b for b in buckets if not b.on_device]
    gbytes = p if (lowp and m.grad_cast == "host" and world == 1) else FP32
    ubytes = p if (lowp and m.param_cast == "host") else FP32
    est = MemoryEstimate()
    dev, host = est.device, est.host
    dev["weights"] = p * sum(b.padded for b in buckets if b.flow_block is None)
    flow_blocks: dict[Any, int] = {}
    for b in buckets:
        if b.flow_block is not None:
            flow_blocks[b.flow_block] = flow_blocks.get(b.flow_block, 0) + b.padded
    if flow_blocks:
        slots = min(m.flow_prefetch + 1, len(flow_blocks))
        dev["flow"] = p * slots * max(flow_blocks.values())
    dev["tail_state"] = (5 if m.amsgrad else 4) * FP32 * sum(b.padded // world for b in buckets if b.on_device)
    staging = NORM_BYTES * len(buckets)
    ring = [b.padded for b in (buckets if world > 1 else host_b)]
    if ring and (world > 1 or not m.device_is_host):
        largest = max(ring)
        staging += m.staging_buffers * largest * (FP32 if world > 1 else gbytes)
        if world > 1 and not m.device_is_host:
            staging += m.staging_buffers * (largest // world) * FP32
    if lowp and m.param_cast == "device" and not m.device_is_host and host_b:
        staging += FP32 * max(b.padded // world for b in host_b)
    dev["staging"] = staging
    if m.grad_accum > 1:
        dev["grads"] = p * shape.total_params()
    dev.update(activation_memory(shape, seq, batch, checkpointing, p))
    state = (4 if m.amsgrad else 3) * FP32
    for b in host_b:
        n = b.padded // world
        landing_n = b.padded if (m.device_is_host and world == 1) else n
        host["landing"] = host.get("landing", 0) + _aligned(landing_n * gbytes)
        host["upload"] = host.get("upload", 0) + _aligned(n * ubytes)
        host["norms"] = host.get("norms", 0) + _aligned(NORM_BYTES)
        if b.flow_block is not None:
            host["flow_stores"] = host.get("flow_stores", 0) + _aligned(n * p)
        host["master_m_v"] = host.get("master_m_v", 0) + state // FP32 * _aligned(n * FP32)
        if m.rollback_mode == "full_copy":
            host["spare"] = host.get("spare", 0) + state // FP32 * _aligned(n * FP32)
    est.pinned_keys = set() if m.device_is_host else set(PINNED_KEYS)
    return est
