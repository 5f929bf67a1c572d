"""The host worker at its kernel's speed? The engine's host step per bucket beside the same kernel calls alone.

    python benchmarks/worker_speed.py [--model gpt-small --seq 128 --batch 2 --bucket-size 4194304
                                       --steps 8 --warmup 3 --rounds 3 --device sim --rollback-mode deferred]
                                      [--torch-threads N] [--pin-training-thread]

The engine trains `--model` in bf16 on `--device` (`sim`: the CUDA code path on the simulated discrete device,
so the GraceAdam pool is configured as beside a GPU: every CPU of the affinity mask but the training thread's,
pinned) with speculation on, and its counters give the host worker's kernel time per step (`host_step_s` +
`commit_s`: the speculative pass and, with `deferred`, the commit pass; `full_copy`: one pass) and its busy
time (`host_worker_busy_s`: every task, the gradient's landing and the upload included). Then, in the same
process and with the same pool, the same kernel calls alone on fresh buffers of each host bucket's size (fp32
master, m, v, a bf16 gradient, a bf16 upload copy: what `bench adam` times as `grace_deferred_commit` or
`grace_double_buffer`), nothing running beside them. Rounds alternate the two; medians per round are printed,
and the ratios engine / alone (the target: kernel time within 1.2x of the kernel alone).

On a CPU the training thread's forward and backward compute runs on the CPUs too (on a GPU it is launched, not
computed): with torch's intra-op threads on every CPU, one of them shares the pool's core. `--torch-threads 1
--pin-training-thread` keeps the training thread (pinned, after the engine chose the pool's CPUs) and its compute
off the pool's CPUs, as a GPU run leaves them."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import superoffload
from superoffload.engine import host_adam
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape


def engine_round(args: argparse.Namespace) -> tuple[list[int], float, float]:
    """(host bucket sizes, worker kernel seconds per step, worker busy seconds per step)."""
    shape = get_shape(args.model)
    model = build_model(shape, seq=args.seq, seed=0, activation_checkpointing=True).to(torch.bfloat16)
    data = SyntheticData(shape.vocab, args.seq, args.batch, seed=1)
    engine = superoffload.initialize(model, {
        "optimizer": {"lr": 1e-4, "weight_decay": 0.1}, "device": args.device, "precision": "bf16",
        "bucket_size": args.bucket_size, "device_tail_buckets": 0, "speculation": True,
        "rollback_mode": args.rollback_mode, "speculation_policy": {"max_rollback_rate": 1.0}})
    every = os.sched_getaffinity(0)
    if args.pin_training_thread:
        pool = set((engine.stats["host_pool"] or {}).get("cpus") or ())
        os.sched_setaffinity(0, (every - pool) or every)  # this thread only (Linux: 0 is the calling thread)
    try:
        def steps(n: int, start: int) -> None:
            for i in range(start, start + n):
                b = data.batch_at(i)
                engine.backward(engine(b.inputs[0], b.targets[0]))
                engine.step()
            engine.synchronize()

        steps(args.warmup, 0)
        t0 = engine.stats["time_s"]
        steps(args.steps, args.warmup)
        t1 = engine.stats["time_s"]
        kernel = sum(t1.get(k, 0.0) - t0.get(k, 0.0) for k in ("host_step_s", "commit_s", "rollback_s"))
        busy = t1["host_worker_busy_s"] - t0["host_worker_busy_s"]
        sizes = [b.hi - b.lo for b in engine.buckets if b.host is not None]
        return sizes, kernel / args.steps, busy / args.steps
    finally:
        engine.close()
        os.sched_setaffinity(0, every)


def kernel_alone(sizes: list[int], mode: str, repeats: int = 5) -> float:
    """Seconds per step of the worker's kernel calls for `sizes` host buckets, alone (median of `repeats`)."""
    bufs = []
    for n in sizes:
        state = [torch.randn(n).abs_() * 1e-3 for _ in range(3)]
        spare = [torch.empty(n) for _ in range(3)] if mode == "full_copy" else None
        bufs.append((state, torch.randn(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.bfloat16), spare))
    hp = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1, "adamw": True,
          "bias_correction": True, "grad_scale": 1.0, "max_exp_avg_sq": None, "threads": None}

    def once() -> float:
        t0 = time.perf_counter()
        for step, ((p, m, v), g, out, spare) in enumerate(bufs):
            # the speculative pass (writes the bf16 upload copy, and the new state to spare with full_copy)
            host_adam.adam_step("grace", p, g, m, v, step=2 + step, commit=False, param_out=None, lowp_out=out,
                                state_out=spare, **hp)
            if spare is None:  # deferred: the commit pass, in place
                host_adam.adam_step("grace", p, g, m, v, step=2 + step, commit=True, param_out=None,
                                    lowp_out=None, **hp)
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bucket-size", type=int, default=4_194_304)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="sim", choices=["sim", "host"])
    ap.add_argument("--rollback-mode", default="deferred", choices=["deferred", "full_copy"])
    ap.add_argument("--torch-threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    ap.add_argument("--pin-training-thread", action="store_true",
                    help="pin the training thread to the CPUs the GraceAdam pool does not use")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    ratios, busy_ratios = [], []
    for r in range(args.rounds):
        sizes, kernel, busy = engine_round(args)
        alone = kernel_alone(sizes, args.rollback_mode)
        ratios.append(kernel / alone)
        busy_ratios.append(busy / alone)
        print(f"round {r}: {len(sizes)} host buckets ({sum(sizes) / 1e6:.1f}M params); per step: worker kernels "
              f"{kernel * 1e3:.1f} ms, worker busy {busy * 1e3:.1f} ms, kernels alone {alone * 1e3:.1f} ms; "
              f"per bucket {kernel / len(sizes) * 1e3:.2f} vs {alone / len(sizes) * 1e3:.2f} ms")
    print(f"median over {args.rounds} rounds: worker kernels / alone {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}); worker busy / kernels alone "
          f"{statistics.median(busy_ratios):.2f}x; pool: {superoffload_pool()}")


def superoffload_pool() -> str:
    import grace_adam

    return f"{grace_adam.get_num_threads()} GraceAdam thread(s)"


if __name__ == "__main__":
    main()
