"""`superoffload bench adam`: the fused GraceAdam host step against torch and DeepSpeed, same process.

Per (numel, threads), every kernel works on the SAME fp32 buffers (p, g, m, v), and the kernels are
measured in interleaved rounds (one call of each per round; medians over rounds), so buffer placement
and machine drift hit all of them alike. Kernels: GraceAdam (`grace_adam.adam_step`), torch fused AdamW,
torch foreach AdamW, DeepSpeedCPUAdam, and a 7-stream roofline (the native `ga_stream7`: read 4 fp32
streams, write 3, i.e. Adam's memory traffic with trivial arithmetic, same threads and partitioning),
reported as s/step (median, IQR), GB/s at 28 B/param, % of roofline, ratio to the best of torch fused /
DeepSpeed.

Then the whole host phase of one bucket, in two groups, each against the fastest equivalent sequence of
separate operations (torch fused or DeepSpeedCPUAdam):
- speculative (the step runs before validation, so it must be undoable exactly): grad statistics + Adam
  + bf16 upload copy + a way back. GraceAdam: `grace_double_buffer` (one pass: statistics fused, the new
  state written to a second buffer set, commit = swap) and `grace_deferred_commit` (a speculative pass
  with fused statistics writing only the bf16 copy, then the commit pass). Separate: norm, snapshot of
  p/m/v (the undo record), step, bf16 cast.
- validate_first (statistics first, then the step; nothing to undo): GraceAdam `grace_validate_first`
  (statistics pass, then one step writing bf16) vs norm, step, bf16 cast.
The finite flag of a separate sequence is taken from the norm (inf/nan iff some element is): an
elementwise `isfinite(...).all()` would make the separate sequence several times slower.

Each thread count runs in its own subprocess with OMP_NUM_THREADS set, because DeepSpeedCPUAdam's
OpenMP team size is fixed when its library loads, and with OMP_WAIT_POLICY=PASSIVE unless the caller
set it: by default libgomp's idle threads spin after every torch / DeepSpeed parallel region and take
the cores GraceAdam's own thread pool (or the next OpenMP region) needs (docs/results.md, "GraceAdam",
has the size of that effect).

Thread scaling (`--threads 1,2,4,8,16`): after the full table, one line per (numel, threads) with
GraceAdam's, torch fused's and DeepSpeed's GB/s and GraceAdam's ratio to the best of the two. A thread
count above the CPUs this process may use is run anyway and marked oversubscribed: the kernels then
time-share cores, which measures how each copes with that (GraceAdam's pool balances the work across
its threads, `docs/grace_adam.md`), not the memory system. `--pin` pins GraceAdam's pool to the first
N CPUs of the affinity mask (`grace_adam.set_affinity`; torch's and DeepSpeed's OpenMP threads are left
as they are); `--first-touch` allocates the shared buffers with `grace_adam.pool.zeros`, so their pages
are first written by GraceAdam's threads in the split its pass uses (on a NUMA host, on their nodes).
The header and the record (`grace_division`) say how GraceAdam divided by sqrt(1 - beta2^t): through the
reciprocal (its SIMD paths, where proven exact) or the divide instruction only; `GRACE_ADAM_DIV=divide
superoffload bench adam ...` runs the second, for an A/B (the same bits either way, docs/grace_adam.md);
likewise `grace_prefetch`, GraceAdam's software prefetch distance on x86 (`GRACE_ADAM_PREFETCH=0`: none).

The first run on a machine JIT-builds DeepSpeed's CPU Adam op (~1-2 min, cached in
TORCH_EXTENSIONS_DIR); a line says so first (superoffload/ds_build.py). The output is one JSON
file following superoffload/harness/adam_bench.schema.json, validated before it is written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

BYTES_PER_PARAM = 28  # read p, g, m, v; write p, m, v (fp32)
DEFAULT_NUMELS = [4 << 20]
HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _parse_numel(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        return int(float(text[:-1] if mult > 1 else text) * mult)
    except ValueError:
        raise ValueError(f"bad element count {text!r}: use an integer with an optional K/M/G suffix") from None


def _time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, dict]:
    """Run every function once per round, `warmup` + `repeats` rounds; summarize the timed rounds."""
    from superoffload.harness.stats import summarize

    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {k: summarize(v) for k, v in times.items()}


def _state(numel: int, seed: int = 0, place_threads: int | None = None) -> list:
    """p, g, m, v with magnitudes of a model a few steps into training. With ``place_threads``, the
    buffers' pages are first written by GraceAdam's pool in its pass's split (grace_adam.pool.zeros)."""
    import torch

    from grace_adam.pool import zeros

    gen = torch.Generator().manual_seed(seed)
    bufs = [zeros(numel, threads=place_threads) if place_threads else torch.empty(numel) for _ in range(4)]
    p, g, m, v = bufs
    p.normal_(generator=gen)
    g.normal_(generator=gen).mul_(1e-2)
    m.normal_(generator=gen).mul_(1e-3)
    v.uniform_(generator=gen).mul_(1e-6)
    return bufs


