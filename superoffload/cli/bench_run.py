"""`superoffload bench run`: one benchmark run -> one JSON record.

`--nproc N` runs the same command on N ranks of this host: it launches
`python -m torch.distributed.run --standalone --nproc_per_node N -m superoffload bench run ...` (the
same options without `--nproc`), waits, and makes sure a record exists afterwards (rank 0 writes it; if
the ranks died without one, an error record with the tail of their output is written here).

`--sp K` (with `--nproc N`, K dividing N; systems `superoffload` and `ulysses`) splits every sequence over K
consecutive ranks with Ulysses sequence parallelism: `--seq` is then the global sequence length and each
rank holds seq / K tokens of it; N / K data-parallel groups each train their own `--batch` sequences.
`--loss-tile T` and `--offload-checkpoints` add the sequence package's tiled loss and checkpoints in host
memory. Every bad combination is a one-line error (exit 2) before anything is launched.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys

from superoffload.harness.arguments import key_value, number
from superoffload.harness.system import RunConfig
from superoffload.harness.systems import SYSTEMS
from superoffload.options import PRECISIONS
from superoffload.shapes import MODELS, ModelShape

GiB = 2**30
FP32_TRAINING_BYTES = 16  # per parameter: fp32 weights, gradients, Adam m and v


# the number arguments' parsers (superoffload.harness.arguments.number)
POSITIVE_INT = number(int, 1)
NONNEG_INT = number(int, 0)
NONNEG_FLOAT = number(float, 0)
POSITIVE_FLOAT = number(float, 0, strict=True)


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one system on one model configuration and write a JSON record",
                       description="Train SYSTEM on MODEL with synthetic data for WARMUP + STEPS optimizer "
                                   "steps, time the STEPS after warm-up (device synchronized around each), "
                                   "and write one schema-validated JSON record to --out.")
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS), metavar="SYSTEM",
                   help=f"system under test: {', '.join(SYSTEMS)}")
    p.add_argument("--model", required=True, choices=list(MODELS), metavar="MODEL",
                   help=f"model from the zoo: {', '.join(MODELS)}")
    p.add_argument("--seq", type=POSITIVE_INT, default=128,
                   help="sequence length; with --sp the global length, split over the SP group (default 128)")
    p.add_argument("--batch", type=POSITIVE_INT, default=2,
                   help="micro-batch size per rank; with --sp per data-parallel group of SP ranks (default 2)")
    p.add_argument("--grad-accum", type=POSITIVE_INT, default=1,
                   help="micro-batches per optimizer step (default 1)")
    p.add_argument("--steps", type=POSITIVE_INT, default=10, help="timed steps after warm-up (default 10)")
    p.add_argument("--warmup", type=NONNEG_INT, default=2,
                   help="warm-up steps, run but excluded from timing (default 2)")
    p.add_argument("--precision", "--dtype", dest="precision", choices=PRECISIONS, default="fp32",
                   help="training precision (default fp32; --dtype is its old name, and the record's key)")
    p.add_argument("--seed", type=int, default=1234, help="seed for weights and data (default 1234)")
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=NONNEG_FLOAT, default=0.1, help="AdamW weight decay (default 0.1)")
    p.add_argument("--grad-clip", type=NONNEG_FLOAT, default=0.0,
                   help="global-norm gradient clipping threshold; 0 disables (default 0)")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--threads", type=POSITIVE_INT, default=None,
                   help="host threads for torch and the host optimizer (default: torch's default)")
    p.add_argument("--device", choices=["auto", "cuda", "host", "sim", "cpu"], default="auto",
                   help="auto uses CUDA when available, else host (the CPU; cpu is its old name); sim runs the "
                        "superoffload engine's CUDA code path on a simulated device with checked stream "
                        "ordering and a memory ledger (default auto)")
    p.add_argument("--init-device", choices=["host", "cuda"], default="host",
                   help="where the initial weights are drawn: host (the same bits on every machine; default) or "
                        "cuda (the same seed on the GPU's generator, copied to the host before the system gets "
                        "the model: seconds instead of a minute for a multi-billion-parameter model; the same "
                        "weights for every system on that GPU); recorded as run.init_device")
    p.add_argument("--peak-flops", type=POSITIVE_FLOAT, default=None,
                   help="override the peak FLOP/s used for MFU/HFU (default: GPU table or measured CPU peak)")
    p.add_argument("--data", default=None,
                   help="tokenized corpus file (flat uint16/uint32 token ids) instead of synthetic data")
    p.add_argument("--data-dtype", choices=["uint16", "uint32"], default="uint16",
                   help="token id type of --data (default uint16)")
    p.add_argument("--option", "-o", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="system-specific option (JSON value), repeatable, e.g. -o bucket_size=4096")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train on N ranks of this host: launches torchrun --standalone --nproc_per_node N with "
                        "this command (gloo on the CPU, NCCL on GPUs, one GPU per rank); --batch is per rank, "
                        "the global batch is batch x grad-accum x N; only rank 0 writes --out, whose world_size is N "
                        "(default: one process, or the ranks of an enclosing torchrun)")
    p.add_argument("--sp", type=POSITIVE_INT, default=1, metavar="K",
                   help="Ulysses sequence-parallel degree: K consecutive ranks split every sequence (each holds "
                        "seq/K tokens), N/K data-parallel groups; K must divide --nproc N, the model's attention "
                        "heads and --seq; systems: superoffload, ulysses (default 1)")
    p.add_argument("--loss-tile", type=POSITIVE_INT, default=None, metavar="T",
                   help="tiled cross-entropy holding at most T tokens' logits at a time (superoffload.sequence; "
                        "systems: superoffload, ulysses; default: the plain loss)")
    p.add_argument("--offload-checkpoints", action="store_true",
                   help="activation checkpointing with the checkpoints in host memory (implies --checkpointing; "
                        "systems: superoffload, ulysses)")
    p.add_argument("--bind-cores", action="store_true",
                   help="bind each rank to its own slice of the host's cores (one NUMA node per rank when "
                        "there are enough; else equal slices by LOCAL_RANK) and give the host optimizer the "
                        "slice minus one core; the cores are in the record (docs/measurement.md)")
    p.add_argument("--api", choices=["engine", "optimizer"], default="engine",
                   help="superoffload only: drive the engine through its own API (engine.backward / engine.step; "
                        "default) or as superoffload.AdamW in a plain loop (loss.backward(); opt.step(); "
                        "opt.zero_grad()); recorded as the system option api")
    p.add_argument("--out", required=True, help="path of the JSON record to write")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from superoffload.harness.record import write_record
    from superoffload.harness.runner import check_sequence_system, run_benchmark, validate_run

    options = dict(args.option)
    if args.data:
        options.update(data=args.data, data_dtype=args.data_dtype)
    if args.api != "engine":
        if args.system != "superoffload":
            print(f"bench run: error: --api {args.api} is for --system superoffload", file=sys.stderr)
            return 2
        options["api"] = args.api
    run = RunConfig(system=args.system, model=args.model, seq=args.seq, batch=args.batch,
                    grad_accum=args.grad_accum, steps=args.steps, warmup=args.warmup, precision=args.precision,
                    seed=args.seed, lr=args.lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                    activation_checkpointing=args.checkpointing or args.offload_checkpoints, threads=args.threads,
                    device=args.device, init_device=args.init_device, peak_flops=args.peak_flops,
                    system_options=options,
                    bind_cores=args.bind_cores, sp=args.sp, loss_tile=args.loss_tile,
                    offload_checkpoints=args.offload_checkpoints)
    nproc = getattr(args, "nproc", None)
    launch = nproc is not None and nproc > 1 and "LOCAL_RANK" not in os.environ
    try:
        if nproc is not None:
            check_nproc(run, nproc)
        # the ranks this run will have, for the checks below: --nproc, or the enclosing torchrun's
        if launch:
            run.world = nproc
        elif "LOCAL_RANK" in os.environ and os.environ.get("WORLD_SIZE", "").isdigit():
            run.world = int(os.environ["WORLD_SIZE"])
        check_sequence_system(run)
        if run.sp > 1 and run.world == 1:
            raise ValueError(f"--sp {run.sp} splits each sequence over {run.sp} ranks: add --nproc N with N a "
                             f"multiple of {run.sp}")
        shape = validate_run(run)
        check_memory(run, shape)
    except ValueError as e:
        print("superoffload bench run: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    if launch:
        return launch_ranks(args, run)
    if os.environ.get(RANK_OF_LAUNCHER_ENV):  # a rank of our own launcher's torchrun: never outlive it
        from superoffload.harness.processes import die_with_parent

        die_with_parent(signal.SIGKILL)

    bar = None
    progress = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=run.warmup + run.steps, desc=f"{run.system}/{run.model}", unit="step", file=sys.stderr)

        def progress(done: int, total: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", phase="warmup" if done <= run.warmup else "timed")

    rec = run_benchmark(run, progress)
    if bar is not None:
        bar.close()
    if rec["run"].get("rank", 0) == 0:
        from superoffload.harness.processes import claim_holds

        if not claim_holds():  # the guard gave up on this run (timed out) and wrote its error record
            print(f"superoffload bench run: {args.out} not written: the run is no longer wanted (its guard "
                  f"timed out or was stopped)", file=sys.stderr)
            return 1
        write_record(args.out, rec)
    print(summary_line(rec))
    return 0 if rec["status"] == "ok" else 1


def summary_line(rec: dict) -> str:
    world = rec.get("world_size", 1)
    head = f"{rec['system']} {rec['model']['name']} seq={rec['run']['seq']} batch={rec['run']['global_batch']}"
    if world > 1:
        head += f" world={world} rank={rec['run'].get('rank', 0)}"
    if rec["run"].get("sp", 1) > 1:
        head += f" sp={rec['run']['sp']} (seq/rank={rec['run']['local_seq']})"
    if rec["status"] != "ok":
        return f"{head}: {rec['status'].upper()}: {(rec['error'] or '').splitlines()[0]}"
    tp, tm = rec["throughput"], rec["timing"]
    mem = rec["memory"]["peak_device_bytes"]
    mem_s = f"{mem / 2**30:.2f} GiB device" if mem is not None else \
        f"{rec['memory']['peak_host_rss_bytes'] / 2**30:.2f} GiB host RSS"
    agg = f" ({tp['aggregate_tokens_per_s']:.0f} tok/s over {world} ranks)" if world > 1 else ""
    return (f"{head}: {tp['tokens_per_s']:.0f} tok/s per device{agg}, {tp['model_tflops']:.3f} TFLOPS, "
            f"MFU {100 * tp['mfu']:.1f}%, HFU {100 * tp['hfu']:.1f}%, step {1000 * tm['median_s']:.1f} ms "
            f"(p10-p90 {1000 * tm['p10_s']:.1f}-{1000 * tm['p90_s']:.1f}), peak {mem_s}, "
            f"loss {_loss_text(rec, 0)} -> {_loss_text(rec, -1)}")


def _loss_text(rec: dict, i: int) -> str:
    """A step's loss for the summary line: NaN/Inf ones say so (they are null in the record)."""
    losses = rec["losses"]
    if not losses:
        return "-"
    v = losses[i]
    if v is not None:
        return f"{v:.4f}"
    return "nan" if (rec.get("loss_nonfinite") or [False] * len(losses))[i] else "none"


