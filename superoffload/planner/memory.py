"""Device (HBM) and host memory of one training configuration, as itemised byte counts.

Activations follow Korthikanti et al. (arXiv 2205.05198) without dropout masks and with flash
attention (no s² score matrix kept): per token and layer, the bf16 tensors backward needs. With full
activation checkpointing only each block's input is kept, plus one block's full working set while it
is recomputed and differentiated (activations and their gradients: 2x).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from superoffload.shapes import ModelShape

BF16 = 2
FP32 = 4
ADAM_STATE = 3 * FP32  # fp32 master, m, v
# host bytes/param that exact rollback keeps: full_copy double-buffers master, m and v
ROLLBACK_EXTRA_HOST_BYTES = {"deferred": 0, "full_copy": ADAM_STATE}


def act_bytes_per_token(shape: ModelShape) -> int:
    """bf16 activations one block keeps for backward, per token, no checkpointing."""
    h, f = shape.hidden, shape.ffn_hidden
    kv = shape.n_kv_heads * shape.head_dim
    attn = h + h + (h + 2 * kv) + h  # norm in, norm out (qkv input), q/k/v, attention output
    mlp = h + h + f + f + (f if shape.gated_mlp else 0)  # residual in, norm out, fc out(s), act out
    return BF16 * (attn + mlp)


def activation_bytes(shape: ModelShape, seq: int, batch: int, checkpointing: bool) -> int:
    tokens = seq * batch
    full_layer = act_bytes_per_token(shape) * tokens
    if checkpointing:
        return shape.layers * BF16 * shape.hidden * tokens + 2 * full_layer
    return shape.layers * full_layer + full_layer  # + one layer of activation gradients in flight


def logits_bytes(shape: ModelShape, seq: int, batch: int) -> int:
    # bf16 logits plus the fp32 copy the cross-entropy and its gradient work in
    return seq * batch * shape.vocab * (BF16 + FP32)


@dataclass
class MemoryEstimate:
    device: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)

    @property
    def device_total(self) -> float:
        return sum(self.device.values())

    @property
    def host_total(self) -> float:
        return sum(self.host.values())

    def to_dict(self) -> dict:
        return {"device": dict(self.device), "host": dict(self.host),
                "device_total": self.device_total, "host_total": self.host_total}


def layer_params(shape: ModelShape) -> int:
    return shape.block_params()
