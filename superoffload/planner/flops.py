"""FLOPs of one training step and of its per-layer ops.

Model FLOPs (MFU, TFLOPS): 6N per token for the matmuls (N = ``ModelShape.matmul_params()``, LM head
included, embedding lookups excluded) plus causal attention 6·L·h·s per token (QKᵀ and AV, forward 2,
backward 4, halved by the causal mask). Recompute is never model FLOPs; hardware FLOPs (HFU) add it.
"""

from __future__ import annotations

from dataclasses import dataclass

from superoffload.shapes import ModelShape


def attn_width(shape: ModelShape) -> int:
    """Width of the score/value products: query heads x head dim (= hidden for these models)."""
    return shape.heads * shape.head_dim


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one transformer block for one micro-batch (backward is 2x each part)."""

    matmul: float
    attention: float

    @property
    def total(self) -> float:
        return self.matmul + self.attention


def layer_forward_flops(shape: ModelShape, seq: int, batch: int, sp: int = 1) -> LayerFlops:
    """One rank's share: ``seq`` is the global sequence length, ``sp`` the sequence-parallel degree."""
    tokens = seq * batch
    # causal: QKᵀ and AV each cost 2·s²·width per sequence at full mask, half of it under the mask
    attention = 2.0 * batch * seq * seq * attn_width(shape)
    if sp == 1:
        return LayerFlops(matmul=2.0 * shape.block_params() * tokens, attention=attention)
    return LayerFlops(matmul=2.0 * shape.block_params() * tokens / sp, attention=attention / sp)


def head_forward_flops(shape: ModelShape, seq: int, batch: int) -> float:
    return 2.0 * shape.head_params() * seq * batch


def model_flops_per_token(shape: ModelShape, seq: int) -> float:
    return 6.0 * shape.matmul_params() + 6.0 * shape.layers * attn_width(shape) * seq


def step_model_flops(shape: ModelShape, seq: int, tokens: int) -> float:
    return model_flops_per_token(shape, seq) * tokens


def step_hardware_flops(shape: ModelShape, seq: int, batch: int, micro_steps: int,
                        activation_checkpointing: bool, sp: int = 1) -> float:
    """Model FLOPs plus the recomputed forward of every block when checkpointing (one rank's, of ``sp``)."""
    model = step_model_flops(shape, seq, seq * batch * micro_steps // sp)
    if not activation_checkpointing:
        return model
    return model + micro_steps * shape.layers * layer_forward_flops(shape, seq, batch, sp).total


def megatron_flops(shape: ModelShape, seq: int, batch: int, activation_checkpointing: bool) -> float:
    """The throughput formula the paper's artifact prints (``throughput_calculator`` in megatron/utils.py of
    github.com/Supercomputing-System-AI-Lab/Megatron-DeepSpeed, branch superoffload).

    Counts recompute (x4 with checkpointing) and full, non-causal attention; for comparing with
    numbers printed by the authors' runs, not for our MFU.
    """
    h, s, lyr, v = shape.hidden, seq, shape.layers, shape.vocab
    fwd_macs = batch * lyr * (12 * h * h * s + 2 * h * s * s) + batch * v * h * s
    return 2.0 * (4 if activation_checkpointing else 3) * fwd_macs