def pin_cpus(threads: int) -> list[int]:
    """The CPUs `--pin` gives GraceAdam's pool at ``threads``: the first ones of the affinity mask, wrapping
    around when there are fewer CPUs than threads."""
    mask = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return [mask[k % len(mask)] for k in range(threads)]


def _measure_one(numel: int, threads: int, repeats: int, first_touch: bool = False) -> dict[str, Any]:
    """All kernels at one size and thread count, in this process, on one set of buffers."""
    import torch

    import grace_adam

    torch.set_num_threads(threads)
    p, g, m, v = _state(numel, place_threads=threads if first_touch else None)
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    res: dict[str, Any] = {"numel": numel, "threads": threads, "kernels": {}, "host_phase": {}, "skipped": {}}
    step = [1]
    hyper = dict(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, threads=threads)

    def grace() -> None:
        step[0] += 1
        grace_adam.adam_step(p, g, m, v, step=step[0], **hyper)

    # torch and DeepSpeed step the very same tensors: the parameter shares p's storage, the state is m, v
    q = torch.nn.Parameter(p)
    q.grad = g

    def torch_opt(**kw: Any) -> torch.optim.Optimizer:
        opt = torch.optim.AdamW([q], **HYPER, **kw)
        opt.state[q] = {"step": torch.tensor(1.0), "exp_avg": m, "exp_avg_sq": v}
        return opt

    zero = torch.zeros(numel)  # roofline: p += 0, m += 0, v += 0 leaves the state as it is
    kernels: dict[str, Callable[[], Any]] = {
        "grace_adam": grace,
        "roofline_stream7": lambda: grace_adam.functional.stream7(p, zero, m, v, threads=threads),
        "torch_fused": torch_opt(fused=True).step,
        "torch_foreach": torch_opt(foreach=True).step,
    }
    ds_step = None
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        ds_opt = DeepSpeedCPUAdam([q], **HYPER, adamw_mode=True)
        ds_opt.state[q] = {"step": 1, "exp_avg": m, "exp_avg_sq": v}
        ds_step = kernels["deepspeed_cpu_adam"] = ds_opt.step
    except Exception as exc:  # noqa: BLE001 - any build/load failure is a recorded skip
        res["skipped"]["deepspeed_cpu_adam"] = f"{type(exc).__name__}: {exc}"
    res["kernels"] = _time_interleaved(kernels, repeats)
    res["host_phase"] = _host_phase(p, g, m, v, q, kernels["torch_fused"], ds_step, step, hyper, repeats)
    return res


