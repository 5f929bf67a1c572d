"""The model zoo as the harness builds it: ``superoffload.models``, re-exported, with one mode more.

``build_model(activation_checkpointing="offload")`` (``RunConfig.checkpointing_mode`` under
``--offload-checkpoints``) builds the zoo model and then holds its checkpoints in host memory with
``superoffload.sequence.enable_offloaded_checkpointing``; the zoo itself sits below ``sequence`` and so
knows only False and True.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from superoffload import models as zoo
from superoffload.models import MODELS, count_params, get_shape
from superoffload.shapes import ModelShape

__all__ = ["MODELS", "build_model", "get_shape", "count_params"]


def build_model(shape: ModelShape, *, seq: int, seed: int, activation_checkpointing: bool | str = False,
                device: str | torch.device = "cpu", init_std: float = 0.02) -> nn.Module:
    """``superoffload.models.build_model``; ``activation_checkpointing`` may also be "offload" (checkpoints
    in host memory; stats on the returned module's ``activation_offloader``)."""
    offload = activation_checkpointing == "offload"
    model = zoo.build_model(shape, seq=seq, seed=seed, activation_checkpointing=False if offload else
                            activation_checkpointing, device=device, init_std=init_std)
    if offload:
        from superoffload.sequence.checkpoint import enable_offloaded_checkpointing

        enable_offloaded_checkpointing(model)
    return model