def available_cores() -> int:
    return len(os.sched_getaffinity(0))


def check_nproc(run: RunConfig, nproc: int) -> None:
    """Refuse, before launching anything, a rank count this host or this system cannot run: ValueError."""
    from superoffload.harness.systems import supports_multi_rank

    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if nproc == 1:
        return
    if "LOCAL_RANK" in os.environ and os.environ.get("WORLD_SIZE") not in (None, str(nproc)):
        raise ValueError(f"--nproc {nproc} inside a torchrun job of WORLD_SIZE {os.environ['WORLD_SIZE']}; "
                         "drop --nproc (the enclosing launcher decides the ranks)")
    import torch

    cuda = run.device not in ("cpu", "host", "sim") and torch.cuda.is_available()
    if cuda:
        if nproc > torch.cuda.device_count():
            raise ValueError(f"--nproc {nproc} needs one GPU per rank; this host has {torch.cuda.device_count()}")
    elif nproc > available_cores():
        raise ValueError(f"--nproc {nproc}: gloo ranks on the CPU need a core each; {available_cores()} are "
                         "available to this process")
    if not supports_multi_rank(run.system):
        raise ValueError(f"system {run.system!r} cannot run on several ranks; use --nproc 1")


def child_argv(args: argparse.Namespace) -> list[str]:
    """The `bench run` options of ``args`` as argv for the ranks (without --nproc)."""
    argv = ["bench", "run", "--system", args.system, "--model", args.model, "--seq", str(args.seq),
            "--batch", str(args.batch), "--grad-accum", str(args.grad_accum), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--precision", args.precision, "--seed", str(args.seed),
            "--lr", repr(args.lr),
            "--weight-decay", repr(args.weight_decay), "--grad-clip", repr(args.grad_clip),
            "--device", args.device, "--init-device", args.init_device, "--out", str(args.out), "--no-progress"]
    if args.checkpointing:
        argv.append("--checkpointing")
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.peak_flops is not None:
        argv += ["--peak-flops", repr(args.peak_flops)]
    if args.data:
        argv += ["--data", args.data, "--data-dtype", args.data_dtype]
    if args.bind_cores:
        argv.append("--bind-cores")
    if args.sp != 1:
        argv += ["--sp", str(args.sp)]
    if args.loss_tile is not None:
        argv += ["--loss-tile", str(args.loss_tile)]
    if args.offload_checkpoints:
        argv.append("--offload-checkpoints")
    if args.api != "engine":
        argv += ["--api", args.api]
    for key, value in args.option:
        argv += ["-o", f"{key}={json.dumps(value)}"]
    return argv


