"""gloo's reduce-scatter against an all-reduce of the same buffer plus a slice copy, side by side: the
measurement behind `engine/comm.py` reducing host tensors on two ranks with an all-reduce.

    python benchmarks/gloo_reduce_scatter.py [--world 2] [--sizes-mib 0.25,1,4,16,64] [--repeats 7]

Starts `--world` processes on 127.0.0.1 (gloo, one torch thread each, a timeout on every collective),
and per size runs the two alternately `--repeats` times after a barrier, so both see the same machine.
Prints, per size, each one's median milliseconds and the ratio reduce-scatter / all-reduce, and checks
that the two give rank 0 the same slice bit for bit at two ranks (a + b is b + a).
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int, sizes: list[float], repeats: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        rows = []
        gen = torch.Generator().manual_seed(rank)
        for mib in sizes:
            n = max(world, int(mib * (1 << 20)) // 4 // world * world)
            grad = torch.randn(n, generator=gen)
            part = n // world
            out_rs, flat = torch.empty(part), torch.empty(n)
            out_ar = torch.empty(part)
            times: dict[str, list[float]] = {"reduce_scatter": [], "all_reduce": []}
            for _ in range(repeats):
                dist.barrier()
                t = time.perf_counter()
                dist.reduce_scatter_tensor(out_rs, grad)
                times["reduce_scatter"].append(time.perf_counter() - t)
                flat.copy_(grad)  # the engine's staging slot: the all-reduce overwrites it
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(flat)
                out_ar.copy_(flat[rank * part: (rank + 1) * part])
                times["all_reduce"].append(time.perf_counter() - t)
            rows.append((mib, statistics.median(times["reduce_scatter"]), statistics.median(times["all_reduce"]),
                         bool(torch.equal(out_rs, out_ar))))
        if rank == 0:
            queue.put(rows)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks on this host (default 2)")
    p.add_argument("--sizes-mib", default="0.25,1,4,16,64", help="fp32 buffer sizes in MiB (default 0.25,1,4,16,64)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved pairs per size (default 7)")
    a = p.parse_args()
    if a.world < 2:
        sys.exit("--world must be at least 2: one rank has nothing to reduce")
    sizes = [float(x) for x in a.sizes_mib.split(",")]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, a.world, port, sizes, a.repeats, queue)) for r in range(a.world)]
    for pr in procs:
        pr.start()
    rows = queue.get(timeout=1800)
    for pr in procs:
        pr.join(timeout=120)
    print(f"gloo, {a.world} ranks, fp32, median of {a.repeats} interleaved pairs")
    print(f"{'MiB':>6}  {'reduce-scatter ms':>17}  {'all-reduce + slice ms':>21}  {'ratio':>5}  same slice")
    for mib, rs, ar, same in rows:
        print(f"{mib:6g}  {rs * 1e3:17.2f}  {ar * 1e3:21.2f}  {rs / ar:5.2f}  {same if a.world == 2 else '-'}")


if __name__ == "__main__":
    main()
