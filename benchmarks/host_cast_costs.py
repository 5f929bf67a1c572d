"""What a host-side cast costs the engine, side by side: the measurement behind the cost model charging no
host cast pass for `grad_cast: host` (`planner/systems.py`, LOWP_GRAD_READ_SAVING) and behind `calibrate`
timing casts into existing buffers.

    python benchmarks/host_cast_costs.py [--numel 10539008] [--threads 1] [--repeats 7]

On one parameter shard, in interleaved rounds (one call of each per round; medians), so drift hits all alike:
- GraceAdam's step with fp32 gradients, with bf16 gradients (what `grad_cast: host` lands), and with bf16
  gradients plus the bf16 weight copy it writes in the same pass;
- a bf16 -> fp32 cast into an existing buffer (what a separate host cast pass would cost) and the same cast
  as `x.float()` (a new output each call: what `calibrate` timed until 2026-12-05).
Prints each one's median milliseconds, ns/param and its ratio to the fp32-gradient step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=10_539_008, help="shard size (default: gpt-small's half)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import grace_adam

    torch.set_num_threads(args.threads)
    n = args.numel
    gen = torch.Generator().manual_seed(0)
    p, m, v = torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)
    g32 = torch.randn(n, generator=gen)
    g16, out16, wide = g32.bfloat16(), torch.empty(n, dtype=torch.bfloat16), torch.empty(n)
    hp = dict(step=1, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, adamw=True,
              bias_correction=True, grad_scale=1.0, threads=args.threads)
    cases = {
        "adam, fp32 grads": lambda: grace_adam.adam_step(p, g32, m, v, **hp),
        "adam, bf16 grads": lambda: grace_adam.adam_step(p, g16, m, v, **hp),
        "adam, bf16 grads + bf16 copy": lambda: grace_adam.adam_step(p, g16, m, v, lowp_out=out16, **hp),
        "cast into a buffer": lambda: wide.copy_(g16),
        "cast as x.float()": lambda: g16.float(),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn()  # warm-up: first touch, kernel selection
    for _ in range(args.repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["adam, fp32 grads"])
    print(f"numel {n:,}, {args.threads} thread(s), median of {args.repeats} interleaved rounds")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"  {name:30s} {t * 1e3:8.2f} ms  {t / n * 1e9:5.2f} ns/param  {t / base:5.2f}x the fp32-grad step")


if __name__ == "__main__":
    main()
