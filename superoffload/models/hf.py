"""Llama-style models built from Hugging Face `transformers` config classes, without weights.

Nothing is downloaded: the config is constructed from the shape table in the zoo and the model is
created from it (on the meta device when it would not fit the host).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from superoffload.models.parallel import SequenceParallelPlan
from superoffload.shapes import ModelShape


class CausalLM(nn.Module):
    """Adapts a `transformers` causal LM to the zoo's interface ``forward(idx, targets) -> loss``.

    ``loss_fn`` (None by default: mean cross-entropy over the logits) may be set to
    ``fn(hidden, lm_head, targets) -> loss`` (the head module, so that calling it on zero tokens lets an
    engine's pre-forward hook wait for its weight: superoffload.sequence.head_weight); the logits are then
    left to it (superoffload.sequence
    uses this for the token-normalized and the tiled loss). It assumes logits = lm_head(last hidden state),
    true of the Llama-style models of the zoo.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn: Callable[[torch.Tensor, nn.Module, torch.Tensor], torch.Tensor] | None = None
        self.activation_offloader = None  # set by offload_checkpoints_to

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is not None and self.loss_fn is not None:
            hidden = self.model.get_decoder()(input_ids=idx, use_cache=False).last_hidden_state
            return self.loss_fn(hidden, self.model.get_output_embeddings(), targets)  # see sequence.head_weight
        logits = self.model(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


    def sequence_parallel_plan(self) -> SequenceParallelPlan:
        """The transformers route, with this wrapper's ``loss_fn`` as the loss to replace."""
        return SequenceParallelPlan(loss_owner=self, transformers_model=self.model)

    def offload_checkpoints_to(self, offloader) -> None:
        """Checkpoint every decoder layer through ``offloader.checkpoint`` (an ``ActivationOffloader`` of
        superoffload.sequence: the layers' inputs are held in host memory)."""
        checkpoint_transformers_with(self.model, offloader.checkpoint)
        self.model.activation_offloader = offloader
        self.activation_offloader = offloader


def checkpoint_transformers_with(hf: nn.Module, fn: Callable) -> None:
    """Checkpoint every decoder layer of a transformers model through ``fn`` (called as
    ``torch.utils.checkpoint.checkpoint``), with transformers' own per-layer hook
    (``GradientCheckpointingLayer`` calls the model's checkpointing function); the KV cache is turned off."""
    if not getattr(hf, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(hf).__name__} does not support activation checkpointing")
    hf._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=fn)
    if getattr(hf.config, "use_cache", False):
        hf.config.use_cache = False


def build_hf(shape: ModelShape, *, activation_checkpointing: bool, init_std: float = 0.02) -> nn.Module:
    """``activation_checkpointing``: False or True (transformers' checkpointing); checkpoints in host memory:
    ``CausalLM.offload_checkpoints_to``."""
    if activation_checkpointing not in (False, True):
        raise ValueError(f"activation_checkpointing must be False or True, got {activation_checkpointing!r}")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"model {shape.name!r} needs the `transformers` package: pip install -e '.[bench]'") from e
    assert shape.hf_config is not None
    cfg = dict(shape.hf_config)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, initializer_range=init_std, attn_implementation="sdpa",
                                  **cfg)
    model = AutoModelForCausalLM.from_config(config)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return CausalLM(model)
