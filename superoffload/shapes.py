"""Model shapes: the numbers every FLOPs, memory and cost calculation starts from.

This module sits below the engine, the planner and the harness (it imports nothing from any of them),
so the planner, the FLOPs accounting and the harness's model builders all agree on one description of
a model: its sizes, its list of parameter tensors (`ModelShape.param_tensors`) and the named shapes
of the model zoo (`MODELS`, `get_shape`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    def param_tensors(self) -> list[tuple[str, int]]:
        """(unit, numel) of every parameter tensor, in the harness model's registration order.

        A *unit* is what one forward op needs: ``EMBEDDING_UNIT`` (token + position embedding),
        ``block_unit(i)``, ``FINAL_UNIT`` (final norm + an untied LM head). The "gpt" family follows
        superoffload/models/gpt.py (per block: ln1, qkv, proj, ln2, fc, fc2, weights before
        biases); the "hf" family the Llama layout of transformers (q, k, v, o, gate, up, down, two
        RMSNorms). Per block the numels add up to ``block_params()``; whatever the list does not name
        (the biases of an HF variant) is one more small tensor of the block. A tied LM head is the token
        embedding's tensor, listed once.
        """
        built = self.__dict__.get("_param_tensors")  # a plan reads it thousands of times: built once
        if built is None:
            built = _param_tensors(self)
            object.__setattr__(self, "_param_tensors", built)  # frozen: a derived value, not a field
        return list(built)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.total_params()
        return d


def _param_tensors(shape: ModelShape) -> tuple[tuple[str, int], ...]:
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.n_kv_heads * shape.head_dim
    if shape.family == "gpt":
        block = [h, h, h * (h + 2 * kv), h + 2 * kv, h * h, h, h, h, h * f, f, f * h, h]
        final = [h, h]
    else:
        mlp = [h * f, h * f, f * h] if shape.gated_mlp else [h * f, f * h]
        block = [h * h, h * kv, h * kv, h * h, *mlp, h, h]
        final = [h]
    rest = shape.block_params() - sum(block)
    if rest > 0:
        block.append(rest)
    emb = shape.embedding_params()
    tok = shape.vocab * h
    top = [(EMBEDDING_UNIT, tok)] + ([(EMBEDDING_UNIT, emb - tok)] if emb > tok else [])
    head = [] if shape.tied_embeddings else [(FINAL_UNIT, shape.head_params())]
    return tuple(top + [(block_unit(i), n) for i in range(shape.layers) for n in block]
                 + [(FINAL_UNIT, n) for n in final] + head)


EMBEDDING_UNIT = "emb"
FINAL_UNIT = "final"


def block_unit(i: int) -> str:
    """The unit name of block ``i`` in ``ModelShape.param_tensors``."""
    return f"L{i}"


def ulysses_kv_repeat(heads: int, kv_heads: int, sp: int) -> int:
    """How many times Ulysses sequence parallelism repeats each KV head before its all-to-all (1: the KV
    heads are sharded directly). The one rule the sequence package runs and the planner prices.

    ValueError when Ulysses cannot split these heads over ``sp`` ranks: the attention heads must be a
    multiple of the KV heads and divisible by SP, and the KV heads divisible by SP (sharded directly) or
    dividing it (each KV head repeated ``sp // kv_heads`` times, so every rank gets the KV head its query
    heads use)."""
    where = f"heads={heads}, kv_heads={kv_heads}, SP={sp}"
    if sp < 1:
        raise ValueError(f"sequence-parallel degree must be >= 1, got sp={sp}: {where}")
    if heads % kv_heads:
        raise ValueError(f"the attention heads are not a multiple of the KV heads: {where}")
    if heads % sp:
        raise ValueError(f"sp={sp} must divide the attention heads ({heads}): Ulysses gives each rank heads/sp of "
                         f"them, so it needs the heads divisible by the SP degree: {where}")
    if kv_heads % sp == 0:
        return 1
    if sp % kv_heads == 0:
        return sp // kv_heads
    raise ValueError(f"sp={sp}: Ulysses needs the KV heads ({kv_heads}) divisible by sp or sp divisible by them: "
                     f"{where}")


# ------------------------------------------------------------------------------------------ the zoo
# GPT family: the model table of the authors' ASPLOS artifact (github.com/Supercomputing-System-AI-Lab/
# SuperOffload, experiment/model.json): 32 heads, FFN 4h, GPT-2 BPE vocabulary padded to a multiple of
# 256 (50,432), learned positions, tied head. Labels are the artifact's, even where they differ from the
# real count (gpt-70b is 65B). Hugging Face family: the public shapes of real checkpoints (their
# config.json on the Hugging Face Hub), built from the transformers config class without downloading
# anything.
GPT_VOCAB = 50432
GPT_HEADS = 32

# label -> (layers, hidden), from the artifact's model.json
_ARTIFACT_GPT: dict[str, tuple[int, int]] = {
    "1b": (20, 2048), "2b": (40, 2048), "3b": (60, 2048), "3.5b": (70, 2048), "4b": (64, 2304),
    "5b": (44, 3072), "6b": (53, 3072), "7b": (62, 3072), "8b": (72, 3072),
    "10b": (50, 4096), "11b": (55, 4096), "12b": (60, 4096), "13b": (65, 4096),
    "15b": (18, 8192), "16b": (80, 4096), "17b": (85, 4096), "18b": (90, 4096),
    "20b": (25, 8192), "21b": (26, 8192), "22b": (27, 8192), "23b": (28, 8192), "25b": (30, 8192),
    "30b": (36, 8192), "40b": (50, 8192), "50b": (60, 8192), "60b": (75, 8192),
    "70b": (20, 16384), "80b": (100, 8192), "100b": (45, 16384), "200b": (90, 16384),
}


def _gpt(name: str, layers: int, hidden: int, heads: int = GPT_HEADS, vocab: int = GPT_VOCAB,
         max_seq: int = 2048) -> ModelShape:
    return ModelShape(name=name, layers=layers, hidden=hidden, heads=heads, vocab=vocab,
                      ffn_hidden=4 * hidden, max_seq=max_seq)


def _hf(name: str, model_type: str, layers: int, hidden: int, heads: int, kv_heads: int,
        ffn: int, vocab: int, tied: bool, max_seq: int, **extra) -> ModelShape:
    cfg = dict(model_type=model_type, num_hidden_layers=layers, hidden_size=hidden,
               num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=ffn,
               vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=max_seq, **extra)
    return ModelShape(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                      vocab=vocab, ffn_hidden=ffn, gated_mlp=True, tied_embeddings=tied,
                      learned_positions=False, max_seq=max_seq, family="hf", hf_config=cfg)


MODELS: dict[str, ModelShape] = {
    # CI models: small enough for a 2-core machine
    "gpt-tiny": _gpt("gpt-tiny", layers=4, hidden=128, heads=4, vocab=1024, max_seq=1024),   # ~0.9M
    "gpt-small": _gpt("gpt-small", layers=6, hidden=512, heads=8, vocab=4096, max_seq=2048),  # ~21M
    **{f"gpt-{k}": _gpt(f"gpt-{k}", *v) for k, v in _ARTIFACT_GPT.items()},
    # Hugging Face shapes (public configs of the checkpoints; no weights are downloaded)
    "llama-tiny": _hf("llama-tiny", "llama", 2, 128, 4, 2, 352, 1024, False, 1024),
    "llama3.1-8b": _hf("llama3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, False, 131072,
                       rope_theta=500000.0, rms_norm_eps=1e-5),
    "qwen3-14b": _hf("qwen3-14b", "qwen3", 40, 5120, 40, 8, 17408, 151936, False, 40960,
                     head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "phi-4": _hf("phi-4", "phi3", 40, 5120, 40, 10, 17920, 100352, False, 16384,
                 rope_theta=250000.0, rms_norm_eps=1e-5),
}


def get_shape(name: str) -> ModelShape:
    """The zoo's shape named ``name``; ValueError naming the choices otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}") from None


