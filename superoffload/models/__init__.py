"""The model zoo: the shapes of ``superoffload.shapes.MODELS`` (the GPT family of the paper's artifact, tiny
CI models, Hugging Face shapes) built as torch modules.

The zoo sits below every package that trains a model (engine tests, ``sequence``, the harness, ``finetune``,
``calibrate``), so it imports only ``shapes`` and torch (transformers for the Hugging Face family). What
sits above it reaches in through hooks the models offer, never by checking their classes:

- ``sequence_parallel_plan()`` (``models.parallel``): where sequence parallelism attaches;
- ``offload_checkpoints_to(offloader)``: checkpoint every block through a host-memory offloader
  (``superoffload.sequence.enable_offloaded_checkpointing`` calls it).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from superoffload.shapes import MODELS, ModelShape, get_shape

__all__ = ["MODELS", "build_model", "get_shape", "count_params"]


def build_model(shape: ModelShape, *, seq: int, seed: int, activation_checkpointing: bool = False,
                device: str | torch.device = "cpu", init_std: float = 0.02) -> nn.Module:
    """Build a model with deterministic fp32 initial weights (``device="meta"`` builds no storage).

    The same (shape, seq, seed) gives bit-identical weights on every call: every system under test
    starts from the same point. Checkpoints held in host memory are switched on afterwards, by
    ``superoffload.sequence.enable_offloaded_checkpointing`` (the harness's ``build_model`` takes "offload").
    """
    if activation_checkpointing not in (False, True):
        raise ValueError(f"activation_checkpointing must be False or True, got {activation_checkpointing!r} "
                         "(host-memory checkpoints: superoffload.sequence.enable_offloaded_checkpointing)")
    torch.manual_seed(seed)
    with torch.device(device):
        if shape.family == "gpt":
            from superoffload.models.gpt import GPT

            model = GPT(shape, max_seq=max(seq, 1) if shape.learned_positions else None,
                        init_std=init_std, activation_checkpointing=activation_checkpointing)
        else:
            from superoffload.models.hf import build_hf

            model = build_hf(shape, activation_checkpointing=activation_checkpointing, init_std=init_std)
    return model


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
