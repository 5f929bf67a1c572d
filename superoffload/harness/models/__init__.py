"""Models the harness builds: the zoo's shapes (`superoffload.shapes.MODELS`: the GPT family of the paper's
artifact, tiny CI models, Hugging Face shapes) as torch modules."""

from __future__ import annotations

import torch
import torch.nn as nn

from superoffload.shapes import MODELS, ModelShape, get_shape

__all__ = ["MODELS", "build_model", "get_shape", "count_params"]


def build_model(shape: ModelShape, *, seq: int, seed: int, activation_checkpointing: bool = False,
                device: str | torch.device = "cpu", init_std: float = 0.02) -> nn.Module:
    """Build a model with deterministic fp32 initial weights (``device="meta"`` builds no storage).

    The same (shape, seq, seed) gives bit-identical weights on every call: every system under test
    starts from the same point.
    """
    torch.manual_seed(seed)
    with torch.device(device):
        if shape.family == "gpt":
            from superoffload.harness.models.gpt import GPT

            model = GPT(shape, max_seq=max(seq, 1) if shape.learned_positions else None,
                        init_std=init_std, activation_checkpointing=activation_checkpointing)
        else:
            from superoffload.harness.models.hf import build_hf

            model = build_hf(shape, activation_checkpointing=activation_checkpointing, init_std=init_std)
    return model


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