def _host_phase(p, g, m, v, q, fused_step, ds_step, step: list[int], hyper: dict, repeats: int) -> dict:
    """One bucket's whole host phase, GraceAdam vs separate ops, grouped as in the module docstring."""
    import torch

    import grace_adam

    n = p.numel()
    lowp = torch.empty(n, dtype=torch.bfloat16)
    cur = [p, m, v]
    spare = [torch.empty(n) for _ in range(3)]

    def grace_double_buffer() -> None:
        step[0] += 1
        grace_adam.adam_step(cur[0], g, cur[1], cur[2], step=step[0], commit=False, param_out=spare[0],
                             exp_avg_out=spare[1], exp_avg_sq_out=spare[2], lowp_out=lowp, return_stats=True,
                             **hyper)
        cur[:], spare[:] = spare[:], cur[:]  # validation passed: commit is a swap

    def grace_deferred_commit() -> None:
        step[0] += 1
        kw = dict(step=step[0], **hyper)
        grace_adam.adam_step(cur[0], g, cur[1], cur[2], commit=False, lowp_out=lowp, return_stats=True, **kw)
        grace_adam.adam_step(cur[0], g, cur[1], cur[2], commit=True, **kw)

    def grace_validate_first() -> None:
        step[0] += 1
        grace_adam.grad_stats(g, threads=hyper["threads"])
        grace_adam.adam_step(cur[0], g, cur[1], cur[2], step=step[0], lowp_out=lowp, **hyper)

    undo = [torch.empty(n) for _ in range(3)]

    def separate(step_fn: Callable[[], Any], with_undo: bool) -> Callable[[], None]:
        def run() -> None:
            norm = torch.linalg.vector_norm(q.grad)
            _ = float(norm), bool(torch.isfinite(norm))
            if with_undo:
                for dst, src in zip(undo, (p, m, v), strict=True):
                    dst.copy_(src)
            step_fn()
            lowp.copy_(q.detach())
        return run

    fns: dict[str, Callable[[], Any]] = {
        "grace_double_buffer": grace_double_buffer,
        "grace_deferred_commit": grace_deferred_commit,
        "torch_fused_separate_undo": separate(fused_step, True),
        "grace_validate_first": grace_validate_first,
        "torch_fused_separate": separate(fused_step, False),
    }
    if ds_step is not None:
        fns["deepspeed_separate_undo"] = separate(ds_step, True)
        fns["deepspeed_separate"] = separate(ds_step, False)
    out = _time_interleaved(fns, repeats)
    for name, st in out.items():
        st["group"] = "speculative" if ("undo" in name or name in SPECULATIVE_GRACE) else "validate_first"
    return out


SPECULATIVE_GRACE = ("grace_double_buffer", "grace_deferred_commit")


def _derive(rec: dict[str, Any]) -> None:
    """Add GB/s, % of roofline and ratios to each measurement."""
    for r in rec["measurements"]:
        n, ks = r["numel"], r["kernels"]
        roof = BYTES_PER_PARAM * n / ks["roofline_stream7"]["median_s"] / 1e9
        best = min(ks[k]["median_s"] for k in ("torch_fused", "deepspeed_cpu_adam") if k in ks)
        for k in ks.values():
            k["gb_per_s"] = BYTES_PER_PARAM * n / k["median_s"] / 1e9
            k["pct_roofline"] = 100.0 * k["gb_per_s"] / roof
            k["speedup_vs_best_peer"] = best / k["median_s"]
        hp = r["host_phase"]
        for group in {h["group"] for h in hp.values()}:
            members = {k: h for k, h in hp.items() if h["group"] == group}
            # the fastest separate-op sequence with the same guarantees (undo record or not)
            base = min(h["median_s"] for k, h in members.items() if k.startswith(("torch_", "deepspeed_")))
            for h in members.values():
                h["speedup_vs_best_separate"] = base / h["median_s"]


