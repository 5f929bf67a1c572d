"""FLOPs accounting: model FLOPs (MFU) and hardware FLOPs (HFU).

Per token, for a decoder with N matmul parameters (``ModelShape.matmul_params``: blocks + LM head,
no position embeddings, no input lookup), L layers, hidden h and sequence s:

- matmuls: 2N forward + 4N backward = 6N
- attention scores and values: forward 2·2·s·h per token per layer non-causal (QK^T and AV), half of
  that with a causal mask; backward twice the forward. Causal: 6·L·h·s per token.

model FLOPs/token  = 6N + 6·L·h·s                   (no recompute; the MFU numerator, PaLM App. B
                                                     with the causal halving)
hardware FLOPs/token = model + recompute, where full-block activation checkpointing re-runs each
                     block's forward once: 2·N_blocks + 2·L·h·s    (the HFU numerator)
"""

from __future__ import annotations

from dataclasses import dataclass

from superoffload.planner.flops import layer_forward_flops, model_flops_per_token
from superoffload.shapes import ModelShape

__all__ = ["Throughput", "hardware_flops_per_token", "model_flops_per_token", "recompute_flops_per_token",
           "throughput"]


def recompute_flops_per_token(shape: ModelShape, seq: int, activation_checkpointing: bool) -> float:
    """One more forward of every block per token (the cost model uses the same per-layer formula)."""
    if not activation_checkpointing:
        return 0.0
    return shape.layers * layer_forward_flops(shape, seq, batch=1).total / seq


def hardware_flops_per_token(shape: ModelShape, seq: int, activation_checkpointing: bool) -> float:
    return model_flops_per_token(shape, seq) + recompute_flops_per_token(shape, seq, activation_checkpointing)


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # per rank
    model_tflops: float  # per device
    hardware_tflops: float
    mfu: float
    hfu: float


def throughput(shape: ModelShape, seq: int, tokens_per_step_per_rank: int, step_time_s: float,
               peak_flops: float, activation_checkpointing: bool) -> Throughput:
    """Throughput of one rank from its median step time. MFU/HFU are fractions (0..1)."""
    if step_time_s <= 0:
        raise ValueError(f"step time must be positive, got {step_time_s}")
    tps = tokens_per_step_per_rank / step_time_s
    mf = model_flops_per_token(shape, seq) * tps
    hf = hardware_flops_per_token(shape, seq, activation_checkpointing) * tps
    return Throughput(tokens_per_s=tps, model_tflops=mf / 1e12, hardware_tflops=hf / 1e12,
                      mfu=mf / peak_flops, hfu=hf / peak_flops)
