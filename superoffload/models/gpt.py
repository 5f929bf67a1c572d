"""A readable GPT (nanoGPT-style, Megatron GPT-2 layout) for the artifact's model family.

Pre-LayerNorm blocks, fused qkv, GELU MLP of width 4h, learned absolute positions, tied LM head,
SDPA causal attention. ``forward(idx, targets)`` returns the mean cross-entropy loss, which is the
interface every system in the harness trains.

Hooks for sequence parallelism (``superoffload.sequence``), all off by default (then the model computes
exactly what it did without them): ``CausalSelfAttention.attention_fn`` replaces the local attention,
``forward(..., position_offset=)`` shifts the learned positions to a sequence chunk's global offset,
``GPT.loss_fn(hidden, lm_head, targets)`` replaces the mean cross-entropy (``sequence_parallel_plan()``
names them), and ``offload_checkpoints_to(offloader)`` keeps the checkpoints in host memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from superoffload.models.parallel import SequenceParallelPlan
from superoffload.shapes import ModelShape


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.kv_heads = shape.n_kv_heads
        self.head_dim = shape.head_dim
        kv = self.kv_heads * self.head_dim
        self.qkv = nn.Linear(shape.hidden, shape.hidden + 2 * kv)
        self.proj = nn.Linear(shape.hidden, shape.hidden)
        # None: causal SDPA over this module's heads; else fn(q, k, v) -> y, all [batch, seq, heads, head_dim]
        self.attention_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split([h, kv, kv], dim=-1)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.attention_fn is None:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=self.kv_heads != self.heads)
            y = y.transpose(1, 2)
        else:
            y = self.attention_fn(q, k, v)
        return self.proj(y.reshape(b, t, h))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.fc = nn.Linear(shape.hidden, shape.ffn_hidden)
        self.fc2 = nn.Linear(shape.ffn_hidden, shape.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.hidden)
        self.attn = CausalSelfAttention(shape)
        self.ln2 = nn.LayerNorm(shape.hidden)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, shape: ModelShape, *, max_seq: int | None = None, init_std: float = 0.02,
                 activation_checkpointing: bool = False) -> None:
        super().__init__()
        if activation_checkpointing not in (False, True):
            raise ValueError(f"activation_checkpointing must be False or True, got {activation_checkpointing!r} "
                             "(host-memory checkpoints: superoffload.sequence.enable_offloaded_checkpointing)")
        self.shape = shape
        self.max_seq = max_seq or shape.max_seq
        self.activation_checkpointing = activation_checkpointing
        # set by offload_checkpoints_to: checkpointed blocks' inputs live in host memory (its stats())
        self.activation_offloader = None
        # None: mean cross-entropy over the logits; else fn(hidden, lm_head module, targets) -> loss
        self.loss_fn: Callable[[torch.Tensor, nn.Module, torch.Tensor], torch.Tensor] | None = None
        self.wte = nn.Embedding(shape.vocab, shape.hidden)
        self.wpe = nn.Embedding(self.max_seq, shape.hidden) if shape.learned_positions else None
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tied_embeddings:
            self.lm_head.weight = self.wte.weight
        self._init_weights(init_std)

    def sequence_parallel_plan(self) -> SequenceParallelPlan:
        """The hook route: every block's attention slot, the ``position_offset`` keyword, our ``loss_fn``."""
        return SequenceParallelPlan(loss_owner=self, attention=tuple(blk.attn for blk in self.blocks),
                                    heads=self.shape.heads, kv_heads=self.shape.n_kv_heads,
                                    position_kwarg="position_offset")

    def offload_checkpoints_to(self, offloader) -> None:
        """Checkpoint every block through ``offloader.checkpoint(block, x)`` (an ``ActivationOffloader`` of
        superoffload.sequence: the blocks' inputs are held in host memory)."""
        self.activation_checkpointing = True
        self.activation_offloader = offloader

    def _init_weights(self, std: float) -> None:
        if next(self.parameters()).is_meta:
            return
        # GPT-2 init; residual projections scaled by 1/sqrt(2L) as in Megatron/nanoGPT
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" in name:
                nn.init.ones_(p)
            elif name.endswith(("proj.weight", "fc2.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.shape.layers))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                position_offset: int = 0) -> torch.Tensor:
        """``position_offset``: global position of ``idx[:, 0]`` (a sequence-parallel rank's chunk start)."""
        t = idx.shape[1]
        if position_offset + t > self.max_seq:
            raise ValueError(f"sequence length {position_offset + t} exceeds the model's max_seq {self.max_seq}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(position_offset, position_offset + t, device=idx.device))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                if self.activation_offloader is not None:
                    x = self.activation_offloader.checkpoint(block, x)
                else:
                    x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if targets is not None and self.loss_fn is not None:
            return self.loss_fn(self.ln_f(x), self.lm_head, targets)  # the module: see sequence.head_weight
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