def format_table(rec: dict[str, Any]) -> str:
    lines = [f"{'numel':>10} {'thr':>3} {'kernel':<36} {'median s':>10} {'IQR s':>9} {'GB/s':>7} "
             f"{'%roof':>6} {'vs best':>8}"]
    for r in rec["measurements"]:
        host = [(f"host:{h['group']}:{n}", h) for n, h in sorted(r["host_phase"].items(), key=lambda x: x[1]["group"])]
        for name, k in list(r["kernels"].items()) + host:
            gbs = f"{k['gb_per_s']:7.1f}" if "gb_per_s" in k else f"{'':>7}"
            pct = f"{k['pct_roofline']:6.1f}" if "pct_roofline" in k else f"{'':>6}"
            ratio = k.get("speedup_vs_best_peer", k.get("speedup_vs_best_separate"))
            lines.append(f"{r['numel']:>10} {r['threads']:>3} {name:<36} {k['median_s']:>10.5f} "
                         f"{k['iqr_s']:>9.5f} {gbs} {pct} {ratio:>7.2f}x")
        for name, why in r["skipped"].items():
            lines.append(f"{r['numel']:>10} {r['threads']:>3} {name:<36} skipped: {why[:60]}")
    return "\n".join(lines)


def usable_cpus() -> int:
    """CPUs this process may run on: a thread count above it is oversubscribed."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run(numels: list[int], threads: list[int], repeats: int, out: str | None, pin: bool = False,
        first_touch: bool = False) -> dict[str, Any]:
    """Measure every size at every thread count (one subprocess per thread count); write one record."""
    import grace_adam
    from grace_adam import _backend
    from superoffload.harness.provenance import collect

    _prepare_deepspeed()
    measurements = []
    load_before = os.getloadavg()
    cpus = usable_cpus()
    for t in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), GRACE_ADAM_NUM_THREADS=str(t))
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        env.pop("GRACE_ADAM_CPUS", None)  # the pool's CPUs are this run's choice (--pin), not the caller's
        cmd = [sys.executable, "-m", "superoffload.harness.microbench.adam", "--worker",
               "--numel", ",".join(map(str, numels)), "--threads", str(t), "--repeats", str(repeats)]
        cmd += ["--pin"] * pin + ["--first-touch"] * first_touch
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark worker (threads={t}) failed:\n{proc.stderr[-4000:]}")
        for m in json.loads(proc.stdout.strip().splitlines()[-1]):
            measurements.append({**m, "oversubscribed": t > cpus})
    rec = {
        "kind": "adam_bench",
        "schema_version": 1,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "bytes_per_param": BYTES_PER_PARAM,
        "hyper": {k: list(v) if isinstance(v, tuple) else v for k, v in HYPER.items()},
        "grace_isa": grace_adam.isa(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "grace_native": grace_adam.native_available(),
        "grace_division": _backend.division_mode(),
        "grace_prefetch": _backend.get_prefetch(),
        "provenance": collect("cpu"),
        "usable_cpus": cpus,
        "first_touch": first_touch,
        # other processes on the machine make numbers noisy: keep the load average with them
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "measurements": measurements,
    }
    _derive(rec)
    if out:
        from superoffload.harness.record import write_result

        write_result(out, rec, "adam_bench")
    return rec


def _prepare_deepspeed() -> None:
    """Before the workers load DeepSpeedCPUAdam: say that its op will be built, clear a dead build's lock.
    Without DeepSpeed (or with a broken install) nothing is said here; the workers record the skip."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return
    from superoffload import ds_build

    try:
        ds_build.prepare_deepspeed_ops(("CPUAdamBuilder",))
    except Exception as exc:  # noqa: BLE001 - the worker's own import reports the failure as a skip
        print(f"superoffload bench adam: DeepSpeed's CPU Adam op not checked ({type(exc).__name__}: {exc})",
              file=sys.stderr)


def _csv_ints(text: str, parse: Callable[[str], int] = int) -> list[int]:
    return [parse(x) for x in text.split(",") if x.strip()]


