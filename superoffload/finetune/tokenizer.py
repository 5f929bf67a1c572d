"""Tokenizers: the model directory's own (Hugging Face) tokenizer, or a byte-level fallback.

The fallback serves zoo models and model directories without tokenizer files. Its vocabulary is the
256 byte values of UTF-8 text (id = byte value) followed by three special tokens:

| id  | token       | use                                            |
|-----|-------------|------------------------------------------------|
| 256 | ``<|pad|>`` | right padding (``--pad``); never a label        |
| 257 | ``<|bos|>`` | starts every example                           |
| 258 | ``<|eos|>`` | ends every example (the model learns to stop)  |

So it needs a model vocabulary of at least 259; every text round-trips exactly, and no file is needed
to build it. It is saved as ``byte_tokenizer.json`` beside the weights, which ``load_tokenizer`` reads back.
Both kinds are used through ``TextTokenizer``: ``encode(text) -> list[int]`` without special tokens, and
the ``bos_id`` / ``eos_id`` / ``pad_id`` the data pipeline adds itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

BYTE_TOKENIZER_FILE = "byte_tokenizer.json"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class TextTokenizer(Protocol):
    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: str | Path) -> None: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, then ``<|pad|>`` 256, ``<|bos|>`` 257, ``<|eos|>`` 258."""

    name = "byte-level (256 bytes + pad, bos, eos)"
    SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")
    pad_id, bos_id, eos_id = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, directory: str | Path) -> None:
        spec = {"type": "superoffload-byte-tokenizer", "version": 1, "bytes": 256,
                "special_tokens": {t: 256 + i for i, t in enumerate(self.SPECIALS)}}
        Path(directory, BYTE_TOKENIZER_FILE).write_text(json.dumps(spec, indent=2) + "\n")


class HFTokenizer:
    """A `transformers` tokenizer behind the same small interface."""

    def __init__(self, tok: Any, source: str) -> None:
        self.tok = tok
        self.name = f"{type(tok).__name__} from {source}"
        self.vocab_size = len(tok)
        self.bos_id = tok.bos_token_id
        self.eos_id = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_id = 0 if pad is None else int(pad)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def save(self, directory: str | Path) -> None:
        self.tok.save_pretrained(str(directory))


def has_hf_tokenizer(directory: str | Path) -> bool:
    return any(Path(directory, f).is_file() for f in HF_TOKENIZER_FILES)


def load_tokenizer(directory: str | Path | None) -> TextTokenizer:
    """The tokenizer saved in ``directory`` (Hugging Face files, or our byte tokenizer's JSON), else the
    byte-level fallback. Nothing is downloaded (``local_files_only``)."""
    if directory is not None:
        d = Path(directory)
        if has_hf_tokenizer(d):
            from transformers import AutoTokenizer

            return HFTokenizer(AutoTokenizer.from_pretrained(str(d), local_files_only=True), str(d))
        if (d / BYTE_TOKENIZER_FILE).is_file():
            spec = json.loads((d / BYTE_TOKENIZER_FILE).read_text())
            if spec.get("type") != "superoffload-byte-tokenizer":
                raise ValueError(f"{d / BYTE_TOKENIZER_FILE} is not a superoffload byte tokenizer")
    return ByteTokenizer()
