"""The collectives the engine issues, measured on the process group it will run with.

`superoffload calibrate --collectives W` starts W ranks on this host (gloo on 127.0.0.1 without CUDA; NCCL,
one GPU per rank, with at least W GPUs) and times, at the sizes and in the dtypes the engine issues (fp32, and
bf16 for the training precision's reductions: `dtypes`), a reduce-scatter, an all-gather and an all-reduce
(SUM, as the engine does): each time is the best of `repeats`, of the slowest rank (a collective ends when its
last rank does). It also times the same small all-gather issued from a
second thread on a group of its own, the way the engine's host worker issues the weights' all-gathers: the
difference is the cost of issuing from the worker (`worker_issue_s`). On CPUs (gloo) it measures what an
all-reduce left in flight costs the compute beside it on the same cores (`compute_share`, `_compute_share`),
and what one more call costs beyond the bytes it moves when a rank computes beside it (`call_overhead`,
`_call_overhead`): the cost of cutting a gradient into more buckets.
Each rank is bound to its slice of this host's cores, the slice `bench run --bind-cores` gives it (harness/
placement.py): a rank of a run computes on its cores, so its collectives' threads find no idle core to borrow
(`cores_per_rank`; unbound when the host has fewer cores than ranks, or with `--unbound`).
The profile keeps, for the "intra"
link class (ranks of one node), the measured curve per kind and its fit (latency per ring step, bandwidth
per rank: planner/hardware.py `fit_collective`); the cost model then uses them instead of the preset's
link numbers (docs/cost_model.md, "Collectives").

Across nodes ("inter"), the ranks are started by the cluster's launcher instead, one per chip, and rank 0
adds the measurement to an existing profile:

    srun --nodes 2 --ntasks-per-node 4 python -m superoffload.calibrate.collectives --launched --profile hw.json

(or torchrun on each node). A launched rank reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (torchrun's) or
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID with MASTER_ADDR / MASTER_PORT set by the job script. The link class
is "inter" when the ranks are on more than one host, else "intra".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from superoffload.planner.hardware import COLLECTIVES, fit_collective

SIZES = [4 << 10 << 2 * i for i in range(8)]  # 4 KiB .. 64 MiB, factors of 4
QUICK_SIZES = SIZES[:5]  # .. 1 MiB


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(world: int = 2, quick: bool = False, repeats: int | None = None, timeout_s: float = 300.0,
            bind: bool = True) -> dict:
    """The "intra" measurement for `world` ranks of this host (see the module docstring); `bind`: each rank on its
    slice of the cores."""
    if world < 2:
        raise ValueError(f"--collectives needs at least 2 ranks, got {world}")
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    backend = "nccl" if cuda else "gloo"
    sizes = QUICK_SIZES if quick else SIZES
    repeats = repeats or (3 if quick else 5)
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "collectives.json"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env["OMP_NUM_THREADS"] = "1"
        procs = [subprocess.Popen([sys.executable, "-m", "superoffload.calibrate.collectives", "--rank", str(r),
                                   "--world", str(world), "--port", str(port), "--backend", backend, "--out",
                                   str(out), "--repeats", str(repeats), "--sizes", ",".join(map(str, sizes))]
                                  + ([] if bind else ["--unbound"]) + (["--quick"] if quick else []),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        deadline = time.monotonic() + timeout_s
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"measuring collectives on {world} ranks timed out after {timeout_s:.0f} s") \
                    from None
        if any(p.returncode for p in procs) or not out.exists():
            raise RuntimeError("measuring collectives failed:\n" + "\n".join(log[-1500:] for log in logs))
        return json.loads(out.read_text())


def _slowest(seconds: float, device: torch.device | None = None) -> float:
    """The largest of every rank's `seconds` (a collective ends when its last rank does)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time(fn: Any, repeats: int, device: torch.device) -> float:
    """Best of `repeats` of the slowest rank."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return _slowest(best, device)


def _compute_share(repeats: int) -> float:
    """Seconds of compute lost per second of all-reduces left in flight beside it on the same cores (gloo runs a
    collective on threads of the rank's process): what a rank without a core to spare pays for the reductions
    the engine leaves in flight during backward. A small MLP's forward and backward alone (t_c), a batch of K
    4 MiB all-reduces alone (t_ar, K chosen so it lasts about half of t_c), and the batch issued asynchronously
    then the compute, then the wait (t_both): share = (t_both - t_c) / t_ar, clipped to [0, 1], the median over
    alternated triples of the slowest rank. 1: the collectives' time all lands on the compute (nothing hides);
    0: they run entirely in the gaps (waiting for the peer and the loopback)."""
    from superoffload.calibrate.compute import mlp_step_timer

    compute = mlp_step_timer(256, 8)
    bufs = [torch.ones(1 << 20) for _ in range(16)]

    def reduce(k: int) -> list[Any]:
        return [dist.all_reduce(b, async_op=True) for b in bufs[:k]]

    compute()
    t_c = _slowest(compute())
    dist.barrier()
    t0 = time.perf_counter()
    for w in reduce(1):
        w.wait()
    k = torch.tensor([max(1, min(len(bufs), int(0.5 * t_c / max(time.perf_counter() - t0, 1e-6))))])
    dist.all_reduce(k, op=dist.ReduceOp.MIN)  # every rank issues the same batch
    batch = int(k.item())
    shares = []
    for _ in range(max(3, repeats)):
        dist.barrier()
        t_c = _slowest(compute())
        dist.barrier()
        t0 = time.perf_counter()
        for w in reduce(batch):
            w.wait()
        t_ar = _slowest(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        works = reduce(batch)
        compute()
        for w in works:
            w.wait()
        t_both = _slowest(time.perf_counter() - t0)
        shares.append(min(1.0, max(0.0, (t_both - t_c) / t_ar)))
    return sorted(shares)[len(shares) // 2]


CALL_COUNTS, QUICK_CALL_COUNTS = (2, 4, 8, 16, 32), (2, 8, 32)
CALL_TOTAL_BYTES, QUICK_CALL_TOTAL_BYTES = 32 << 20, 8 << 20  # a backward's gradient, cut into that many calls
CALL_COMPUTE_CHUNKS = 32  # backward's compute between the launches: a call after every 32 / K chunks


def _call_overhead(repeats: int, quick: bool) -> dict[str, Any]:
    """What one more all-reduce costs a rank that computes beside it, beyond its bytes: a gradient's worth of
    bytes (`total_bytes`, fp32, distinct buffers) all-reduced as K calls issued between chunks of compute, the
    way backward launches its buckets, then waited for, against the compute alone. `seconds[i]`: that time for
    `counts[i]` calls, the slowest rank's, the median of 2 x `repeats` - 1 (the counts interleaved in each);
    `slope_s`: its least-squares slope in K, seconds per call. The curve's own per-call cost (`_write_result`
    takes off what K calls of total/K bytes cost on the measured all-reduce curve) leaves `per_call_s`: what the
    cost model adds per collective a rank issues beside its compute (docs/cost_model.md, "Collectives")."""
    from superoffload.calibrate.compute import mlp_step_timer

    counts = QUICK_CALL_COUNTS if quick else CALL_COUNTS
    total = QUICK_CALL_TOTAL_BYTES if quick else CALL_TOTAL_BYTES
    compute = mlp_step_timer(128, 1)
    bufs = {k: [torch.ones(total // 4 // k) for _ in range(k)] for k in counts}

    def backward(k: int | None) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        works = []
        for c in range(CALL_COMPUTE_CHUNKS):
            compute()
            if k is not None and (c + 1) % (CALL_COMPUTE_CHUNKS // k) == 0:
                works.append(dist.all_reduce(bufs[k][len(works)], async_op=True))
        for w in works:
            w.wait()
        return _slowest(time.perf_counter() - t0)

    backward(counts[-1])  # warm: the buffers touched, gloo's pairs connected
    alone: list[float] = []
    seconds: dict[int, list[float]] = {k: [] for k in counts}
    for _ in range(2 * repeats - 1):  # more than the curve's: each point's noise is a few % of a backward
        alone.append(backward(None))
        for k in counts:
            seconds[k].append(backward(k))
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {"counts": list(counts), "total_bytes": total, "compute_s": statistics.median(alone),
            "seconds": [med[k] for k in counts],
            "slope_s": statistics.linear_regression(counts, [med[k] for k in counts]).slope}


def call_overhead_net_of_curve(call: dict[str, Any], measured: dict[str, Any]) -> float:
    """`per_call_s`: the measured slope per call less the slope of what the measured all-reduce curve charges
    for the same calls (K calls of total/K bytes each), at least 0."""
    from superoffload.planner.hardware import measured_collective_seconds

    counts, total = call["counts"], call["total_bytes"]
    curve = [k * measured_collective_seconds(measured, "all_reduce", total / k, measured["world"]) for k in counts]
    return max(0.0, call["slope_s"] - statistics.linear_regression(counts, curve).slope)


def link_class(hostnames: list[str]) -> str:
    """"inter" when the ranks span more than one host, else "intra" (HardwareProfile.collectives' keys)."""
    return "inter" if len(set(hostnames)) > 1 else "intra"


def launched_rank() -> tuple[int, int, int]:
    """(rank, world, local rank) of a rank started by torchrun or srun; ValueError naming what is missing."""
    env = os.environ
    rank = env.get("RANK", env.get("SLURM_PROCID"))
    world = env.get("WORLD_SIZE", env.get("SLURM_NTASKS"))
    local = env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    missing = [k for k, v in (("RANK or SLURM_PROCID", rank), ("WORLD_SIZE or SLURM_NTASKS", world),
                              ("MASTER_ADDR", env.get("MASTER_ADDR")), ("MASTER_PORT", env.get("MASTER_PORT")))
               if not v]
    if missing:
        raise ValueError(f"--launched needs the launcher's rank variables; missing: {', '.join(missing)} (start it "
                         "with torchrun, or with srun and MASTER_ADDR / MASTER_PORT exported by the job script)")
    return int(rank), int(world), int(local)  # type: ignore[arg-type]


def _rank(a: argparse.Namespace) -> None:
    if a.launched:
        a.rank, a.world, local = launched_rank()
        if a.world < 2:
            raise ValueError(f"--launched needs at least 2 ranks, got WORLD_SIZE {a.world}")
        a.backend = a.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        init = "env://"
        os.environ.setdefault("RANK", str(a.rank))
        os.environ.setdefault("WORLD_SIZE", str(a.world))
    else:
        local, init = a.rank, f"tcp://127.0.0.1:{a.port}"
    cores = _bind(local, a) if not a.unbound else None
    dist.init_process_group(a.backend, init_method=init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=120))
    device = torch.device("cuda", local) if a.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sizes = [int(x) for x in a.sizes.split(",")]
    seconds: dict[str, list[float]] = {k: [] for k in COLLECTIVES}
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    # the engine reduces and gathers in fp32 or in the training precision (grad_cast: host): each dtype's curve,
    # at the same byte sizes (a backend's reduction speed per byte depends on the dtype: gloo sums bf16 slower)
    by_dtype: dict[str, dict[str, list[float]]] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        secs: dict[str, list[float]] = {k: [] for k in COLLECTIVES}
        for n in sizes:
            size = torch.empty((), dtype=dtype).element_size()
            elems = max(a.world, n // size // a.world * a.world)  # a multiple of the world (the engine pads)
            full = torch.ones(elems, device=device, dtype=dtype)
            part = torch.empty(elems // a.world, device=device, dtype=dtype)
            secs["reduce_scatter"].append(_time(lambda full=full, part=part: rs(part, full, op=dist.ReduceOp.SUM),
                                                a.repeats, device))
            secs["all_gather"].append(_time(lambda full=full, part=part: ag(full, part), a.repeats, device))
            secs["all_reduce"].append(_time(lambda full=full: dist.all_reduce(full), a.repeats, device))
        by_dtype[name] = secs
    seconds.update(by_dtype.pop("fp32"))
    # the engine's host worker issues the weights' all-gathers from its own thread, on a group of its own
    worker_group = dist.new_group(list(range(a.world)))
    small = torch.ones(1024 * a.world, device=device)
    small_part = torch.empty(1024, device=device)
    main_t = _time(lambda: ag(small, small_part), a.repeats * 2, device)
    box: list[float] = []

    def from_thread() -> None:
        best = float("inf")
        for _ in range(a.repeats * 2):
            t0 = time.perf_counter()
            ag(small, small_part, group=worker_group, async_op=True).wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        box.append(best)

    dist.barrier()
    th = threading.Thread(target=from_thread)
    th.start()
    th.join()
    worker_t = _slowest(box[0], device)
    hosts: list[Any] = [None] * a.world
    dist.all_gather_object(hosts, socket.gethostname())
    slices: list[Any] = [None] * a.world
    dist.all_gather_object(slices, cores)
    share = _compute_share(a.repeats) if device.type == "cpu" else None
    call = _call_overhead(a.repeats, a.quick) if device.type == "cpu" else None
    if a.rank == 0:
        _write_result(a, sizes, seconds, by_dtype, max(0.0, worker_t - main_t), hosts, share, call,
                      slices)
    dist.destroy_process_group()


def _bind(local: int, a: argparse.Namespace) -> list[int] | None:
    """Bind this rank to its slice of the host's cores, as `bench run --bind-cores` does (the ranks of this host:
    all of them, or the launcher's LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE); the cores, or None when not bound
    (a launcher that does not say how many ranks share the host, or fewer cores than ranks)."""
    from superoffload.harness.placement import bind_this_rank

    if a.launched:
        per_host = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "")
        if not per_host.isdigit():
            return None
        local_world = int(per_host)
    else:
        local_world = a.world
    try:
        return bind_this_rank(local_rank=local, local_world=local_world).cores
    except ValueError:  # fewer cores than ranks: they share them
        return None


def _write_result(a: argparse.Namespace, sizes: list[int], seconds: dict[str, list[float]],
                  by_dtype: dict[str, dict[str, list[float]]], worker_issue_s: float, hosts: list[Any],
                  compute_share: float | None = None, call: dict[str, Any] | None = None,
                  slices: list[Any] | None = None) -> None:
    """Rank 0: fit each collective's latency and bandwidth (fp32, and each other dtype's curve) and write them
    into --profile, else to --out."""
    fits = {k: fit_collective(sizes, seconds[k], a.world) for k in COLLECTIVES}
    half = {}
    for name, secs in by_dtype.items():
        f2 = {k: fit_collective(sizes, secs[k], a.world) for k in COLLECTIVES}
        half[name] = {"seconds": secs, "latency_s": {k: f[0] for k, f in f2.items()},
                      "gbps": {k: f[1] for k, f in f2.items()}}
    out = {"backend": a.backend, "world": a.world, "sizes": sizes, "seconds": seconds,
           "latency_s": {k: f[0] for k, f in fits.items()}, "gbps": {k: f[1] for k, f in fits.items()},
           "dtypes": half,
           "worker_issue_s": worker_issue_s, "compute_share": compute_share, "host": socket.gethostname(),
           "hosts": len(set(hosts)), "link_class": link_class(hosts),
           "rank_cores": slices, "cores_per_rank": min(len(c) for c in slices) if slices and all(slices) else None,
           "measured_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    if call is not None:
        out["call_overhead"] = {**call, "per_call_s": call_overhead_net_of_curve(call, out)}
    if a.profile:
        add_to_profile(a.profile, out)
    else:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, a.out)


def add_to_profile(path: str | os.PathLike[str], measured: dict[str, Any]) -> None:
    """Store a measurement in the profile at `path` under its link class (atomically; the other class kept)."""
    from superoffload.planner.hardware import HardwareProfile

    prof = HardwareProfile.load(path)
    cls = measured["link_class"]
    prof.collectives = {**(prof.collectives or {}), cls: measured}
    if cls == "inter":
        # the ranks per node of this measurement: a ring of more ranks than that leaves the node
        prof.chips_per_node = max(1, measured["world"] // max(1, measured["hosts"]))
    prof.notes.append(f"collectives ({cls}) on {measured['world']} {measured['backend']} ranks over "
                      f"{measured['hosts']} host(s), measured {measured['measured_utc']}")
    prof.save(path)


def main() -> None:
    p = argparse.ArgumentParser(description="one rank of `superoffload calibrate --collectives W`, or (--launched) "
                                "one rank of a measurement started by torchrun / srun, possibly across nodes")
    p.add_argument("--launched", action="store_true",
                   help="take rank and world from the launcher's environment (RANK/WORLD_SIZE or SLURM_*)")
    p.add_argument("--profile", default=None,
                   help="with --launched: the calibrate profile JSON that rank 0 adds the measurement to")
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--port", type=int)
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    p.add_argument("--out")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--quick", action="store_true", help="fewer call counts and bytes for the per-call overhead")
    p.add_argument("--unbound", action="store_true",
                   help="leave the ranks unbound (default: each on its slice of this host's cores, as "
                        "`bench run --bind-cores` places them)")
    a = p.parse_args()
    if a.launched:
        if not a.profile or not Path(a.profile).is_file():
            p.error("--launched needs --profile PATH, an existing profile written by `superoffload calibrate`")
    elif None in (a.rank, a.world, a.port, a.backend, a.out):
        p.error("without --launched: --rank, --world, --port, --backend and --out are required "
                "(`superoffload calibrate --collectives W` passes them)")
    torch.set_num_threads(1)
    try:
        _rank(a)
    except ValueError as e:
        print(f"superoffload.calibrate.collectives: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
