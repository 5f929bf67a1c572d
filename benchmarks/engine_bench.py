"""Engine benchmarks, each measured side by side in one process so the ratios mean something.

    python benchmarks/engine_bench.py overhead     [--model gpt-small --rounds 3 --steps 8] [-o KEY=VALUE]
        CPU-only engine overhead: the `superoffload` system vs the `torch` system, same model, data and
        precision, alternating rounds; prints the median step-time ratio (target <= 1.15x). `-o` passes
        superoffload system options (e.g. `-o speculation=true` to override the plan).
    python benchmarks/engine_bench.py speculation  [--model gpt-tiny --steps 100 --rates 0,0.01,0.1]
        Step time with speculation vs validate-then-step when a chosen fraction of steps needs a
        rollback (clipping forced on those steps), alternating the two modes per round.
    python benchmarks/engine_bench.py rollback-rate [--model gpt-tiny --steps 300 --clip 1.0]
        From scratch with clipping 1.0: how often would clipping fire (= a speculative rollback)?
        Prints the rate per window of steps; this is what the speculation policy reacts to.

Each writes a JSON record with `--out` (atomic) and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import superoffload
from superoffload.harness import provenance
from superoffload.harness.arguments import key_value
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape
from superoffload.harness.record import write_json_atomic
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig


def overhead(args: argparse.Namespace) -> dict:
    rows = {"torch": [], "superoffload": []}
    for _ in range(args.rounds):
        for system in rows:
            opts = dict(args.option) if system == "superoffload" else {}
            run = RunConfig(system=system, model=args.model, seq=args.seq, batch=args.batch, steps=args.steps,
                            warmup=2, precision=args.precision, threads=args.threads, device="cpu", system_options=opts)
            rec = run_benchmark(run)
            assert rec["status"] == "ok", rec["error"]
            rows[system].append(rec["timing"]["median_s"])
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio = med["superoffload"] / med["torch"]
    print(f"{args.model} seq={args.seq} batch={args.batch} {args.precision} threads={args.threads} "
          f"options={dict(args.option)}: "
          f"torch {1e3 * med['torch']:.1f} ms, superoffload {1e3 * med['superoffload']:.1f} ms, "
          f"ratio {ratio:.3f}x (target <= 1.15x); per-round medians {rows}")
    return {"benchmark": "engine_overhead", "options": dict(args.option), "median_s": med, "rounds": rows,
            "ratio": ratio}


def _train(model_name: str, steps: int, seq: int, cfg: dict, forced: set[int]) -> list[float]:
    """Per-step wall times; clipping is forced (tiny threshold) on the steps in `forced`."""
    shape = get_shape(model_name)
    data = SyntheticData(shape.vocab, seq, 2, seed=1)
    engine = superoffload.initialize(build_model(shape, seq=seq, seed=0), cfg)
    times = []
    for i in range(steps):
        engine.config.grad_clip = 1e-6 if i in forced else 1e6
        b = data.batch_at(i)
        t0 = time.perf_counter()
        engine.backward(engine(b.inputs[0], b.targets[0]))
        engine.step()
        times.append(time.perf_counter() - t0)
    engine.synchronize()
    engine.close()
    return times[3:]  # warm-up: layout measurement and first-touch


def speculation(args: argparse.Namespace) -> dict:
    out = []
    for rate in args.rates:
        forced = set(range(5, args.steps, max(1, round(1 / rate)))) if rate > 0 else set()
        base = {"optimizer": {"lr": 1e-3}, "bucket_size": args.bucket_size, "host_threads": args.threads,
                "speculation_policy": {"max_rollback_rate": 1.0}}  # measure speculation itself, no policy
        res = {"spec": [], "validate_first": []}
        for _ in range(args.rounds):
            res["spec"] += _train(args.model, args.steps, args.seq, {**base, "speculation": True}, forced)
            res["validate_first"] += _train(args.model, args.steps, args.seq, {**base, "speculation": False},
                                            forced)
        med = {k: statistics.median(v) for k, v in res.items()}
        row = {"rollback_rate": len(forced) / args.steps, "median_s": med,
               "speedup": med["validate_first"] / med["spec"]}
        print(f"rollback rate {100 * row['rollback_rate']:5.1f}%: speculate {1e3 * med['spec']:.2f} ms/step, "
              f"validate-first {1e3 * med['validate_first']:.2f} ms/step, speedup {row['speedup']:.3f}x")
        out.append(row)
    return {"benchmark": "speculation", "model": args.model, "rows": out}


def rollback_rate(args: argparse.Namespace) -> dict:
    shape = get_shape(args.model)
    data = SyntheticData(shape.vocab, args.seq, 2, seed=1)
    engine = superoffload.initialize(build_model(shape, seq=args.seq, seed=0),
                                     {"optimizer": {"lr": args.lr, "betas": [0.9, 0.95], "weight_decay": 0.1},
                                      "grad_clip": args.clip, "bucket_size": 1 << 20})
    fired, norms = [], []
    for i in range(args.steps):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0], b.targets[0]))
        engine.step()
        fired.append(engine.last_clip_coef < 1.0)
        norms.append(engine.last_grad_norm)
    engine.close()
    w = args.window
    windows = [sum(fired[i: i + w]) / len(fired[i: i + w]) for i in range(0, len(fired), w)]
    print(f"{args.model} from scratch, lr {args.lr}, clip {args.clip}: clipping fired on "
          f"{sum(fired)}/{len(fired)} steps; per {w}-step window: " + " ".join(f"{100 * r:.0f}%" for r in windows))
    return {"benchmark": "rollback_rate", "model": args.model, "clip": args.clip, "lr": args.lr,
            "fired": fired, "grad_norms": norms, "window_rates": windows, "rate": sum(fired) / len(fired)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--model", default="gpt-small")
    o.add_argument("--seq", type=int, default=128)
    o.add_argument("--batch", type=int, default=2)
    o.add_argument("--steps", type=int, default=8)
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--precision", "--dtype", dest="precision", default="fp32", choices=["fp32", "bf16"],
                   help="training precision (default fp32; --dtype is its old name)")
    o.add_argument("-o", "--option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="superoffload system option (JSON value), repeatable")
    o.set_defaults(fn=overhead)
    s = sub.add_parser("speculation")
    s.add_argument("--model", default="gpt-tiny")
    s.add_argument("--seq", type=int, default=64)
    s.add_argument("--steps", type=int, default=100)
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[0.0, 0.01, 0.1])
    s.add_argument("--bucket-size", type=int, default=65536)
    s.set_defaults(fn=speculation)
    r = sub.add_parser("rollback-rate")
    r.add_argument("--model", default="gpt-tiny")
    r.add_argument("--seq", type=int, default=64)
    r.add_argument("--steps", type=int, default=300)
    r.add_argument("--clip", type=float, default=1.0)
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--window", type=int, default=50)
    r.set_defaults(fn=rollback_rate)
    for sp in (o, s, r):
        sp.add_argument("--threads", type=int, default=2)
        sp.add_argument("--out", default=None, help="JSON record to write")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rec = args.fn(args)
    rec.update(threads=args.threads, provenance=provenance.collect("cpu"),
               created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if args.out:
        write_json_atomic(args.out, rec)


if __name__ == "__main__":
    main()
