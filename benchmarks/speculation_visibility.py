"""What keeping speculative weights apart until `step()` costs: measured on the CPU-only path, side by side
in one run, and predicted by the cost model for a Superchip.

    python benchmarks/speculation_visibility.py measure --before /path/to/old/checkout [--model gpt-small
        --seq 128 --batch 2 --steps 8 --rounds 3]
    python benchmarks/speculation_visibility.py model [--hardware gh200 --seq 1024 --batches 8,1]

The engine keeps a speculative step's new weights in its upload buffer until `step()` validates and publishes
them, so a forward, a `state_dict()` or a raw `param.data` read between `backward()` and `step()` sees the
pre-step weights (torch's semantics). An older checkout (commit c90ecaf: `git worktree add /tmp/old c90ecaf
&& (cd /tmp/old && python -m grace_adam.build)`) wrote the speculative weights into the live parameters
during backward. This measures, for both checkouts in alternating rounds (each engine in its own
subprocess with that checkout first on sys.path, host device, bf16, clipping never firing):

- the median step time with speculation forced on and with validate-then-step (speculation off);
- the ratio speculation on / off within each checkout, and this checkout / the older one per mode.

Cost of the choice = how much this checkout's speculative step lost against the older one's, beyond what
the rest of the engine's changes explain (the speculation-off ratio between the checkouts).

`model` prices the same choice where it matters, on a Superchip: the cost model's prediction of the planned
SuperOffload step for the paper's single-chip model sizes, with each bucket's upload waiting for validation
(what the engine does) and without (the weights written into the live parameters during backward), and the
ratio of the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The same child for both checkouts: only names both have.
_CHILD = r'''
import json, sys, time
import superoffload
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape
model, seq, batch, steps, spec, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5] == "1", int(sys.argv[6])
shape = get_shape(model)
cfg = {"precision": "bf16", "bucket_size": 1 << 20, "device_tail_buckets": 0, "device": "cpu",
       "speculation": spec, "speculation_policy": {"max_rollback_rate": 1.0}, "grad_clip": 0.0,
       "host_threads": threads}
eng = superoffload.initialize(build_model(shape, seq=seq, seed=0), cfg)
data = SyntheticData(shape.vocab, seq, batch, seed=0)
times = []
for i in range(steps + 2):  # two warm-up steps (the first one lays out the buckets)
    b = data.batch_at(i)
    t0 = time.perf_counter()
    eng.backward(eng(b.inputs[0], b.targets[0]))
    eng.step()
    eng.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times[2:]}))
'''


def _run(tree: str, a: argparse.Namespace, spec: bool) -> float:
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": str(a.threads)}
    out = subprocess.run([sys.executable, "-c", _CHILD, a.model, str(a.seq), str(a.batch), str(a.steps),
                          "1" if spec else "0", str(a.threads)], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(f"the run in {tree} failed:\n{out.stderr[-3000:]}")
    return statistics.median(json.loads(out.stdout.strip().splitlines()[-1])["times"])


def measure(a: argparse.Namespace) -> dict:
    trees = {"before": str(Path(a.before).resolve()), "after": str(ROOT)}
    rows: dict[str, list[float]] = {f"{t} {m}": [] for t in trees for m in ("spec", "validate-first")}
    t0 = time.time()
    for _ in range(a.rounds):
        for t, path in trees.items():
            for m in ("spec", "validate-first"):
                rows[f"{t} {m}"].append(_run(path, a, m == "spec"))
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratios = {
        "before spec / validate-first": med["before spec"] / med["before validate-first"],
        "after spec / validate-first": med["after spec"] / med["after validate-first"],
        "spec after / before": med["after spec"] / med["before spec"],
        "validate-first after / before": med["after validate-first"] / med["before validate-first"],
    }
    print(f"{a.model} seq {a.seq} batch {a.batch}, bf16, bucket 1M, host device, {a.threads} thread(s), "
          f"{a.rounds} rounds x {a.steps} steps")
    for k, v in rows.items():
        print(f"  {k:28s} median {1e3 * med[k]:8.1f} ms  rounds " + ", ".join(f"{1e3 * x:.1f}" for x in v))
    for k, v in ratios.items():
        print(f"  {k:32s} {v:.3f}x")
    return {"benchmark": "speculation_visibility", "model": a.model, "seq": a.seq, "batch": a.batch,
            "threads": a.threads, "rounds": rows, "median_s": med, "ratios": ratios, "wall_s": time.time() - t0}


def model(a: argparse.Namespace) -> dict:
    from superoffload.planner.costmodel import Workload, predict
    from superoffload.planner.paper import FIG10_SIZES
    from superoffload.planner.plan import PlanInfeasible, make_plan
    from superoffload.planner.presets import get_profile
    from superoffload.shapes import get_shape

    hw = get_profile(a.hardware)
    rows = []
    print(f"cost model, {hw.name}, seq {a.seq}: SuperOffload's planned step, uploads waiting for validation "
          f"(kept apart) vs during backward (live)")
    print(f"  {'model':>9} {'batch':>5} {'apart tok/s':>12} {'live tok/s':>12} {'apart/live':>10} {'MFU apart':>9}")
    for batch in a.batches:
        for size in FIG10_SIZES:
            shape = get_shape(f"gpt-{size}")
            try:
                plan = make_plan(shape, a.seq, batch, hw)
            except PlanInfeasible:
                continue
            w = Workload(shape, a.seq, batch, True)
            apart = predict("superoffload", w, hw, plan.options())
            live = predict("superoffload", w, hw, plan.options(), spec_changes={"return_waits_validation": False})
            ratio = apart.tokens_per_s / live.tokens_per_s
            rows.append({"model": shape.name, "batch": batch, "apart_tokens_per_s": apart.tokens_per_s,
                         "live_tokens_per_s": live.tokens_per_s, "ratio": ratio, "apart_mfu": apart.mfu,
                         "live_mfu": live.mfu})
            print(f"  {shape.name:>9} {batch:5d} {apart.tokens_per_s:12.0f} {live.tokens_per_s:12.0f} {ratio:10.4f} "
                  f"{100 * apart.mfu:8.1f}%")
    worst = min(rows, key=lambda r: r["ratio"]) if rows else None
    if worst:
        print(f"largest cost: {worst['model']} batch {worst['batch']}: {100 * (1 - worst['ratio']):.2f} % of "
              f"tokens/s")
    return {"benchmark": "speculation_visibility_model", "hardware": hw.name, "seq": a.seq, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="CPU-only step times, this checkout vs an older one")
    m.add_argument("--before", required=True, help="path of the older checkout (with its grace_adam built)")
    m.add_argument("--model", default="gpt-small")
    m.add_argument("--seq", type=int, default=128)
    m.add_argument("--batch", type=int, default=2)
    m.add_argument("--steps", type=int, default=8, help="timed steps per run (after 2 warm-up steps)")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--threads", type=int, default=1, help="torch and host-optimizer threads")
    m.set_defaults(fn=measure)
    c = sub.add_parser("model", help="the cost model's price of the choice on a Superchip")
    c.add_argument("--hardware", default="gh200", help="planner profile: preset name or calibrate JSON")
    c.add_argument("--seq", type=int, default=1024)
    c.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[8, 1],
                   help="comma-separated micro-batch sizes (default 8,1)")
    c.set_defaults(fn=model)
    for p in (m, c):
        p.add_argument("--out", default=None, help="write the JSON here too")
    a = ap.parse_args()
    rec = a.fn(a)
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
