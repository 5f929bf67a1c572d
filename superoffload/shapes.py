"""Model shapes: the numbers every FLOPs, memory and cost calculation starts from.

This module sits below both the engine and the harness (it imports nothing from either), so the
planner, the FLOPs accounting and the model zoo all agree on one description of a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer.

    ``ffn_hidden`` is the MLP inner size; ``gated_mlp`` means SwiGLU-style (three matrices: gate,
    up, down) instead of GPT's two. ``kv_heads`` < ``heads`` is grouped-query attention.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn_hidden: int
    kv_heads: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = True
    learned_positions: bool = True  # GPT-2 / Megatron style absolute position embeddings
    max_seq: int = 2048
    family: str = "gpt"  # "gpt" (our nanoGPT-style model) or "hf" (built from a transformers config)
    hf_config: dict | None = None  # kwargs of the transformers config class, for family "hf"

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"{self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    # --- parameter counts -------------------------------------------------------------------
    def block_params(self) -> int:
        """Parameters of one transformer block (matrices, biases and norms)."""
        h, f = self.hidden, self.ffn_hidden
        kv = self.n_kv_heads * self.head_dim
        if self.family == "gpt":
            # qkv (h x 3h + 3h), proj (h x h + h), fc (h x f + f), fc2 (f x h + h), 2 LayerNorms (2h each)
            return h * (h + 2 * kv) + (h + 2 * kv) + h * h + h + h * f + f + f * h + h + 4 * h
        # Llama-style: q, k, v, o without biases, gated MLP (3 matrices), 2 RMSNorms (h each)
        mlp = (3 if self.gated_mlp else 2) * h * f
        return h * h + 2 * h * kv + h * h + mlp + 2 * h

    def embedding_params(self) -> int:
        """Token embedding (+ position embedding) parameters: looked up, not multiplied."""
        pos = self.max_seq * self.hidden if self.learned_positions else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """LM-head matrix parameters (shared with the token embedding when tied)."""
        return self.vocab * self.hidden

    def total_params(self) -> int:
        final_norm = (2 if self.family == "gpt" else 1) * self.hidden
        head = 0 if self.tied_embeddings else self.head_params()
        return self.layers * self.block_params() + self.embedding_params() + final_norm + head

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: the N of 6N.

        Blocks plus the LM head (counted once even when tied); position embeddings and the input
        lookup cost no multiply-adds. Norm and bias parameters are included (negligible, and the
        convention of nanoGPT/torchtitan).
        """
        final_norm = (2 if self.family == "gpt" else 1) * self.hidden
        return self.layers * self.block_params() + final_norm + self.head_params()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.total_params()
        return d