def launch_command(args: argparse.Namespace, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "superoffload", *child_argv(args)]


TAIL = 4000


RANK_OF_LAUNCHER_ENV = "SUPEROFFLOAD_BENCH_RANK"  # set for the ranks `bench run --nproc` starts


def launch_ranks(args: argparse.Namespace, run: RunConfig) -> int:
    """Run the ranks under torchrun, pass their output through, and leave a record at --out."""
    from superoffload.harness.record import error_record, write_record

    out = os.fspath(args.out)
    if os.path.exists(out):
        os.unlink(out)  # a stale record must not pass for this run's
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # torchrun's default is 1 per rank (it prints a banner when it sets it); --threads and --bind-cores
    # set the thread counts inside each rank
    env["OMP_NUM_THREADS"] = str(args.threads or 1)
    if os.path.isdir("/sys/class/net/lo"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host: gloo over loopback
    cmd = launch_command(args, args.nproc)
    env[RANK_OF_LAUNCHER_ENV] = "1"
    from superoffload.harness.processes import claim_holds

    # torchrun stops its ranks on SIGTERM: it gets one if this launcher dies (a kill -9 included), and the
    # ranks die with torchrun (die_with_parent in each rank)
    cmd = [sys.executable, "-m", "superoffload.harness.processes", "SIGTERM", "--", *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got: list[int] = []

    def forward(signum, frame) -> None:  # SIGTERM / SIGINT to the launcher: torchrun stops the ranks
        got.append(signum)
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)

    old = {sg: signal.signal(sg, forward) for sg in (signal.SIGTERM, signal.SIGINT)}
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)
            if len(tail) > 200:
                del tail[:100]
        rc = proc.wait()
    finally:
        for sg, h in old.items():
            signal.signal(sg, h)
    if os.path.exists(out):
        return rc
    text = "".join(tail).strip()[-TAIL:] or "(no output)"
    why = f"stopped by {signal.Signals(got[0]).name}" if got else f"exited with {rc}"
    if not claim_holds():
        return 128 + got[0] if got else 1
    write_record(out, error_record(run, f"{args.nproc} ranks {why} without writing a record\n\n{text}"))
    if got:
        return 128 + got[0]
    print(f"superoffload bench run: the ranks exited with {rc} and left no record; wrote an error record to {out}",
          file=sys.stderr)
    return 1


