"""Data pipeline and byte tokenizer: prompt masking, packing, padding, .bin rows, batches by step; a zoo
GPT trained on a .bin file and continued from its saved final/ directory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from superoffload.finetune import FinetuneConfig, FinetuneInputError, run_finetune
from superoffload.finetune.data import (
    ALPACA_PROMPT,
    IGNORE,
    TrainData,
    load_rows,
    pack,
    pad_each,
    tokenize_examples,
)
from superoffload.finetune.tokenizer import ByteTokenizer, load_tokenizer


def test_byte_tokenizer_round_trips_and_saves(tmp_path):
    tok = ByteTokenizer()
    text = "héllo, wörld ✓\n"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (256, 257, 258, 259)
    tok.save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_prompt_is_masked_response_and_eos_are_learned():
    tok = ByteTokenizer()
    rec = {"instruction": "Say hi", "input": "", "output": "hi"}
    [(ids, labels)] = tokenize_examples([rec], tok, "x")
    prompt = ALPACA_PROMPT.format(instruction="Say hi")
    assert ids == [257, *prompt.encode(), *b"hi", 258]
    assert labels == [IGNORE] * (1 + len(prompt)) + [*b"hi", 258]
    [(_, text_labels)] = tokenize_examples([{"text": "ab"}], tok, "x")
    assert text_labels == [IGNORE, ord("a"), ord("b"), 258]  # text: all learned but bos


def test_packing_and_padding():
    ex = [([1, 2, 3], [IGNORE, 2, 3]), ([4, 5], [IGNORE, 5]), ([6, 7, 8, 9, 10, 11], [IGNORE, 7, 8, 9, 10, 11])]
    ids, labels, padding = pack(ex, 4, pad_id=0, seed=0)
    assert ids.shape == (3, 4) and padding == 1
    assert sorted(ids.flatten().tolist()) == sorted([0, *range(1, 12)])  # every token once, one pad
    assert labels.flatten().tolist()[-1] == IGNORE
    ids, labels, padding, truncated = pad_each(ex, 4, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]]
    assert labels[1].tolist() == [IGNORE, 5, IGNORE, IGNORE] and (padding, truncated) == (3, 1)


def test_batches_are_a_function_of_the_step(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"example {i} " * 3}) + "\n" for i in range(20)))
    rows = load_rows(data, ByteTokenizer(), max_length=16, pad=True, seed=1, vocab=300)
    a = TrainData(rows, batch=3, grad_accum=2, seed=1)
    b = TrainData(rows, batch=3, grad_accum=2, seed=1)
    assert all(torch.equal(a.micro_batch(s, k)[0], b.micro_batch(s, k)[0]) for s in (0, 7, 3) for k in (0, 1))
    seen = [i for s in range(3) for k in range(2) for i in a.indices(s, k)]
    assert sorted(seen[:18]) == sorted(set(seen[:18]))  # an epoch (18 of 20 rows) has no repeats
    r0, r1 = TrainData(rows, 3, 2, 1, rank=0, world=2), TrainData(rows, 3, 2, 1, rank=1, world=2)
    assert not set(r0.indices(0, 0)) & set(r1.indices(0, 0))  # ranks read different rows


def test_bad_records_and_token_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": "x", "completion": "y"}]))
    with pytest.raises(FinetuneInputError, match=r"record 0 has fields \['completion', 'prompt'\]"):
        load_rows(bad, ByteTokenizer(), max_length=8, pad=False, seed=0, vocab=300)
    tokens = tmp_path / "t.bin"
    np.array([1, 2, 3, 999], dtype=np.uint16).tofile(tokens)
    with pytest.raises(FinetuneInputError, match="token id 999 is outside the model's vocabulary of 300"):
        load_rows(tokens, ByteTokenizer(), max_length=2, pad=False, seed=0, vocab=300)
    rows = load_rows(tokens, ByteTokenizer(), max_length=2, pad=False, seed=0, vocab=1000)
    assert rows.ids.tolist() == [[1, 2], [3, 999]] and torch.equal(rows.ids, rows.labels)


def test_zoo_gpt_on_a_token_file_then_from_its_final_dir(tmp_path):
    tokens = tmp_path / "corpus.bin"
    np.array(list(b"the quick brown fox jumps over the lazy dog. " * 60), dtype=np.uint16).tofile(tokens)
    common = dict(data=str(tokens), max_length=32, batch=2, lr=2e-3, progress=False, print_plan=False,
                  dtype="fp32", warmup_steps=1)
    rec = run_finetune(FinetuneConfig(model="gpt-tiny", steps=6, out=str(tmp_path / "a"), **common))
    assert rec["status"] == "ok" and rec["losses"][-1] < rec["losses"][0]
    ft = rec["system_stats"]["finetune"]
    assert ft["data"]["format"] == "tokens (uint16)" and ft["model_kind"] == "gpt"
    final = tmp_path / "a" / "final"
    assert (final / "byte_tokenizer.json").is_file() and (final / "model.safetensors").is_file()
    again = run_finetune(FinetuneConfig(model=str(final), steps=2, out=str(tmp_path / "b"), **common))
    assert again["status"] == "ok"
    assert again["losses"][0] < rec["losses"][0]  # it starts from the trained weights