def format_scaling(rec: dict[str, Any]) -> str:
    """One line per (numel, threads): GraceAdam's GB/s beside torch fused's and DeepSpeed's, and its ratio to
    the faster of the two; thread counts above the usable CPUs are marked."""
    cpus = rec.get("usable_cpus")
    pinned = all(r.get("grace_pinned") for r in rec["measurements"])
    lines = [f"GB/s at {rec['bytes_per_param']} B/param by thread count ({cpus} usable CPUs; GraceAdam pool "
             f"{'pinned' if pinned else 'not pinned'}, first touch "
             f"{'by its threads' if rec.get('first_touch') else 'serial'}"
             + (", divides through the reciprocal" if rec.get("grace_division") == "reciprocal" else "")
             + (", divide instruction only" if rec.get("grace_division") == "divide" else "")
             + (f", prefetch {rec['grace_prefetch']}" if "grace_prefetch" in rec else "") + ")",
             f"{'numel':>10} {'thr':>4} {'grace_adam':>10} {'torch_fused':>11} {'deepspeed':>10} {'grace/best':>10}"]
    for r in rec["measurements"]:
        ks = r["kernels"]
        ds = f"{ks['deepspeed_cpu_adam']['gb_per_s']:10.1f}" if "deepspeed_cpu_adam" in ks else f"{'skipped':>10}"
        mark = f"  oversubscribed ({r['threads']} threads > {cpus} CPUs)" if r.get("oversubscribed") else ""
        grace = ks["grace_adam"]
        lines.append(f"{r['numel']:>10} {r['threads']:>4} {grace['gb_per_s']:10.1f} "
                     f"{ks['torch_fused']['gb_per_s']:11.1f} {ds} {grace['speedup_vs_best_peer']:9.2f}x{mark}")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    try:
        numels = _csv_ints(args.numel, _parse_numel)
        threads = _csv_ints(args.threads)
    except ValueError as e:
        print(f"superoffload bench adam: error: {e}", file=sys.stderr)
        return 2
    if not numels or min(numels) < 1 or not threads or min(threads) < 1 or args.repeats < 1:
        print("superoffload bench adam: error: need --numel and --threads values >= 1 (e.g. --numel 16M,64M "
              "--threads 1,2) and --repeats >= 1", file=sys.stderr)
        return 2
    rec = run(numels, threads, args.repeats, args.out, pin=args.pin, first_touch=args.first_touch)
    print(format_table(rec))
    print()
    print(format_scaling(rec))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("adam", help="GraceAdam vs torch fused/foreach vs DeepSpeedCPUAdam",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", default=",".join(str(n) for n in DEFAULT_NUMELS),
                   help="comma-separated element counts, suffixes K/M/G allowed (default 4M)")
    p.add_argument("--threads", default="1",
                   help="comma-separated thread counts (default 1); counts above this machine's CPUs run anyway "
                        "and are marked oversubscribed")
    p.add_argument("--repeats", type=int, default=11,
                   help="timed rounds after one warm-up round; each round calls every kernel once (default 11)")
    p.add_argument("--out", default=None, help="write the JSON record here (atomically)")
    p.add_argument("--pin", action="store_true",
                   help="pin GraceAdam's pool to the first N CPUs of the affinity mask at N threads")
    p.add_argument("--first-touch", action="store_true",
                   help="allocate the buffers with grace_adam.pool.zeros (pages first written by GraceAdam's threads)")
    p.set_defaults(func=_main)


def _worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--numel", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--first-touch", action="store_true")
    a = ap.parse_args(argv)
    pinned = False
    if a.pin:
        import grace_adam

        pinned = grace_adam.set_affinity(pin_cpus(a.threads))  # False where the platform cannot pin
    out = [{**_measure_one(n, a.threads, a.repeats, a.first_touch), "grace_pinned": pinned}
           for n in _csv_ints(a.numel)]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(sys.argv[1:]))
