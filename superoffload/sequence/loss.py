"""Token-normalized LM loss for sequence parallelism, plain and tiled over tokens.

Normalization. Under sequence (and data) parallelism every rank holds some of the tokens of one
global batch and, after backward, the ranks' gradients are *summed* (no averaging). So each rank's
loss is

    loss_rank = (sum of this rank's token losses) * (1 / N_global)

where ``N_global`` counts the non-ignored targets of all ranks whose gradients are summed. Then
``sum_rank grad(loss_rank) = grad(sum_all_tokens / N_global)`` = the gradient of the global mean loss,
whatever the SP degree or the split of tokens. ``sum_rank loss_rank`` is the global mean loss itself
(``global_loss``, for logging).

Tiled loss. ``tiled_token_losses`` computes the per-token cross-entropy from the final hidden states
and the LM-head weight without ever holding the [tokens, vocab] logits: the forward computes logits and
losses one tile of tokens at a time and keeps only the per-token losses; the backward recomputes each
tile's logits and returns the hidden-state and weight gradients. Exactness against the plain version
(``token_losses``, the whole logits at once), measured and tested (docs/sequence_parallel.md): the loss
is bit-identical; the gradients are sums whose order the BLAS picks by shape and thread count (the
hidden-state gradient over the vocabulary, the weight gradient over the tokens, which the tiles
split), so they are bit-identical with one tile and otherwise within the floating-point bound for two
summation orders (measured worst in fp32: 1.1e-6 of the largest entry).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from superoffload.sequence.ulysses import Group, group_size

IGNORE_INDEX = -100


def token_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                 ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Plain per-token cross-entropy: logits = hidden @ weight.T in the model dtype, softmax in fp32.

    ``hidden`` [..., H], ``weight`` [V, H], ``targets`` [...]; returns fp32 losses of shape [N] (N = all
    leading dims), 0 for ignored targets. Materializes the [N, V] logits.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    logits = F.linear(h, weight)
    return F.cross_entropy(logits.float(), targets.reshape(-1), reduction="none", ignore_index=ignore_index)


def _tiles(n: int, tile: int) -> list[tuple[int, int]]:
    """Split n rows into ceil(n / tile) near-equal tiles (no tiny remainder tile: small GEMMs may take a
    different BLAS path)."""
    if tile <= 0:
        raise ValueError(f"tile size must be positive, got {tile}")
    count = max(1, -(-n // tile))
    base, extra = divmod(n, count)
    out, start = [], 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


class TiledTokenLosses(torch.autograd.Function):
    """Per-token cross-entropy computed tile by tile; the backward recomputes each tile's logits."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tile: int,
                ignore_index: int) -> torch.Tensor:
        n = hidden.shape[0]
        losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for a, b in _tiles(n, tile):
            logits = F.linear(hidden[a:b], weight)
            losses[a:b] = F.cross_entropy(logits.float(), targets[a:b], reduction="none",
                                          ignore_index=ignore_index)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.tile, ctx.ignore_index = tile, ignore_index
        return losses

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        hidden, weight, targets = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        # The weight gradient sums over all tokens, which the tiles split. It is accumulated as autograd's
        # linear backward forms it (grad_W^T = h^T @ g, an [H, V] product), in fp32: products of bf16/fp16
        # values are exact in fp32, and the sum is rounded to the weight's dtype once at the end.
        grad_wt = torch.zeros(weight.shape[::-1], dtype=torch.float32, device=weight.device) if need_w else None
        w = weight.detach()
        for a, b in _tiles(hidden.shape[0], ctx.tile):
            h = hidden[a:b].detach()
            with torch.enable_grad():
                logits = F.linear(h, w).detach().requires_grad_()
                loss = F.cross_entropy(logits.float(), targets[a:b], reduction="none",
                                       ignore_index=ctx.ignore_index)
                (g,) = torch.autograd.grad(loss, logits, grad_losses[a:b])
            if need_h:  # the product autograd's linear backward forms: grad_in = g @ W
                torch.mm(g, w, out=grad_h[a:b])
            if need_w:
                if g.dtype == torch.float32:
                    grad_wt.addmm_(h.t(), g)
                else:
                    grad_wt.addmm_(h.t().float(), g.float())
        grad_w = grad_wt.t().to(weight.dtype) if need_w else None
        return grad_h, grad_w, None, None, None


