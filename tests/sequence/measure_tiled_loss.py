"""Measure the tiled cross-entropy against its plain version (the numbers in docs/sequence_parallel.md).

    .venv/bin/python -m tests.sequence.measure_tiled_loss [--threads 1,2,4] [--verbose]

For fp32 and bf16, several [tokens, hidden, vocab] shapes and tile sizes: whether loss, hidden-state
gradient and weight gradient are bit-identical (torch.equal), and max |diff| / max |plain| otherwise.
"""

from __future__ import annotations

import argparse

import torch

from superoffload.sequence.loss import tiled_token_losses, token_losses

SHAPES = [(256, 128, 1024), (1000, 96, 1000), (2048, 128, 1024), (2048, 512, 4096)]
TILES = [32, 48, 100, 256, None]   # None: one tile holding every token


def _run(fn, hidden, weight, targets):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    loss = fn(h, w).sum() * (1.0 / hidden.shape[0])
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _cmp(a: torch.Tensor, b: torch.Tensor) -> str:
    if torch.equal(a, b):
        return "equal"
    return f"{(a.float() - b.float()).abs().max().item() / b.float().abs().max().item():.2e}"


def measure(threads: int, verbose: bool) -> dict[str, str]:
    torch.set_num_threads(threads)
    worst: dict[str, float] = {}
    for dtype in (torch.float32, torch.bfloat16):
        dt = str(dtype).removeprefix("torch.")
        for n, h, v in SHAPES:
            g = torch.Generator().manual_seed(0)
            hidden = torch.randn(n, h, generator=g).to(dtype)
            weight = (0.02 * torch.randn(v, h, generator=g)).to(dtype)
            targets = torch.randint(0, v, (n,), generator=g)
            targets[::13] = -100
            plain = _run(lambda a, b, t=targets: token_losses(a, b, t), hidden, weight, targets)
            for tile in dict.fromkeys(min(t or n, n) for t in TILES):
                tiled = _run(lambda a, b, t=targets, k=tile: tiled_token_losses(a, b, t, tile=k),
                             hidden, weight, targets)
                cells = [_cmp(x, y) for x, y in zip(tiled, plain, strict=True)]
                for name, c in zip(("loss", "grad h", "grad W"), cells, strict=True):
                    key = f"{dt} {name}"
                    worst[key] = max(worst.get(key, 0.0), 0.0 if c == "equal" else float(c))
                if verbose:
                    print(f"{dt:9} {f'{n},{h},{v}':20} {tile:>5}  " + " ".join(f"{c:9}" for c in cells))
    return {k: "always equal" if x == 0 else f"{x:.2e}" for k, x in worst.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default=str(torch.get_num_threads()), help="comma-separated thread counts")
    ap.add_argument("--verbose", action="store_true", help="one line per dtype, shape and tile")
    a = ap.parse_args()
    print(f"torch {torch.__version__}; worst max|diff| / max|plain| over {len(SHAPES)} shapes x tiles {TILES}")
    if a.verbose:
        print(f"{'dtype':9} {'tokens,hidden,vocab':20} {'tile':>5}  {'loss':9} {'grad h':9} {'grad W':9}")
    for threads in (int(t) for t in a.threads.split(",")):
        print(f"{threads:2} threads:", measure(threads, a.verbose))


if __name__ == "__main__":
    main()
