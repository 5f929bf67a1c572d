"""Llama-style models built from Hugging Face `transformers` config classes, without weights.

Nothing is downloaded: the config is constructed from the shape table in the zoo and the model is
created from it (on the meta device when it would not fit the host).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from superoffload.shapes import ModelShape


class CausalLM(nn.Module):
    """Adapts a `transformers` causal LM to the harness interface ``forward(idx, targets) -> loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.model(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def build_hf(shape: ModelShape, *, activation_checkpointing: bool, init_std: float = 0.02) -> nn.Module:
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
