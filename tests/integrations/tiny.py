"""A tiny Hugging Face Llama built from its config (nothing downloaded) and deterministic token batches,
shared by the drop-in tests (superoffload.AdamW, the Trainer, TRL, Accelerate, DeepSpeed scripts)."""

from __future__ import annotations

import torch

VOCAB = 256


def tiny_llama(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def token_batches(n: int, batch: int = 2, seq: int = 16, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(n)]


def decay_groups(model: torch.nn.Module, weight_decay: float = 0.1, extra_lr: float | None = None) -> list[dict]:
    """The Hugging Face Trainer's decay / no-decay split, and (with `extra_lr`) the LM head as a third group
    at its own learning rate."""
    head = [p for n, p in model.named_parameters() if n.startswith("lm_head")] if extra_lr else []
    rest = [(n, p) for n, p in model.named_parameters() if not any(p is h for h in head)]
    groups = [{"params": [p for n, p in rest if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for n, p in rest if p.dim() < 2], "weight_decay": 0.0}]
    if head:
        groups.append({"params": head, "weight_decay": weight_decay, "lr": extra_lr})
    return groups


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b, strict=True))
