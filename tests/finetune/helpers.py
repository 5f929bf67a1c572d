"""A tiny Llama with a locally trained tokenizer, and a 50-example Alpaca-style JSONL file: built in
seconds, nothing downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

WORDS = ["red", "green", "blue", "cat", "dog", "bird", "runs", "sleeps", "eats", "fast", "slow", "small"]


def make_dataset(path: Path, n: int = 50, seed: int = 0) -> Path:
    """Alpaca records (every third without an input, every fifth plain text): learnable patterns."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            a, b = rng.sample(WORDS[:8], 2)
            if i % 5 == 4:
                rec = {"text": f"the {a} {b} runs and the {b} {a} sleeps"}
            elif i % 3 == 2:
                rec = {"instruction": f"Repeat twice: {a} {b}", "output": f"{a} {b} {a} {b}"}
            else:
                rec = {"instruction": "Reverse the words.", "input": f"{a} {b}", "output": f"{b} {a}"}
            f.write(json.dumps(rec) + "\n")
    return path


def _texts(data: Path) -> list[str]:
    out = []
    for line in data.read_text().splitlines():
        rec = json.loads(line)
        out += [str(v) for v in rec.values()]
    return out


def make_tiny_llama(directory: Path, data: Path, *, layers: int = 2, hidden: int = 64, positions: int = 256,
                    seed: int = 0) -> Path:
    """LlamaConfig(hidden 64, 2 layers) with random weights and a byte-level BPE tokenizer trained on the
    dataset's text (plus the Alpaca template words), saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from superoffload.finetune.data import ALPACA_PROMPT_WITH_INPUT

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_texts(data) + [ALPACA_PROMPT_WITH_INPUT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=positions, tie_word_embeddings=False,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    fast.save_pretrained(str(directory))
    return directory
