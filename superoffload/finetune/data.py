"""Training data for `superoffload finetune`: read, tokenize, pack or pad, and serve batches by step.

Inputs (chosen by the file's suffix):

- ``.json`` (a list of objects) or ``.jsonl`` (one object per line). Each record is either an
  instruction example with the Alpaca fields ``instruction``, ``output`` and an optional ``input``
  (rendered with the Stanford Alpaca prompt template), or a plain ``{"text": ...}``. An instruction
  example's prompt is masked out of the loss (label -100); its response and the end-of-sequence token
  are learned. A ``text`` record is learned whole.
- ``.bin``: a flat array of token ids (uint16 or uint32, the nanoGPT / Megatron layout that
  ``superoffload.harness.data.TokenFileData`` reads), cut into consecutive rows; every token is a label.

Rows are ``max_length`` tokens. Packing (the default) concatenates the examples, each as
``[bos] prompt response [eos]``, in a seeded shuffled order and cuts the stream into full rows, so no
position is wasted on padding; examples may straddle rows and attend to their predecessor in the row
(the usual trade of packed fine-tuning). ``pad=True`` puts one example per row instead, truncated to
``max_length`` and right-padded with pad tokens that are never labels.

Batches are a pure function of the step: optimizer step ``s``, micro-batch ``k``, rank ``r`` reads
rows ``((s * grad_accum + k) * world + r) * batch + j`` of an epoch-wise seeded permutation of the rows.
A resumed run therefore needs nothing but the step number to continue with the same data.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from superoffload.finetune.errors import FinetuneInputError
from superoffload.finetune.tokenizer import TextTokenizer

IGNORE = -100  # label of a position that is not learned (torch cross_entropy's default ignore_index)
TEXT_SUFFIXES = (".json", ".jsonl")
TOKEN_SUFFIXES = (".bin",)

# The Stanford Alpaca prompt template (https://github.com/tatsu-lab/stanford_alpaca, README "Data Release"
# and train.py), the format of the Alpaca data set the SuperOffload fine-tuning examples train on.
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def check_data_path(path: str | Path) -> Path:
    """The data file, or FinetuneInputError if it is missing or of an unknown kind."""
    p = Path(path)
    if not p.is_file():
        raise FinetuneInputError(f"data file {str(path)!r} does not exist (nothing is downloaded: give a local "
                                 f".json, .jsonl or .bin file)")
    if p.suffix not in TEXT_SUFFIXES + TOKEN_SUFFIXES:
        raise FinetuneInputError(f"data file {p.name!r}: unknown kind {p.suffix!r}; use .json / .jsonl "
                                 f"(Alpaca 'instruction'/'input'/'output' or 'text' records) or .bin (token ids)")
    return p


# ------------------------------------------------------------------------------------------ reading
def read_records(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON list or a JSONL file."""
    text = path.read_text(encoding="utf-8")
    records: Any
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise FinetuneInputError(f"{path.name}: not valid JSON ({e.msg} at line {e.lineno}); a .json data "
                                     f"file holds one list of records, a .jsonl file one per line") from None
        if isinstance(records, dict) and isinstance(records.get("data"), list):
            records = records["data"]
        if not isinstance(records, list):
            raise FinetuneInputError(f"{path.name}: the top level is a {type(records).__name__}; expected a "
                                     f"list of records")
    else:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise FinetuneInputError(f"{path.name}: line {lineno} is not valid JSON ({e.msg})") from None
    if not records:
        raise FinetuneInputError(f"{path.name}: no records")
    return records


def prompt_and_response(rec: Any, index: int, name: str) -> tuple[str, str]:
    """(prompt, response) of one record: Alpaca fields or plain text. The prompt is not learned."""
    if isinstance(rec, dict):
        if isinstance(rec.get("instruction"), str) and isinstance(rec.get("output"), str):
            inp = rec.get("input") or ""
            if not isinstance(inp, str):
                raise FinetuneInputError(f"{name}: record {index}: 'input' must be a string, got "
                                         f"{type(inp).__name__}")
            template = ALPACA_PROMPT_WITH_INPUT if inp.strip() else ALPACA_PROMPT
            return template.format(instruction=rec["instruction"], input=inp), rec["output"]
        if isinstance(rec.get("text"), str):
            return "", rec["text"]
    keys = sorted(rec) if isinstance(rec, dict) else f"a {type(rec).__name__}"
    raise FinetuneInputError(f"{name}: record {index} has fields {keys}; expected 'instruction' and 'output' "
                             f"strings (Alpaca, 'input' optional) or a 'text' string")


# ------------------------------------------------------------------------------------------ rows
@dataclass
class Rows:
    """Training rows: ``ids`` and ``labels``, both [rows, max_length] int64 (labels -100 where not learned)."""

    ids: torch.Tensor
    labels: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def tokenize_examples(records: list[Any], tok: TextTokenizer, name: str) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per example: ``[bos] prompt response [eos]`` with the prompt and bos masked."""
    out = []
    for i, rec in enumerate(records):
        prompt, response = prompt_and_response(rec, i, name)
        p = tok.encode(prompt) if prompt else []
        r = tok.encode(response)
        head = ([tok.bos_id] if tok.bos_id is not None else []) + p
        tail = r + ([tok.eos_id] if tok.eos_id is not None else [])
        out.append((head + tail, [IGNORE] * len(head) + tail))
    return out


def pack(examples: list[tuple[list[int], list[int]]], max_length: int, pad_id: int,
         seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Concatenate the examples in a seeded shuffled order and cut the stream into full rows (the last
    one right-padded). Returns ids, labels and the number of padded positions."""
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    ids = [t for i in order for t in examples[i][0]]
    labels = [t for i in order for t in examples[i][1]]
    rows = max(1, math.ceil(len(ids) / max_length))
    padding = rows * max_length - len(ids)
    ids += [pad_id] * padding
    labels += [IGNORE] * padding
    return (torch.tensor(ids, dtype=torch.long).view(rows, max_length),
            torch.tensor(labels, dtype=torch.long).view(rows, max_length), padding)


