"""Where a CPU step goes, the engine beside plain torch, in one process: forward, backward and optimizer-step
time per step, and inside the engine's backward the gradient launch (flatten, norm, hand-off) and the norm.

    python benchmarks/step_phases.py [--model gpt-tiny --seq 256 --batch 2 --rounds 3 --steps 30 --warmup 5]
                                     [--bucket-size 1055488] [--threads 1] [--speculation] [--tiny-tensors N]

Alternating rounds of three runs on the same model, data and precision (fp32), each a fresh model:
- `torch`: fused AdamW, no clipping (what `bench run` does by default);
- `torch+clip`: fused AdamW after `clip_grad_norm_(1.0)` (a norm pass, as the engine always makes one);
- `superoffload`: the engine with one bucket size, validate-first (`speculation: false`; `--speculation`: true),
  the host worker on its own thread.
`--tiny-tensors N` replaces the model by N tensors of at most 64 elements (N/2 8x8 linear layers and their
biases, a squared-error loss): copies and norms cost nothing there, so the engine's phases beyond torch's are its
per-tensor Python work (hooks, launch bookkeeping, validation), the part of a step that grows with the tensor count.
Prints per run the medians (ms per step) of each phase and, for the engine, its launch and norm time per step
(the engine's `Launcher.launch` and the device kernels' `grad_norm`, timed by wrapping them); then each system's
median step over the rounds and the ratios to the engine's.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

import superoffload
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape
from superoffload.harness.systems.torch_system import split_decay_groups


def _timed(acc: dict[str, float], key: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def run(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
    return run


class TinyTensors(torch.nn.Module):
    """`n` tensors of at most 64 elements: a model whose step is all per-tensor overhead."""

    def __init__(self, n: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(max(1, n // 2)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return (x - y).square().mean()


class TinyData:
    def micro_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)


def one_run(system: str, args: argparse.Namespace, data: SyntheticData | TinyData) -> dict[str, float]:
    if args.tiny_tensors:
        model: torch.nn.Module = TinyTensors(args.tiny_tensors)
    else:
        model = build_model(get_shape(args.model), seq=args.seq, seed=0)
    inner: dict[str, float] = {}
    if system == "superoffload":
        engine = superoffload.initialize(model, {"bucket_size": args.bucket_size, "speculation": args.speculation,
                                                 "host_threads": 1})
        kernels, launcher = engine.backend.kernels, engine.launcher
        launcher.launch = _timed(inner, "launch", launcher.launch)
        kernels.grad_norm = _timed(inner, "norm", kernels.grad_norm)
        fwd, bwd, opt_step = engine, engine.backward, lambda: (engine.step(), engine.zero_grad())
    else:
        opt = torch.optim.AdamW(split_decay_groups(model, 0.1), lr=1e-4, fused=True)
        clip = system == "torch+clip"

        def opt_step() -> None:
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        fwd, bwd = model, (lambda loss: loss.backward())
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "step": [], "total": []}
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            inner.clear()
        x, y = data.micro_batch(i, 0)
        t0 = time.perf_counter()
        loss = fwd(x, y)
        t1 = time.perf_counter()
        bwd(loss)
        t2 = time.perf_counter()
        opt_step()
        t3 = time.perf_counter()
        if i >= args.warmup:
            for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
                phases[k].append(v)
    if system == "superoffload":
        engine.close()
    out = {k: statistics.median(v) for k, v in phases.items()}
    out.update({k: v / args.steps for k, v in inner.items()})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-tiny")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--bucket-size", type=int, default=1_055_488, help="engine bucket (default: gpt-tiny whole)")
    p.add_argument("--threads", type=int, default=1, help="compute threads (torch.set_num_threads)")
    p.add_argument("--speculation", action="store_true", help="the engine speculates (default: validate first)")
    p.add_argument("--tiny-tensors", type=int, default=0, metavar="N",
                   help="N tensors of <= 64 elements instead of the model (per-tensor overhead only)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = TinyData() if args.tiny_tensors else SyntheticData(get_shape(args.model).vocab, args.seq, args.batch, seed=1)
    totals: dict[str, list[float]] = {"torch": [], "torch+clip": [], "superoffload": []}
    for r in range(args.rounds):
        for system in (totals if r % 2 == 0 else reversed(list(totals))):
            res = one_run(system, args, data)
            totals[system].append(res["total"])
            print(f"round {r} {system:13s} " + "  ".join(f"{k} {v * 1e3:.2f}" for k, v in res.items()) + "  (ms/step)")
    med = {k: statistics.median(v) for k, v in totals.items()}
    what = (f"{args.tiny_tensors} tiny tensors" if args.tiny_tensors
            else f"{args.model} seq {args.seq} batch {args.batch}")
    print(f"{what} fp32, {args.threads} compute thread(s), median step over "
          f"{args.rounds} rounds: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()))
    print("ratio to superoffload (above 1: slower than the engine): "
          + ", ".join(f"{k} {v / med['superoffload']:.3f}" for k, v in med.items() if k != "superoffload"))


if __name__ == "__main__":
    main()
