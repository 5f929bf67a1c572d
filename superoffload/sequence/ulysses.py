"""Ulysses sequence parallelism: all-to-all between sequence-sharded and head-sharded q/k/v.

DeepSpeed-Ulysses (Jacobs et al., arXiv 2309.14509, §3): each of the SP ranks of a group holds a
contiguous chunk of the sequence. Before attention one all-to-all per tensor turns the chunk of all
heads into the whole sequence of ``heads / SP`` heads; an unchanged local attention runs on the whole
(causal) sequence for those heads; one all-to-all turns its output back into the sequence chunk of all
heads. The all-to-all is a permutation of blocks across ranks, so its adjoint (the backward) is the
inverse all-to-all.

Layout used throughout this module: ``[batch, seq, heads, head_dim]`` (the layout a fused qkv
projection produces before the usual ``transpose(1, 2)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from superoffload.shapes import ulysses_kv_repeat

Group = dist.ProcessGroup | None


def group_size(group: Group) -> int:
    """SP degree of ``group`` (the default group when None); 1 when torch.distributed is not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def group_rank(group: Group) -> int:
    """This process's rank within ``group``; 0 when torch.distributed is not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


# How many times each KV head is repeated before the all-to-all, or ValueError when Ulysses cannot split the
# heads: the rule lives torch-free in superoffload.shapes, where the planner prices the same one.
kv_repeat_factor = ulysses_kv_repeat


def _all_to_all_blocks(x: torch.Tensor, group: Group) -> torch.Tensor:
    """All-to-all of ``x`` = [SP, ...]: block j goes to rank j; block i of the result came from rank i.

    Split sizes are passed explicitly (one dim-0 block per rank) and the shape is checked first: gloo's
    ``all_to_all_single`` does not raise when the sizes do not divide, it returns uninitialized memory.
    Every rank must call this with the same shape (equal sequence chunks, see ``shard_sequence``).
    """
    sp = group_size(group)
    if x.dim() < 1 or x.shape[0] != sp:
        raise ValueError(f"all-to-all input must have one dim-0 block per rank: shape {tuple(x.shape)}, SP={sp}")
    x = x.contiguous()
    out = torch.empty_like(x)
    splits = [1] * sp
    dist.all_to_all_single(out, x, output_split_sizes=splits, input_split_sizes=splits, group=group)
    return out


def seq_to_heads(x: torch.Tensor, group: Group) -> torch.Tensor:
    """[b, s, H, d] (this rank's sequence chunk, all heads) -> [b, SP*s, H/SP, d] (whole sequence, its heads)."""
    sp = group_size(group)
    b, s, h, d = x.shape
    if h % sp:
        raise ValueError(f"heads={h} not divisible by SP={sp}")
    if sp == 1:
        return x
    send = x.reshape(b, s, sp, h // sp, d).permute(2, 0, 1, 3, 4)       # [dest rank = head group, b, s, h/SP, d]
    recv = _all_to_all_blocks(send, group)                                 # [src rank = seq chunk, b, s, h/SP, d]
    return recv.permute(1, 0, 2, 3, 4).reshape(b, sp * s, h // sp, d)


def heads_to_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    """[b, S, h, d] (whole sequence, this rank's heads) -> [b, S/SP, SP*h, d] (its sequence chunk, all heads)."""
    sp = group_size(group)
    b, seq, h, d = x.shape
    if seq % sp:
        raise ValueError(f"sequence length {seq} not divisible by SP={sp}")
    if sp == 1:
        return x
    s = seq // sp
    send = x.reshape(b, sp, s, h, d).permute(1, 0, 2, 3, 4)               # [dest rank = seq chunk, b, s, h, d]
    recv = _all_to_all_blocks(send, group)                                 # [src rank = head group, b, s, h, d]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s, sp * h, d)


class _Exchange(torch.autograd.Function):
    """Autograd all-to-all in one direction; its backward is the all-to-all in the other."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, to_heads: bool) -> torch.Tensor:
        ctx.group, ctx.to_heads = group, to_heads
        return (seq_to_heads if to_heads else heads_to_seq)(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (heads_to_seq if ctx.to_heads else seq_to_heads)(grad, ctx.group), None, None


class SeqToHeads:
    """Sequence-sharded -> head-sharded, differentiable (backward: head-sharded -> sequence-sharded)."""

    @staticmethod
    def apply(x: torch.Tensor, group: Group) -> torch.Tensor:
        return _Exchange.apply(x, group, True)


class HeadsToSeq:
    """Head-sharded -> sequence-sharded, differentiable (backward: sequence-sharded -> head-sharded)."""

    @staticmethod
    def apply(x: torch.Tensor, group: Group) -> torch.Tensor:
        return _Exchange.apply(x, group, False)


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                dropout_p: float = 0.0) -> torch.Tensor:
    """The local attention: SDPA, causal, on [b, heads, seq, d] (grouped-query when the head counts differ)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=dropout_p,
                                          enable_gqa=k.shape[1] != q.shape[1])


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group = None, *,
                      attention: Callable[..., torch.Tensor] | None = None, **attention_kwargs) -> torch.Tensor:
    """Causal attention over the global sequence from this rank's sequence chunk.

    ``q`` is [b, s, H, d] and ``k``/``v`` [b, s, KV, d]: this rank's contiguous chunk ``s = S / SP`` of a
    global sequence ``S`` (rank r holds positions [r*s, (r+1)*s)). Returns [b, s, H, d], this rank's
    chunk of the attention output, equal to the same rows of single-process attention over the whole
    sequence. ``attention(q, k, v, **attention_kwargs)`` is the local attention on [b, heads, S, d]
    (default: ``causal_sdpa``). With SP=1 no communication happens.
    """
    sp = group_size(group)
    heads, kv_heads = q.shape[2], k.shape[2]
    rep = kv_repeat_factor(heads, kv_heads, sp)
    attention = attention or causal_sdpa
    if sp == 1:
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **attention_kwargs)
        return out.transpose(1, 2)
    if rep > 1:  # each rank gets one copy of the KV head its query heads use
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **attention_kwargs)
    return HeadsToSeq.apply(out.transpose(1, 2), group)


class UlyssesAttention:
    """A pluggable attention for ``superoffload.models.gpt``: ``fn(q, k, v) -> y``, all [b, s, heads, d].

    Construct it once per model (``heads``/``kv_heads`` are checked against the group size then).
    """

    def __init__(self, group: Group, heads: int, kv_heads: int) -> None:
        self.group = group
        self.sp = group_size(group)
        self.kv_repeat = kv_repeat_factor(heads, kv_heads, self.sp)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ulysses_attention(q, k, v, self.group)


def shard_sequence(x: torch.Tensor, group: Group = None, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous chunk of ``x`` along ``dim`` (rank r gets [r*s, (r+1)*s), s = len / SP).

    Raises ValueError when the length is not divisible by SP: every rank must hold an equal chunk.
    """
    sp, rank = group_size(group), group_rank(group)
    n = x.shape[dim]
    if n % sp:
        raise ValueError(f"sequence length {n} is not divisible by the SP degree {sp}")
    s = n // sp
    return x.narrow(dim, rank * s, s).contiguous()
