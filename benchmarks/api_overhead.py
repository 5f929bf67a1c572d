"""The two ways of driving the engine, side by side: its own API (`engine.backward(loss); engine.step()`)
and superoffload.AdamW in a plain loop (`loss.backward(); opt.step(); opt.zero_grad()`), on the same model,
data and engine config, as `superoffload bench run --api engine|optimizer` runs them.

    python benchmarks/api_overhead.py [--model gpt-small --seq 128 --batch 2 --rounds 5 --steps 10 ...]

Runs the two alternately, one fresh process per run (so neither profits from the other's warm caches
more than from its own), and prints each round's tokens/s, the medians, the ratio of the medians
(optimizer / engine) and the rounds' spread. The losses of the two must be identical (same arithmetic:
the plain loop divides the loss as engine.backward does), which the script checks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one(api: str, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "superoffload", "bench", "run", "--system", "superoffload", "--model", args.model,
           "--seq", str(args.seq), "--batch", str(args.batch), "--grad-accum", str(args.grad_accum),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--dtype", args.dtype,
           "--grad-clip", str(args.grad_clip), "--threads", str(args.threads), "--device", args.device,
           "--api", api, "--no-progress", "--out", str(out), *sum((["-o", o] for o in args.option), [])]
    subprocess.run(cmd, check=True, capture_output=True)
    rec = json.loads(out.read_text())
    if rec["status"] != "ok":
        raise RuntimeError(f"{api}: {rec['status']}: {rec.get('error')}")
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt-small")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-o", "--option", action="append", default=[], help="engine option KEY=VALUE (both runs)")
    args = p.parse_args()
    tps: dict[str, list[float]] = {"engine": [], "optimizer": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            losses = {}
            for api in (("engine", "optimizer") if r % 2 == 0 else ("optimizer", "engine")):
                rec = one(api, args, Path(tmp) / f"{api}{r}.json")
                tps[api].append(rec["throughput"]["tokens_per_s"])
                losses[api] = rec["losses"]
            if losses["engine"] != losses["optimizer"]:
                raise SystemExit(f"round {r}: the two APIs' losses differ: {losses}")
            print(f"round {r}: engine {tps['engine'][-1]:,.0f} tokens/s, optimizer {tps['optimizer'][-1]:,.0f}")
    med = {k: statistics.median(v) for k, v in tps.items()}
    spread = {k: (min(v), max(v)) for k, v in tps.items()}
    ranges = {k: f"{lo:,.0f}-{hi:,.0f}" for k, (lo, hi) in spread.items()}
    print(f"{args.model} seq {args.seq} batch {args.batch} accum {args.grad_accum} {args.dtype}, "
          f"{args.rounds} rounds x {args.steps} steps: median engine {med['engine']:,.0f} (range {ranges['engine']}), "
          f"optimizer {med['optimizer']:,.0f} (range {ranges['optimizer']}) tokens/s; "
          f"optimizer / engine = {med['optimizer'] / med['engine']:.3f}; losses identical")


if __name__ == "__main__":
    main()