def pad_each(examples: list[tuple[list[int], list[int]]], max_length: int,
             pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """One example per row, truncated to max_length and right-padded. Returns ids, labels, the padded
    positions and the number of truncated examples."""
    ids = torch.full((len(examples), max_length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), max_length), IGNORE, dtype=torch.long)
    truncated = 0
    for i, (x, y) in enumerate(examples):
        truncated += len(x) > max_length
        n = min(len(x), max_length)
        ids[i, :n] = torch.tensor(x[:n], dtype=torch.long)
        labels[i, :n] = torch.tensor(y[:n], dtype=torch.long)
    padding = len(examples) * max_length - sum(min(len(x), max_length) for x, _ in examples)
    return ids, labels, padding, truncated


def load_text_rows(path: Path, tok: TextTokenizer, max_length: int, pad: bool, seed: int) -> Rows:
    records = read_records(path)
    examples = tokenize_examples(records, tok, path.name)
    if pad:
        ids, labels, padding, truncated = pad_each(examples, max_length, tok.pad_id)
    else:
        ids, labels, padding = pack(examples, max_length, tok.pad_id, seed)
        truncated = 0
    n_tokens = sum(len(x) for x, _ in examples)
    learned = int((labels != IGNORE).sum())
    if learned == 0:
        raise FinetuneInputError(f"{path.name}: no token is learned (every response is empty or cut off by "
                                 f"--max-length {max_length})")
    kinds = {"alpaca" if isinstance(r, dict) and "instruction" in r else "text" for r in records}
    return Rows(ids, labels, {"format": "+".join(sorted(kinds)), "examples": len(records), "tokens": n_tokens,
                              "rows": int(ids.shape[0]), "learned_tokens": learned, "padding": padding,
                              "truncated_examples": truncated, "layout": "pad" if pad else "pack"})


def load_token_rows(path: Path, dtype: str, max_length: int, vocab: int) -> Rows:
    """Consecutive rows of max_length ids of a flat token file; every position is learned."""
    if dtype not in ("uint16", "uint32"):
        raise FinetuneInputError(f"--data-dtype must be uint16 or uint32, got {dtype!r}")
    size = path.stat().st_size
    width = np.dtype(dtype).itemsize
    if size % width:
        raise FinetuneInputError(f"{path.name}: {size} bytes is not a whole number of {dtype} token ids")
    tokens = np.fromfile(path, dtype=np.dtype(dtype))
    rows = len(tokens) // max_length
    if rows < 1:
        raise FinetuneInputError(f"{path.name}: {len(tokens)} tokens, fewer than one row of --max-length "
                                 f"{max_length}")
    top = int(tokens.max())
    if top >= vocab:
        raise FinetuneInputError(f"{path.name}: token id {top} is outside the model's vocabulary of {vocab} "
                                 f"(wrong --data-dtype, or data tokenized for another model?)")
    ids = torch.from_numpy(tokens[: rows * max_length].astype(np.int64)).view(rows, max_length)
    return Rows(ids, ids.clone(), {"format": f"tokens ({dtype})", "examples": None, "tokens": int(len(tokens)),
                                   "rows": rows, "learned_tokens": rows * max_length, "padding": 0,
                                   "truncated_examples": 0, "layout": "consecutive"})


def load_rows(path: str | Path, tok: TextTokenizer, *, max_length: int, pad: bool, seed: int, vocab: int,
              data_dtype: str = "uint16") -> Rows:
    """Rows of the data file (see the module docstring); FinetuneInputError on bad input."""
    p = check_data_path(path)
    if p.suffix in TOKEN_SUFFIXES:
        rows = load_token_rows(p, data_dtype, max_length, vocab)
    else:
        rows = load_text_rows(p, tok, max_length, pad, seed)
        top = int(rows.ids.max())
        if top >= vocab:
            raise FinetuneInputError(f"the tokenizer produced id {top}, outside the model's vocabulary of {vocab}")
    rows.info.update(path=str(p), sha256=file_sha256(p), max_length=max_length)
    return rows


# ------------------------------------------------------------------------------------------ batches
class TrainData:
    """Micro-batches of rows, a pure function of (step, micro-batch, rank): see the module docstring."""

    def __init__(self, rows: Rows, batch: int, grad_accum: int, seed: int, rank: int = 0, world: int = 1) -> None:
        self.rows, self.batch, self.grad_accum = rows, batch, grad_accum
        self.seed, self.rank, self.world = seed, rank, world
        self._perm: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perm:
            if len(self._perm) > 4:
                self._perm.clear()
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm[epoch] = torch.randperm(len(self.rows), generator=g)
        return self._perm[epoch]

    def indices(self, step: int, micro: int) -> list[int]:
        n = len(self.rows)
        first = ((step * self.grad_accum + micro) * self.world + self.rank) * self.batch
        return [int(self._order(g // n)[g % n]) for g in range(first, first + self.batch)]

    def micro_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(self.indices(step, micro))
        return self.rows.ids[idx], self.rows.labels[idx]

    def step_batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self.micro_batch(step, k) for k in range(self.grad_accum)]
