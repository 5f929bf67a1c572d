"""The model zoo: names -> ModelShape.

GPT family: the authors' artifact (`experiment/model.json`; source in docs/paper_numbers.md): 32 heads,
FFN 4h, GPT-2 BPE vocabulary padded to a multiple of 256 (50,432), learned positions, tied head.
Labels are the artifact's, even where they differ from the real count (gpt-70b is 65B).

Hugging Face family: the public shapes of real checkpoints, built from their `transformers` config
class without downloading anything.
"""

from __future__ import annotations

from superoffload.shapes import ModelShape

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
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}") from None