# --- shapes of live models ----------------------------------------------------------------------
def shape_from_hf(module: Any, name: str) -> ModelShape:
    """A ModelShape for a transformers causal LM, from its config (see the module docstring)."""
    cfg = module.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    names = [n for n, _ in module.named_parameters()]
    gated = any(n.endswith(("gate_proj.weight", "gate_up_proj.weight", "w3.weight")) for n in names)
    ffn = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * hidden
    out_emb, in_emb = module.get_output_embeddings(), module.get_input_embeddings()
    tied = out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight
    positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
    learned = any(("wpe" in n or "position_embeddings" in n or "embed_positions" in n) for n in names)
    return ModelShape(name=name, layers=int(cfg.num_hidden_layers), hidden=hidden, heads=heads,
                      vocab=int(cfg.vocab_size), ffn_hidden=int(ffn),
                      kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads), gated_mlp=gated,
                      tied_embeddings=tied, learned_positions=learned, max_seq=int(positions), family="hf")


def shape_of_module(module: Any, name: str = "model") -> ModelShape | None:
    """The ModelShape of a model object, when it says: a zoo model (its ``shape``), a transformers causal
    LM (its config), or a wrapper holding one as ``.model`` (the harness's CausalLM, a PEFT model);
    None for anything else."""
    for m in (module, getattr(module, "model", None), getattr(getattr(module, "model", None), "model", None)):
        if m is None:
            continue
        if isinstance(getattr(m, "shape", None), ModelShape):
            return m.shape
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "hidden_size") and hasattr(m, "get_output_embeddings"):
            return shape_from_hf(m, name)
    return None