def tiled_token_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, tile: int = 1024,
                       ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Like ``token_losses`` but holding at most ``tile`` tokens' logits at a time (forward and backward)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    return TiledTokenLosses.apply(h, weight, targets.reshape(-1), int(tile), ignore_index)


def head_weight(head: nn.Module | torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The LM-head weight for a loss that multiplies by it itself.

    Given the head module, it is first called on zero tokens so that its forward pre-hooks run as for a
    real call: an engine that returns weights asynchronously (SuperOffload uploads each bucket after the
    step and makes a module's forward wait for its own) waits there for this weight. Reading ``.weight``
    without a call could see it half uploaded; a tensor is taken as given (the caller vouches for it).
    """
    if isinstance(head, nn.Module):
        head(hidden.narrow(-2, 0, 0))
        return head.weight
    return head


def count_tokens(targets: torch.Tensor, group: Group = None, *, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Number of non-ignored targets summed over ``group`` (an int64 tensor on ``targets``'s device)."""
    n = (targets != ignore_index).sum().to(torch.int64).reshape(1)
    if group_size(group) > 1:
        dist.all_reduce(n, op=dist.ReduceOp.SUM, group=group)
    return n[0]


class TokenNormalizedLoss:
    """Per-rank LM loss = (sum of this rank's token losses) * (1 / global token count).

    ``fn(hidden, head, targets) -> loss``, the loss hook of the zoo models; ``head`` is the LM-head
    module (preferred: see ``head_weight``) or its weight. Summing the
    resulting gradients over the ranks of ``group`` (no averaging) gives the gradient of the mean loss
    over all of their tokens.

    - ``group``: the ranks whose gradients will be summed (the SP group, or SP x DP when data-parallel
      ranks sum too); ``None`` with torch.distributed uninitialized means one process.
    - ``global_tokens``: the global count when the trainer knows it; otherwise every call counts the
      non-ignored targets with one all-reduce over ``group``.
    - ``tile``: None for the plain loss (whole logits), or the tokens per tile of ``tiled_token_losses``.
    """

    def __init__(self, group: Group = None, *, tile: int | None = None, global_tokens: int | None = None,
                 ignore_index: int = IGNORE_INDEX) -> None:
        self.group, self.tile, self.global_tokens, self.ignore_index = group, tile, global_tokens, ignore_index

    def token_losses(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.tile is None:
            return token_losses(hidden, weight, targets, ignore_index=self.ignore_index)
        return tiled_token_losses(hidden, weight, targets, tile=self.tile, ignore_index=self.ignore_index)

    def scale(self, targets: torch.Tensor) -> torch.Tensor:
        """1 / global token count, as an fp32 tensor (computed in fp64, rounded once)."""
        if self.global_tokens is not None:
            n = torch.tensor(self.global_tokens, dtype=torch.float64, device=targets.device)
        else:
            n = count_tokens(targets, self.group, ignore_index=self.ignore_index).to(torch.float64)
        return n.reciprocal().to(torch.float32)

    def __call__(self, hidden: torch.Tensor, head: nn.Module | torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.token_losses(hidden, head_weight(head, hidden), targets).sum() * self.scale(targets)


def global_loss(loss: torch.Tensor, group: Group = None) -> torch.Tensor:
    """The global mean loss from per-rank ``TokenNormalizedLoss`` values: their sum over ``group`` (for logging)."""
    out = loss.detach().clone()
    if group_size(group) > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out