def check_memory(run: RunConfig, shape: ModelShape, host_available: float | None = None,
                 device_available: float | None = None) -> None:
    """Fail before building a model that cannot fit this machine (instead of allocating until it swaps):
    ValueError naming the GiB needed and available.

    The need is the planner's memory estimate for the system being run: for ``superoffload`` on a GPU
    the memory half of its plan (``check_feasible``: host state, then weight flow if HBM is short), for
    the other modelled systems their itemised estimate; for a system the planner does not model, the
    fp32 weights, gradients and Adam state (16 B/param) against host memory. Available: psutil's
    available host memory and, with CUDA, the device's free memory; on a CPU-only run the device is the
    host, so both needs come out of host memory. The estimate assumes bf16 weights and activations (an
    fp32 run needs more), so this catches what cannot fit; it does not promise that the rest will.
    """
    import psutil
    import torch

    from superoffload.planner.costmodel import Workload, estimate_memory
    from superoffload.planner.plan import PlanInfeasible, check_feasible, positions_for
    from superoffload.planner.presets import get_profile
    from superoffload.planner.systems import PAPER_ONLY_SYSTEMS as PAPER_ONLY
    from superoffload.planner.systems import SYSTEMS as MODELLED
    from superoffload.planner.systems import Options, system_spec

    cuda = run.device not in ("cpu", "host", "sim") and torch.cuda.is_available()
    host = float(psutil.virtual_memory().available if host_available is None else host_available)
    device = host  # CPU-only: the device is the host
    if cuda:
        device = float(torch.cuda.mem_get_info()[0] if device_available is None else device_available)
    what = f"{run.system} on {shape.name} (seq {run.seq}, batch {run.batch}" + \
        (f", sp {run.sp} of {run.world} ranks)" if run.sp > 1 else ")")
    n = shape.total_params()
    # the long-sequence pieces as the run sets them; the planner's workload is then one rank of the world
    # (1/sp of each sequence, 1/world of the sharded state); without them, one chip as before
    long_kw: dict = {}
    if run.sp > 1 or run.offload_checkpoints or run.loss_tile is not None:
        long_kw = {"chips": max(1, run.world), "sp": run.sp, "offload_checkpoints": run.offload_checkpoints,
                   "loss_tile": run.loss_tile}
    if run.system not in (*MODELLED, *PAPER_ONLY):
        _require(what, "host", FP32_TRAINING_BYTES * n, host, "fp32 weights, gradients and Adam state")
        return
    # this machine as a planner profile (only its memory matters here): its free memory and no reserves,
    # since available memory already excludes what is in use
    hw = dataclasses.replace(get_profile("h100-pcie" if cuda else "cpu"), name="this machine",
                             device_hbm_bytes=int(device), host_memory_bytes=int(host),
                             device_reserve_bytes=0, host_reserve_bytes=0)
    if run.system == "superoffload" and cuda:
        try:
            # the pieces exactly as the run sets them: the check may not count on one the run will not use
            check_feasible(shape, run.seq, run.batch, hw, activation_checkpointing=bool(run.activation_checkpointing),
                           grad_accum=run.grad_accum, **({**long_kw, "loss_tile": run.loss_tile or 0} if long_kw
                                                         else {"sp": 1, "offload_checkpoints": False, "loss_tile": 0}))
        except PlanInfeasible as e:
            _require(what, e.memory, e.need_bytes, e.available_bytes, "the planner's estimate, weight flow included")
        return
    opts = Options(precision=run.precision, grad_clip=run.grad_clip, grad_accum=run.grad_accum)
    w = Workload(positions_for(shape, run.seq) if long_kw else shape, run.seq, run.batch,
                 bool(run.activation_checkpointing), precision=run.precision, **long_kw)
    mem = estimate_memory(w, hw, system_spec(run.system, opts, n, world=w.chips), opts)
    on_device = mem.device_total
    if run.precision == "fp32":
        on_device -= mem.device.get("autocast_bf16_weights", 0.0)  # no autocast copies in fp32 training
    why = "the cost model's estimate of weights, optimizer state, gradients and activations"
    if cuda:
        _require(what, "device", on_device, device, why)
        _require(what, "host", mem.host_total, host, why)
    else:
        # every rank of a CPU-only multi-rank run lives in this host's memory
        ranks = max(1, run.world)
        _require(what, "host", ranks * (on_device + mem.host_total), host,
                 why + "; the device is the host" + (f", {ranks} ranks" if ranks > 1 else ""))


def _require(what: str, memory: str, need: float, available: float, why: str) -> None:
    if need > available:
        raise ValueError(f"{what} needs about {_size(need)} of {memory} memory ({why}) but {_size(available)} "
                         f"is available; choose a smaller model, micro-batch or sequence")


def _size(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB / 10 else f"{nbytes / 2**20:.0f} MiB"
