"""Token data: synthetic by default, a real tokenized corpus through one documented hook.

Synthetic data is a fixed random first-order Markov chain over the vocabulary (seeded): each token
has `branching` successors drawn from a Zipf-like distribution, so the unigram statistics are skewed
and a model's loss falls within a few steps (then keeps falling as it learns the transitions), unlike
uniform noise where it stays at ln(vocab); every (seed, step, rank, micro-batch) draws the same tokens
on every system.

Real data hook: ``TokenFileData(path, dtype)`` reads a flat binary file of token ids (the nanoGPT /
Megatron ``.bin`` layout: uint16 for vocabularies < 65536, else uint32). Select it on the CLI with
``--data PATH`` (``--data-dtype``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from superoffload.harness.system import Batch


class SyntheticData:
    def __init__(self, vocab: int, seq: int, batch: int, grad_accum: int = 1, seed: int = 0,
                 rank: int = 0, branching: int = 8) -> None:
        self.vocab, self.seq, self.batch, self.grad_accum = vocab, seq, batch, grad_accum
        self.seed, self.rank = seed, rank
        g = torch.Generator().manual_seed(seed)
        # each token has `branching` possible successors (entropy <= ln(branching) << ln(vocab)), drawn
        # with probability ~ 1/rank so frequent tokens exist to be learned first
        zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
        perm = torch.randperm(vocab, generator=g)
        self.successors = perm[torch.multinomial(zipf, vocab * branching, replacement=True,
                                                 generator=g)].view(vocab, branching)

    def micro_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(hash((self.seed, step, self.rank, micro)) & 0x7FFF_FFFF)
        start = torch.randint(0, self.vocab, (self.batch,), generator=g)
        choice = torch.randint(0, self.successors.shape[1], (self.batch, self.seq), generator=g)
        toks = torch.empty(self.batch, self.seq + 1, dtype=torch.long)
        toks[:, 0] = start
        for t in range(self.seq):
            toks[:, t + 1] = self.successors[toks[:, t], choice[:, t]]
        return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()

    def batch_at(self, step: int) -> Batch:
        pairs = [self.micro_batch(step, m) for m in range(self.grad_accum)]
        return Batch(inputs=[p[0] for p in pairs], targets=[p[1] for p in pairs])

    def __iter__(self) -> Iterator[Batch]:
        step = 0
        while True:
            yield self.batch_at(step)
            step += 1


class TokenFileData(SyntheticData):
    """Random windows of a tokenized corpus file (deterministic per seed/step/rank/micro-batch)."""

    def __init__(self, path: str | Path, vocab: int, seq: int, batch: int, grad_accum: int = 1,
                 seed: int = 0, rank: int = 0, dtype: str = "uint16") -> None:
        self.vocab, self.seq, self.batch, self.grad_accum = vocab, seq, batch, grad_accum
        self.seed, self.rank = seed, rank
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        if len(self.tokens) <= seq + 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, need more than seq+1={seq + 1}")
        if int(self.tokens.max()) >= vocab:
            raise ValueError(f"{path}: token id {int(self.tokens.max())} >= model vocab {vocab}")

    def micro_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(hash((self.seed, step, self.rank, micro)) & 0x7FFF_FFFF)
        starts = torch.randint(0, len(self.tokens) - self.seq - 1, (self.batch,), generator=g)
        rows = [torch.from_numpy(self.tokens[s: s + self.seq + 1].astype(np.int64)) for s in starts.tolist()]
        toks = torch.stack(rows)
        return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
