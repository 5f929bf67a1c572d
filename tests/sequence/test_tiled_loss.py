"""The tiled cross-entropy against its plain version, and the token-normalized loss (one process).

Contract (docs/sequence_parallel.md), fp32: the loss is bit-identical (torch.equal) -- each token's
logits row is a sum over the hidden size, which the BLAS computed identically whatever the tile's row
count in every configuration measured (1-16 threads, `python -m tests.sequence.measure_tiled_loss`).
The two gradients are sums the BLAS may order differently: the hidden-state gradient sums over the
vocabulary (MKL splits that sum by row count and thread count: equal at 2 threads here, not at 1 or
3+), the weight gradient over the tokens, which the tiles split. Both are bit-identical with one tile;
otherwise they are asserted within the rigorous bound for two summation orders of the same K products,
2*gamma_(K+1)*(|A||B|) elementwise, and within 4e-6 of the largest entry (measured worst: 1.1e-6 for
the hidden-state gradient, 7.9e-7 for the weight gradient).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from superoffload.sequence import TokenNormalizedLoss, tiled_token_losses, token_losses

U32 = 2.0 ** -24   # fp32 unit roundoff


def _problem(n: int, h: int, v: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype)
    weight = (0.02 * torch.randn(v, h, generator=g)).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    targets[::13] = -100   # some ignored targets
    return hidden, weight, targets


def _run(fn, hidden, weight, targets):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    loss = fn(h, w, targets).sum() * (1.0 / hidden.shape[0])
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _plain(h, w, t):
    return token_losses(h, w, t)


SHAPES = [(256, 128, 1024), (1000, 96, 1000)]


def _within_summation_bound(got: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """|got - ref| <= 2 gamma_(K+1) (|a| @ |b|): two summation orders of the K products of a @ b."""
    k = a.shape[1]
    gamma = (k + 1) * U32 / (1 - (k + 1) * U32)
    diff = (got - ref).abs()
    bound = 2 * gamma * (a.abs() @ b.abs())
    assert bool((diff <= bound).all()), f"max excess {(diff - bound).max().item():.3g}"
    assert diff.max().item() <= 4e-6 * ref.abs().max().item()


@pytest.mark.parametrize("n,h,v", SHAPES)
@pytest.mark.parametrize("tile", [32, 48, 100, 256, 4096])
def test_fp32_loss_bit_exact_gradients_bounded(n, h, v, tile) -> None:
    hidden, weight, targets = _problem(n, h, v, torch.float32)
    loss0, gh0, gw0 = _run(_plain, hidden, weight, targets)
    loss1, gh1, gw1 = _run(lambda a, b, t: tiled_token_losses(a, b, t, tile=tile), hidden, weight, targets)
    assert torch.equal(loss1, loss0)
    if tile >= n:   # one tile: the very products autograd forms, so bit-identical
        assert torch.equal(gh1, gh0)
        assert torch.equal(gw1, gw0)
        return
    logits = F.linear(hidden, weight).requires_grad_()
    per_tok = F.cross_entropy(logits, targets, reduction="none")
    (g,) = torch.autograd.grad(per_tok.sum() * (1.0 / n), logits)   # the plain gradient of the logits
    _within_summation_bound(gh1, gh0, g, weight)                # grad h = g @ W, a sum over the vocabulary
    _within_summation_bound(gw1, gw0, g.t(), hidden)            # grad W = g^T @ h, a sum over the tokens


@pytest.mark.parametrize("tile", [32, 100, 256])
def test_bf16_within_bf16_rounding(tile) -> None:
    """bf16: the loss was equal in every measured case, but the CPU bf16 GEMM's rows can depend on the row
    count, so it is asserted within 1e-3; the gradients stay within bf16 rounding (measured <= 2.7e-3
    of the largest entry; bf16 epsilon is 3.9e-3)."""
    hidden, weight, targets = _problem(2048, 128, 1024, torch.bfloat16)
    loss0, gh0, gw0 = _run(_plain, hidden, weight, targets)
    loss1, gh1, gw1 = _run(lambda a, b, t: tiled_token_losses(a, b, t, tile=tile), hidden, weight, targets)
    assert gh1.dtype == gw1.dtype == torch.bfloat16
    assert abs(loss1.item() - loss0.item()) <= 1e-3 * abs(loss0.item())
    for got, ref in ((gh1, gh0), (gw1, gw0)):
        assert (got.float() - ref.float()).abs().max().item() <= 2.0 ** -7 * ref.float().abs().max().item()


class _LargestOutput(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_tiled_never_materializes_the_logits() -> None:
    n, h, v, tile = 512, 64, 1024, 64
    hidden, weight, targets = _problem(n, h, v, torch.float32)
    with _LargestOutput() as plain:
        _run(_plain, hidden, weight, targets)
    with _LargestOutput() as tiled:
        _run(lambda a, b, t: tiled_token_losses(a, b, t, tile=tile), hidden, weight, targets)
    assert plain.largest >= n * v
    assert tiled.largest <= max(tile * v, v * h, n * h)   # a tile's logits, the weight (grad), the hidden


def test_token_normalized_loss_one_process() -> None:
    hidden, weight, targets = _problem(300, 32, 200, torch.float32)
    n = int((targets != -100).sum())
    plain = TokenNormalizedLoss()(hidden, weight, targets)
    assert torch.equal(plain, token_losses(hidden, weight, targets).sum() * torch.tensor(1.0 / n))
    assert torch.equal(TokenNormalizedLoss(global_tokens=n)(hidden, weight, targets), plain)
    assert torch.equal(TokenNormalizedLoss(tile=64)(hidden, weight, targets), plain)
    mean = F.cross_entropy(F.linear(hidden, weight), targets)   # ignore_index=-100 by default
    assert abs(plain.item() - mean.item()) <= 1e-6 * mean.item()
