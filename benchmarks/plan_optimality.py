"""Is the planner's choice the best one on this machine? The planned configuration against a grid around it,
measured side by side.

    python benchmarks/plan_optimality.py --out results/plan_optimality.json
        [--hardware PROFILE.json] [--workloads gpt-tiny:128,gpt-tiny:256,gpt-small:128,gpt-small:256]
        [--world 1,2] [--dtype fp32,bf16] [--grid all] [--repeats 2] [--steps 8] [--warmup 2]
        [--threads 1] [--bind-cores] [--peers torch,zero_offload] [--retry-loaded 0]

For every point (model, sequence, micro-batch, ranks, precision) the planner makes its plan (``make_plan`` on
the ``--hardware`` profile: a preset, or one written by ``superoffload calibrate``, the same profile every run
is given as ``-o hardware=``), and each configuration of the grid is trained with ``superoffload bench run``,
one fresh process per run (``--nproc W`` above one rank):

- ``planned``: the plan as it is;
- ``bucket/4``, ``bucket/2``, ``bucket*2``, ``bucket*4``, ``one-bucket``: the plan with another bucket size;
- ``speculation``: the plan with speculation flipped;
- ``replicate``: above one rank, the plan with the optimizer state's replication flipped (sharded <-> replicated,
  engine config ``replicate``);
- ``cast``: grad_cast and param_cast on the other side (bf16 and fp16 only: fp32 casts nothing);
- ``tail0``, ``tail*2``: no device tail, twice the planned one (only where the device is not the host);
- with ``--peers``: the peer systems at their own defaults (``peer:NAME``), to compare the plan with.

Runs are interleaved: each repeat goes over every point and configuration, in an order rotated per repeat,
so that a machine that drifts (thermal, other load) drifts for all of them, and a point's configurations run
next to each other within a repeat. Per configuration the result holds every repeat's tokens/s per rank, the
median and the range, the cost model's predicted step for it (the plan's options with that knob changed, priced
on the same profile), and, paired by repeat, its ratio to the plan and how many repeats it beat the plan in. Per
point: planned / best measured tokens/s, which configuration was best and whether clearly, and the Spearman
correlation between the predicted and the measured ranking. The best of several noisy configurations is biased
upward, so a ratio under the goal is a planner miss only where the best is *clearly* faster: its slowest repeat
beat the plan's fastest (with two repeats or more) -- the same statement as a one-sided sign test over the
paired repeats when it won every one of them (``best_sign_p``: 0.5^n for n repeats; 0.125 at 3, 0.0625 at 4).

Every point is planned as its runs plan: with the host a rank has there (``placement.rank_host``: the cores of a
``--bind-cores`` slice or a share of the CPUs, ``--threads`` compute threads, the engine's host threads); each
run's record carries the plan it ran, and a point whose run planned otherwise says so (``run_plan_mismatch``).
The file (``superoffload/harness/plan_optimality.schema.json``) is rewritten atomically after every run; run the
same command again and it resumes where it stopped, keeping what was measured (with another ``--repeats`` too:
more extends a finished run, fewer ends a long one at that count).

The goal on a machine is planned >= 0.95 of the best measured at every point (``summary``); the script exits 0
either way (it measures, it does not judge), and 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

GOAL = 0.95  # planned / best measured, at every point
SCHEMA_KIND = "plan_optimality"
BUCKET_GRID = {"bucket/4": 0.25, "bucket/2": 0.5, "bucket*2": 2.0, "bucket*4": 4.0}
GRID = ("planned", *BUCKET_GRID, "one-bucket", "speculation", "replicate", "cast", "tail0", "tail*2")
DEFAULT_WORKLOADS = "gpt-tiny:128,gpt-tiny:256,gpt-small:128,gpt-small:256"


def parse_workloads(text: str, batch: int) -> list[tuple[str, int, int]]:
    """MODEL:SEQ[:BATCH],... as (model, seq, batch)."""
    from superoffload.shapes import get_shape

    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise ValueError(f"--workloads: {item!r} is not MODEL:SEQ[:BATCH] (e.g. gpt-tiny:128)")
        get_shape(parts[0])  # an unknown model is a ValueError naming the zoo
        out.append((parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else batch))
    if not out:
        raise ValueError("--workloads names no workload")
    return out


def point_id(model: str, seq: int, batch: int, world: int, dtype: str) -> str:
    return f"{model}:s{seq}:b{batch}:w{world}:{dtype}"


def grid_for(plan: Any, n_params: int, dtype: str, device_is_host: bool, labels: list[str],
             world: int = 1) -> list[dict]:
    """The configurations of one point: a label and the engine options it sets over the plan."""
    out: list[dict] = []
    seen: set[str] = set()

    def add(label: str, options: dict[str, Any]) -> None:
        key = json.dumps(options, sort_keys=True)
        if label in labels and key not in seen:  # two labels reaching the same config run once
            seen.add(key)
            out.append({"label": label, "options": options})

    add("planned", {})
    seen.add(json.dumps({"bucket_size": plan.bucket_size}))  # the plan's own bucket is "planned"
    for label, f in BUCKET_GRID.items():
        add(label, {"bucket_size": max(1, min(n_params, int(plan.bucket_size * f)))})
    add("one-bucket", {"bucket_size": n_params})
    add("speculation", {"speculation": not plan.speculation})
    if world > 1:
        add("replicate", {"replicate": not plan.replicate})
    if dtype != "fp32":
        add("cast", {"cast_policy": "host" if plan.grad_cast == "device" else "device"})
    if not device_is_host:
        add("tail0", {"device_tail_buckets": 0})
        add("tail*2", {"device_tail_buckets": max(1, 2 * plan.device_tail_buckets)})
    return out


def predicted_step(plan: Any, shape: Any, hw: Any, dtype: str, options: dict[str, Any]) -> float:
    """The cost model's step for the plan with `options` changed, at the run's precision."""
    from superoffload.planner.costmodel import predict

    knobs = dict(options)
    if "cast_policy" in knobs:
        side = knobs.pop("cast_policy")
        knobs.update(grad_cast=side, param_cast=side)
    opts = replace(plan.options(), precision=dtype, **knobs)
    return predict("superoffload", plan.workload(shape), hw, opts).step_time_s


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties share their mean rank); None under three pairs or a constant side."""
    if len(xs) < 3:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def bench_command(point: dict, config: dict, args: argparse.Namespace, out: Path) -> list[str]:
    system = config["label"].removeprefix("peer:") if config["label"].startswith("peer:") else "superoffload"
    cmd = [sys.executable, "-m", "superoffload", "bench", "run", "--system", system, "--model", point["model"],
           "--seq", str(point["seq"]), "--batch", str(point["batch"]), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--dtype", point["dtype"], "--device", args.device,
           "--no-progress", "--out", str(out)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if point["world"] > 1:
        cmd += ["--nproc", str(point["world"])] + (["--bind-cores"] if args.bind_cores else [])
    if system == "superoffload":
        cmd += ["-o", f"hardware={args.hardware}"]
        for k, v in config["options"].items():
            cmd += ["-o", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return cmd


# what the benchmark's plan and a run's own plan must agree on for "planned" to be the plan that ran
PLAN_KEYS = ("bucket_size", "device_tail_buckets", "speculation", "grad_cast", "host_optimizer", "rollback_mode",
             "replicate")


def run_one(point: dict, config: dict, args: argparse.Namespace) -> tuple[float | None, str | None]:
    """(tokens/s per rank, None), or (None, why the run failed). A run its record flags `loaded` (other processes
    took more than the noise bound of the CPUs, superoffload/harness/noise.py) is run again, up to
    ``--retry-loaded`` times; ``loaded`` counts [runs discarded, runs kept although loaded]. The planned
    configuration's run also checks that the plan it made is the point's (``run_plan_mismatch``)."""
    loaded = config.setdefault("loaded", [0, 0])
    for attempt in range(args.retry_loaded + 1):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "record.json"
            cmd = bench_command(point, config, args, out)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
            except subprocess.TimeoutExpired:
                return None, f"timed out after {args.run_timeout:.0f} s"
            if not out.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                return None, f"exit {proc.returncode}: {tail[0][:300]}"
            rec = json.loads(out.read_text())
        if rec.get("status") != "ok":
            return None, f"{rec.get('status')}: {str(rec.get('error'))[:300]}"
        if "loaded" in ((rec.get("noise") or {}).get("flags") or []):
            if attempt < args.retry_loaded:
                loaded[0] += 1
                continue
            loaded[1] += 1
        if config["label"] == "planned" and isinstance(rec.get("plan"), dict):
            ran = rec["plan"]
            point["run_plan_mismatch"] = [f"{k}: planned {point['plan'].get(k)!r}, the run planned {ran.get(k)!r}"
                                          for k in PLAN_KEYS if k in point["plan"] and ran.get(k) != point["plan"][k]]
        return float(rec["throughput"]["tokens_per_s"]), None
    raise AssertionError("unreachable")


def build_points(args: argparse.Namespace) -> tuple[list[dict], Any]:
    from superoffload.planner.plan import make_plan
    from superoffload.planner.presets import get_profile
    from superoffload.shapes import get_shape

    hw = get_profile(args.hardware)
    labels = args.grid
    points = []
    for model, seq, batch in args.workloads:
        shape = get_shape(model)
        for world in args.world:
            for dtype in args.dtype:
                host = point_host(args, world)
                plan = make_plan(shape, seq, batch, hw, activation_checkpointing=False, chips=world,
                                 precision=dtype, **host.plan_kwargs())  # as the run's plan_for makes it
                configs = grid_for(plan, shape.total_params(), dtype, hw.device_is_host, labels, world)
                for c in configs:
                    c["predicted_step_s"] = predicted_step(plan, shape, hw, dtype, c["options"])
                configs += [{"label": f"peer:{s}", "options": {}, "predicted_step_s": None} for s in args.peers]
                points.append({
                    "id": point_id(model, seq, batch, world, dtype), "model": model, "seq": seq, "batch": batch,
                    "world": world, "dtype": dtype,
                    "plan": {"bucket_size": plan.bucket_size, "device_tail_buckets": plan.device_tail_buckets,
                             "speculation": plan.speculation, "cast": plan.grad_cast, "grad_cast": plan.grad_cast,
                             "host_optimizer": plan.host_optimizer, "rollback_mode": plan.rollback_mode,
                             "replicate": plan.replicate,
                             "predicted_step_s": plan.predicted.step_time_s if plan.predicted else None,
                             **host.plan_kwargs()},
                    "configs": [{**c, "tokens_per_s": [], "errors": []} for c in configs],
                })
    return points, hw


def point_host(args: argparse.Namespace, world: int) -> Any:
    """The host one rank of a point's runs has (placement.rank_host), from this machine's CPUs and the flags
    ``bench_command`` passes: ``bench run`` computes on ``--threads`` threads (0: torch's default, which is 1
    per rank under torchrun and this process's count for one rank) and gives the host optimizer as many."""
    import torch

    from superoffload.harness.placement import rank_host
    from superoffload.planner.presets import usable_cpus

    compute = args.threads or (1 if world > 1 else torch.get_num_threads())
    return rank_host(usable_cpus(), world, args.bind_cores and world > 1, compute, args.threads or None)


def paired(planned: dict, config: dict) -> list[tuple[float, float]]:
    """(planned, config) tokens/s of the repeats both ran, in repeat order (a failed repeat leaves a gap only
    in its own list, so the lists pair by position only where neither has errors)."""
    if planned["errors"] or config["errors"]:
        return []
    return list(zip(planned["tokens_per_s"], config["tokens_per_s"], strict=False))


def sign_test_p(wins: int, n: int) -> float | None:
    """One-sided sign test: P(at least `wins` of `n` paired repeats favour a configuration when neither is
    faster)."""
    if n < 1:
        return None
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def summarize_point(p: dict) -> None:
    """Medians, ranges, paired ratios to the plan, planned / best and the rank correlation, from the repeats
    measured so far."""
    planned = next((c for c in p["configs"] if c["label"] == "planned"), None)
    for c in p["configs"]:
        v = c["tokens_per_s"]
        c["median_tokens_per_s"] = statistics.median(v) if v else None
        c["range_tokens_per_s"] = [min(v), max(v)] if v else None
        pairs = paired(planned, c) if planned is not None and c is not planned else []
        c["paired_over_planned"] = statistics.median(b / a for a, b in pairs) if pairs else None
        c["wins_over_planned"] = [sum(b > a for a, b in pairs), len(pairs)]
    ours = [c for c in p["configs"] if not c["label"].startswith("peer:") and c["median_tokens_per_s"]]
    planned = planned if planned in ours else None
    best = max(ours, key=lambda c: c["median_tokens_per_s"], default=None)
    p["best_label"] = best["label"] if best else None
    p["planned_over_best"] = (planned["median_tokens_per_s"] / best["median_tokens_per_s"]
                              if planned and best else None)
    # the best of several noisy configurations is biased upward; "clearly" = its slowest repeat beat the
    # plan's fastest (with one repeat each that is no test at all, so it needs two)
    p["best_clearly_faster"] = (bool(min(best["tokens_per_s"]) > max(planned["tokens_per_s"]))
                                if planned and best and best is not planned
                                and min(len(best["tokens_per_s"]), len(planned["tokens_per_s"])) >= 2 else False)
    wins, n = best["wins_over_planned"] if best and best is not planned else (0, 0)
    p["best_sign_p"] = sign_test_p(wins, n) if n else None
    p["best_paired_ratio"] = (1 / best["paired_over_planned"] if best and best is not planned
                              and best["paired_over_planned"] else (1.0 if best is planned and best else None))
    p["predicted_order"] = [c["label"] for c in sorted(ours, key=lambda c: c["predicted_step_s"])]
    p["measured_order"] = [c["label"] for c in sorted(ours, key=lambda c: -c["median_tokens_per_s"])]
    p["rank_correlation"] = spearman([-c["predicted_step_s"] for c in ours], [c["median_tokens_per_s"] for c in ours])
    peers = {c["label"].removeprefix("peer:"): c["median_tokens_per_s"] for c in p["configs"]
             if c["label"].startswith("peer:") and c["median_tokens_per_s"]}
    p["planned_over_peers"] = ({k: planned["median_tokens_per_s"] / v for k, v in peers.items()}
                               if planned else {})


def summary(points: list[dict]) -> dict[str, Any]:
    ratios = [p["planned_over_best"] for p in points if p["planned_over_best"] is not None]
    over_peers = [r for p in points for r in p["planned_over_peers"].values()]
    return {"goal": GOAL, "points": len(points), "points_measured": len(ratios),
            "min_planned_over_best": min(ratios) if ratios else None,
            "points_meeting_goal": sum(r >= GOAL for r in ratios),
            "points_clearly_beaten": sum(bool(p.get("best_clearly_faster")) for p in points),
            # under the goal and clearly beaten: a planner miss, not the best-of-noise bias
            "points_missed": sum(bool(p.get("best_clearly_faster")) and p["planned_over_best"] is not None
                                 and p["planned_over_best"] < GOAL for p in points),
            "beats_every_peer": all(r >= 1 for r in over_peers) if over_peers else None,
            "runs_loaded": [sum(c.get("loaded", [0, 0])[i] for p in points for c in p["configs"]) for i in (0, 1)]}


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"workloads": [f"{m}:{s}:{b}" for m, s, b in args.workloads], "world": args.world, "dtype": args.dtype,
            "grid": args.grid, "repeats": args.repeats, "steps": args.steps, "warmup": args.warmup,
            "threads": args.threads, "bind_cores": args.bind_cores, "device": args.device,
            "hardware": str(args.hardware), "peers": args.peers, "retry_loaded": args.retry_loaded}


def load_previous(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """A partial result of the same settings to resume; None if there is none. Only `repeats` may differ (more
    extends a finished run, fewer finishes a long one early); other settings are an error (resuming would mix
    two experiments)."""
    from superoffload.harness.record import read_result

    if not path.exists():
        return None
    prev = read_result(path, SCHEMA_KIND)
    differ = sorted(k for k in settings if k not in ("repeats", "retry_loaded")
                    and prev["settings"].get(k, settings[k] if k == "retry_loaded" else None) != settings[k])
    if differ:
        raise ValueError(f"{path} holds a run with other settings ({', '.join(differ)}); pass another --out or "
                         "delete it (only --repeats may change on a resume)")
    return prev


def write(path: Path, result: dict[str, Any]) -> None:
    from superoffload.harness.record import write_result

    write_result(path, result, SCHEMA_KIND)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from superoffload.harness import provenance

    settings = settings_of(args)
    prev = load_previous(args.out, settings)
    points, hw = build_points(args)
    if prev is not None:  # keep what was measured; the plan and the predictions are made again (same code)
        old = {(p["id"], c["label"]): c for p in prev["points"] for c in p["configs"]}
        for p in points:
            for c in p["configs"]:
                if (p["id"], c["label"]) in old:
                    c["tokens_per_s"] = old[(p["id"], c["label"])]["tokens_per_s"]
                    c["errors"] = old[(p["id"], c["label"])]["errors"]
                    c["loaded"] = old[(p["id"], c["label"])].get("loaded", [0, 0])
    result: dict[str, Any] = {
        "kind": SCHEMA_KIND, "schema_version": 1, "complete": False, "settings": settings,
        "hardware": {"name": hw.name, "source": hw.source, "collectives": sorted(hw.collectives or {})},
        "provenance": provenance.collect(args.device), "points": points,
    }
    jobs = [(p, c) for p in points for c in p["configs"]]
    for r in range(args.repeats):
        shift = (r * 7) % max(1, len(jobs))  # rotate the order per repeat
        for p, c in jobs[shift:] + jobs[:shift]:
            if len(c["tokens_per_s"]) + len(c["errors"]) > r:
                continue  # measured before an interruption
            tps, err = run_one(p, c, args)
            (c["tokens_per_s"].append(tps) if tps is not None else c["errors"].append(err))
            print(f"repeat {r}: {p['id']} {c['label']}: " + (f"{tps:,.0f} tokens/s" if tps else f"failed: {err}"),
                  flush=True)
            for q in points:
                summarize_point(q)
            result.update(summary=summary(points),
                          created_utc=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
            write(args.out, result)
    for q in points:
        summarize_point(q)
    result.update(complete=True, summary=summary(points),
                  created_utc=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    write(args.out, result)
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"{'point':<32} {'planned':>9} {'best':>9} {'best is':<12} {'planned/best':>12} {'paired':>7} "
             f"{'clearly':>7} {'sign p':>6} {'rank rho':>8}  peers"]
    for p in result["points"]:
        planned = next(c for c in p["configs"] if c["label"] == "planned")
        best = next((c for c in p["configs"] if c["label"] == p["best_label"]), None)

        def f(x: float | None) -> str:
            return f"{x:,.0f}" if x else "-"

        rho = "-" if p["rank_correlation"] is None else f"{p['rank_correlation']:+.2f}"
        ratio = "-" if p["planned_over_best"] is None else f"{p['planned_over_best']:.3f}"
        pair = "-" if p.get("best_paired_ratio") is None else f"{p['best_paired_ratio']:.3f}"
        sign = "-" if p.get("best_sign_p") is None else f"{p['best_sign_p']:.3f}"
        peers = ", ".join(f"{k} x{v:.2f}" for k, v in p["planned_over_peers"].items())
        lines.append(f"{p['id']:<32} {f(planned['median_tokens_per_s']):>9} "
                     f"{f(best['median_tokens_per_s'] if best else None):>9} {p['best_label'] or '-':<12} "
                     f"{ratio:>12} {pair:>7} {'yes' if p.get('best_clearly_faster') else '':>7} {sign:>6} "
                     f"{rho:>8}  {peers}")
        for m in p.get("run_plan_mismatch") or []:
            lines.append(f"    the run's own plan differs: {m}")
    s = result["summary"]
    lines.append(f"planned >= {s['goal']} of the best at {s['points_meeting_goal']} of {s['points_measured']} "
                 f"points (min {s['min_planned_over_best'] or 0:.3f}); another configuration clearly faster (its "
                 f"slowest repeat above the plan's fastest) at {s['points_clearly_beaten']}, of them under the goal "
                 f"(a planner miss) at {s.get('points_missed', 0)}"
                 + ("" if s["beats_every_peer"] is None else f"; beats every peer: {s['beats_every_peer']}")
                 + (f"; runs on a loaded machine: {s['runs_loaded'][0]} run again, {s['runs_loaded'][1]} kept"
                    if "runs_loaded" in s else ""))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="result JSON (plan_optimality.schema.json); resumed")
    p.add_argument("--hardware", default="cpu",
                   help="profile the plans are made on and every run is given: a preset or a calibrate JSON "
                        "(default cpu)")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                   help=f"MODEL:SEQ[:BATCH],... (default {DEFAULT_WORKLOADS})")
    p.add_argument("--batch", type=int, default=2, help="micro-batch where a workload names none (default 2)")
    p.add_argument("--world", default="1,2", help="ranks per point, comma-separated (default 1,2)")
    p.add_argument("--dtype", default="fp32,bf16", help="precisions, comma-separated (default fp32,bf16)")
    p.add_argument("--grid", default="all", help=f"configurations: all, or some of {','.join(GRID)}")
    p.add_argument("--peers", default="", help="peer systems to run at each point, e.g. torch,zero_offload")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="compute threads per rank (default 1; 0: torch's)")
    p.add_argument("--bind-cores", action="store_true", help="bench run --bind-cores for several ranks")
    p.add_argument("--device", default="auto")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    p.add_argument("--retry-loaded", type=int, default=0,
                   help="run a configuration again, up to this many times, when its record flags the machine as loaded "
                        "by other processes (default 0: keep every run; the result counts the loaded ones)")
    a = p.parse_args(argv)
    a.workloads = parse_workloads(a.workloads, a.batch)
    a.world = [int(x) for x in a.world.split(",") if x]
    a.dtype = [x for x in a.dtype.split(",") if x]
    a.grid = list(GRID) if a.grid == "all" else [x for x in a.grid.split(",") if x]
    a.peers = [x for x in a.peers.split(",") if x]
    bad = [g for g in a.grid if g not in GRID]
    if bad or "planned" not in a.grid:
        raise ValueError(f"--grid: {', '.join(bad) or 'planned missing'}; choose from {', '.join(GRID)} "
                         "(planned is required: it is what the others are compared with)")
    if any(w < 1 for w in a.world) or any(d not in ("fp32", "bf16", "fp16") for d in a.dtype):
        raise ValueError("--world takes positive integers and --dtype fp32, bf16 or fp16")
    if min(a.repeats, a.steps) < 1 or a.warmup < 0 or a.retry_loaded < 0:
        raise ValueError("--repeats and --steps must be >= 1, --warmup and --retry-loaded >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        result = run(args)
    except ValueError as e:
        print(f"plan_optimality: error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
