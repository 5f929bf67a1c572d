"""The runner: one honest measuring path for every system.

Validate everything first (a bad value fails before any model is built), build the model on the host
with a fixed seed, hand it to the system, run warm-up steps (excluded) and timed steps, synchronizing
the device before every clock read, and write one schema-validated record. An out-of-memory failure
is a result (status "oom"), as is any other exception (status "error"); neither crashes the caller.

Several ranks (torchrun; ``bench run --nproc N``): each rank runs this same path on its own micro-batch
under the default process group (gloo on CPU, NCCL on CUDA, with a collective timeout so a lost rank
ends the job). At the end every rank's timing, host-step times, placement and status are gathered to
rank 0 (``all_gather_object``), whose record carries them (``ranks``) with the aggregate throughput.

Sequence parallelism (``--sp K``, superoffload.harness.sequence): the data is seeded by data-parallel rank
(``rank // K``), so the K ranks of an SP group draw the same global batch of whole sequences and the system
trains its chunk of each; ``seq`` is the global length. Tokens/s per device count the tokens a device
processed (``batch * seq / K`` per micro-batch), the aggregate the global tokens; MFU per device uses the
model FLOPs per token over the global sequence (6N + causal attention over all ``seq`` tokens).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import logging
import os
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from superoffload.device import DEVICE_KINDS, Device, get_device
from superoffload.harness import peak, placement, record
from superoffload.harness.data import SyntheticData, TokenFileData
from superoffload.harness.models import build_model, count_params, get_shape
from superoffload.harness.noise import NoiseSampler
from superoffload.harness.system import RunConfig, System
from superoffload.harness.systems import SYSTEMS, check_system, create_system
from superoffload.harness.telemetry import Telemetry
from superoffload.options import PRECISIONS, torch_dtype
from superoffload.shapes import ModelShape, ulysses_kv_repeat

log = logging.getLogger(__name__)

INIT_DEVICES = ("host", "cuda")  # RunConfig.init_device: where the initial weights are drawn


def validate_run(run: RunConfig) -> ModelShape:
    """Check a RunConfig; raise ValueError saying what to change. Returns the model shape."""
    check_system(run.system)
    _validate_system(run)
    shape = get_shape(run.model)
    if run.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {run.precision!r}")
    for name in ("seq", "batch", "grad_accum", "steps", "world"):
        if getattr(run, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(run, name)}")
    if run.warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {run.warmup}")
    if run.grad_clip < 0:
        raise ValueError(f"grad_clip must be >= 0 (0 disables clipping), got {run.grad_clip}")
    if run.lr <= 0 or run.eps <= 0:
        raise ValueError("lr and eps must be positive")
    if not all(0.0 <= b < 1.0 for b in run.betas):
        raise ValueError(f"betas must be in [0, 1), got {run.betas}")
    if run.threads is not None and run.threads < 1:
        raise ValueError(f"threads must be >= 1, got {run.threads}")
    if run.host_threads is not None and run.host_threads < 1:
        raise ValueError(f"host_threads must be >= 1, got {run.host_threads}")
    if not shape.learned_positions and run.seq > shape.max_seq:
        raise ValueError(f"seq {run.seq} exceeds {run.model}'s max positions {shape.max_seq}")
    if run.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available; use --device host (the CPU) "
                         "or --device sim (the engine's CUDA code path, simulated on the CPU)")
    if run.init_device not in INIT_DEVICES:
        raise ValueError(f"init_device must be one of {', '.join(INIT_DEVICES)}, got {run.init_device!r}")
    if run.init_device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--init-device cuda needs a CUDA device; use --init-device host")
    if run.device not in DEVICE_KINDS:
        raise ValueError(f"device must be one of {', '.join(DEVICE_KINDS)}, got {run.device!r}")
    if run.device == "sim" and run.system != "superoffload":
        raise ValueError(f"--device sim simulates the SuperOffload engine's CUDA code path; run system "
                         f"{run.system!r} with --device host (or cpu)")
    data = run.system_options.get("data")
    if data is not None and not os.path.exists(data):
        raise ValueError(f"data file {data!r} does not exist")
    validate_sequence(run, shape)
    return shape


def validate_sequence(run: RunConfig, shape: ModelShape) -> None:
    """The long-sequence settings (--sp, --loss-tile, --offload-checkpoints): ValueError saying what to change.
    ``run.world`` must already be the number of ranks (the CLI sets it from --nproc or torchrun)."""
    check_sequence_system(run)
    if run.loss_tile is not None and (isinstance(run.loss_tile, bool) or not isinstance(run.loss_tile, int)
                                      or run.loss_tile < 1):
        raise ValueError(f"--loss-tile must be a positive number of tokens, got {run.loss_tile!r}")
    if run.sp == 1:
        return
    if run.world % run.sp:
        where = f"{run.world} rank" + ("s" if run.world > 1 else "")
        raise ValueError(f"--sp {run.sp} must divide the number of ranks ({where}); run --nproc N with N a "
                         f"multiple of {run.sp} (N / {run.sp} data-parallel groups)")
    try:
        ulysses_kv_repeat(shape.heads, shape.n_kv_heads, run.sp)
    except ValueError as e:
        raise ValueError(f"--sp {run.sp} on {shape.name}: {e}") from None
    validate_system = getattr(_system_class(run.system), "validate_sequence", None)
    if callable(validate_system):
        validate_system(run, shape)
    if run.seq % run.sp:
        raise ValueError(f"--seq {run.seq} must be divisible by --sp {run.sp}: every rank of an SP group holds "
                         f"an equal chunk of each sequence")


def check_sequence_system(run: RunConfig) -> None:
    """--sp / --loss-tile / --offload-checkpoints only for the systems that run the sequence package."""
    from superoffload.harness.systems import SP_SYSTEMS

    if not isinstance(run.sp, int) or isinstance(run.sp, bool) or run.sp < 1:
        raise ValueError(f"--sp must be a positive integer, got {run.sp!r}")
    asked = [flag for flag, on in (("--sp", run.sp > 1), ("--loss-tile", run.loss_tile is not None),
                                   ("--offload-checkpoints", run.offload_checkpoints)) if on]
    if asked and run.system not in SP_SYSTEMS:
        raise ValueError(f"{' and '.join(asked)}: system {run.system!r} does not run the sequence package; "
                         f"systems that do: {', '.join(sorted(SP_SYSTEMS))}")


def _system_class(name: str):
    module, _, cls_name = SYSTEMS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), cls_name)
    except ImportError:
        return None


def _validate_system(run: RunConfig) -> None:
    """Let the system check its own options (``-o``) and dtype before anything is built: a system class
    may define ``validate(run)`` (a classmethod raising ValueError). The import is cheap by contract
    (heavy libraries are imported in ``setup``); a system that cannot be imported fails later, as a
    record, in create_system."""
    cls = _system_class(run.system)
    if cls is None:
        return
    validate = getattr(cls, "validate", None)
    if callable(validate):
        validate(run)


def _dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


# Every collective of a multi-rank run times out after this many seconds (default 600), so a rank that
# died or hangs ends the job with an error instead of a silent wait (gloo's default is 30 minutes).
DIST_TIMEOUT_ENV = "SUPEROFFLOAD_DIST_TIMEOUT_S"


def dist_timeout() -> _dt.timedelta:
    return _dt.timedelta(seconds=float(os.environ.get(DIST_TIMEOUT_ENV, "600")))


def _init_distributed(device_type: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=dist_timeout())


def _place(run: RunConfig) -> dict[str, Any]:
    """Bind this rank to its slice of the cores when asked (--bind-cores), else record where it may run.
    The host optimizer gets the slice's threads minus one unless set explicitly."""
    if not run.bind_cores:
        return placement.current_placement()
    p = placement.bind_this_rank()
    if run.host_threads is None:
        run.host_threads = p.host_threads
    return p.to_dict()


def run_benchmark(run: RunConfig, progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Run one benchmark and return its record (status ok / oom / error). Raises only on bad input.

    In three parts: ``_start_rank`` (checks, placement, threads, device and process group), ``_measure``
    (build, set up and step the system; any failure becomes the record's status) and ``_complete_record``
    (timing, noise, the ranks' merge and throughput)."""
    rank, world = _dist_env()
    run.world = world
    shape = validate_run(run)
    where, device = _start_rank(run, world)
    rec = record.new_record(run, shape, params=shape.total_params(), rank=rank, device_name=device.name())
    rec["placement"] = where
    telemetry = Telemetry(run.telemetry_interval_s, want_gpu=device.is_cuda)
    m = _measure(run, shape, rank, device, rec, telemetry, progress)
    _complete_record(rec, run, shape, device, rank, world, where, telemetry, m)
    record.validate(rec)
    return rec


def _start_rank(run: RunConfig, world: int) -> tuple[dict[str, Any], Device]:
    """Place this rank, size torch's thread pools, pick its device and join the process group: (where it
    may run, the device)."""
    where = _place(run)  # before torch starts its thread pools: they inherit the binding
    if run.threads:
        torch.set_num_threads(run.threads)
    elif run.bind_cores:
        torch.set_num_threads(run.host_threads or 1)
    if world > 1 and run.device not in ("cpu", "host", "sim") and torch.cuda.is_available():
        # one GPU per rank: without this every torchrun rank would train on cuda:0
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = get_device(run.device)
    if world > 1:
        _init_distributed(device.type)
    return where, device


@dataclass
class _Measured:
    """What the steps left, complete or not: a failure part-way keeps the steps before it."""

    times: list[float] = field(default_factory=list)  # every step's, warm-up first
    losses: list[float] = field(default_factory=list)
    skipped: list[bool] | None = field(default_factory=list)  # None: the system does not say
    sampler: NoiseSampler | None = None  # None: the steps never began


def _make_data(run: RunConfig, shape: ModelShape, rank: int) -> SyntheticData | TokenFileData:
    """The run's batches: a token file (``-o data=PATH``) or synthetic tokens."""
    data_path = run.system_options.get("data")
    data_cls = TokenFileData if data_path else SyntheticData
    data_kw = {"path": data_path, "dtype": run.system_options.get("data_dtype", "uint16")} if data_path else {}
    # the data stream is seeded by the data-parallel rank: every rank of an SP group draws the same global
    # batch (whole sequences of run.seq tokens), which the system shards along the sequence
    return data_cls(vocab=shape.vocab, seq=run.seq, batch=run.batch, grad_accum=run.grad_accum,
                    seed=run.seed, rank=rank // run.sp, **data_kw)


def _measure(run: RunConfig, shape: ModelShape, rank: int, device: Device, rec: dict[str, Any], telemetry: Telemetry,
             progress: Callable[[int, int, float], None] | None) -> _Measured:
    """Build the model, hand it to the system and run the warm-up and timed steps. Every failure becomes the
    record's status and error; the system is torn down either way."""
    m = _Measured()
    system = None
    try:
        model = _initial_model(run, shape)
        rec["model"]["params"] = count_params(model)
        data = _make_data(run, shape, rank)
        system = create_system(run.system)
        system.setup(model, shape, run)
        del model
        device.reset_peak_memory()
        m.sampler = NoiseSampler().start()
        telemetry.start()
        _steps(run.warmup + run.steps, system, data, device, telemetry, m, progress)
        rec["system_stats"] = system.stats()
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        rec["status"] = "oom" if device.is_oom(e) else "error"
        rec["error"] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=8))[-4000:]
        log.warning("run failed (%s): %s", rec["status"], e)
    finally:
        telemetry.stop()
        if system is not None:
            try:
                system.teardown()
            except Exception as e:  # noqa: BLE001
                log.warning("teardown failed: %s", e)
    return m


def _initial_model(run: RunConfig, shape: ModelShape) -> torch.nn.Module:
    """The model with its initial weights, on the host as every system expects it; drawn on the GPU under
    ``init_device="cuda"`` (same seed, the GPU's generator) and copied to the host."""
    if run.init_device == "host":
        return build_model(shape, seq=run.seq, seed=run.seed, activation_checkpointing=run.checkpointing_mode)
    model = build_model(shape, seq=run.seq, seed=run.seed, activation_checkpointing=run.checkpointing_mode,
                        device=run.init_device).to("cpu")
    torch.cuda.empty_cache()  # the drawn copy's blocks go back to the device, not to this process's cache
    return model


def _steps(total: int, system: System, data: SyntheticData | TokenFileData, device: Device, telemetry: Telemetry,
           m: _Measured, progress: Callable[[int, int, float], None] | None) -> None:
    """``total`` steps, the device synchronized before each clock read; times, losses and skips go to ``m``."""
    for i in range(total):
        batch = data.batch_at(i)
        device.synchronize()
        t0 = time.perf_counter()
        loss = system.step(batch)
        device.synchronize()
        m.times.append(time.perf_counter() - t0)
        telemetry.mark_step(i)
        lv = float(loss.detach().float().cpu())
        m.losses.append(lv)
        flag = getattr(system, "last_step_skipped", None)
        m.skipped = None if m.skipped is None or flag is None else [*m.skipped, bool(flag)]
        if progress:
            progress(i + 1, total, lv)


def _complete_record(rec: dict[str, Any], run: RunConfig, shape: ModelShape, device: Device, rank: int, world: int,
                     where: dict[str, Any], telemetry: Telemetry, m: _Measured) -> None:
    """The record's losses, memory, telemetry, noise and timing, this rank's entry (every rank's, merged, on
    several) and, for an ok run, its throughput."""
    record.record_steps(rec, m.losses, m.skipped)  # NaN/Inf losses become null, marked in loss_nonfinite
    rec["memory"] = record.memory_block(device.peak_memory_bytes())
    rec["telemetry"] = telemetry.summary(timed_from_step=run.warmup)
    if rec["system_stats"]:
        rec["rollbacks"] = rec["system_stats"].get("speculation")
        rec["plan"] = rec["system_stats"].get("plan")
    timed = m.times[run.warmup:]
    if m.sampler is not None:  # the machine's load and the steps' spread, flagged where not quiet (noise.py)
        rec["noise"] = m.sampler.assess(timed, ranks=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if rec["status"] == "ok" and timed:
        rec["timing"] = record.timing_block(m.times, run.warmup)
    mine = _rank_entry(rec, rank, run.tokens_per_rank, where)  # under --sp: seq / sp tokens of each sequence
    rec["ranks"] = [mine]
    if world > 1:
        _merge_ranks(rec, _gather(mine) if rec["status"] == "ok" else None)
    if rec["status"] == "ok" and timed:
        peak_flops, source = peak.resolve_peak(device.torch_device, torch_dtype(run.precision), run.peak_flops)
        # the step ends when the slowest rank's does: per-device numbers use the slowest median
        slowest = max(r["median_step_s"] for r in rec["ranks"])
        rec["throughput"] = record.throughput_block(run, shape, slowest, peak_flops, source)


def _time_s(stats: Any, key: str) -> float | None:
    v = stats.get("time_s", {}).get(key) if isinstance(stats, dict) and isinstance(stats.get("time_s"), dict) else None
    return float(v) if isinstance(v, (int, float)) else None


def _rank_entry(rec: dict[str, Any], rank: int, tokens_per_rank: int, where: dict[str, Any]) -> dict[str, Any]:
    """This rank's line of the record's ``ranks``: status, timing, throughput, host-step time, placement."""
    timing = rec.get("timing") or {}
    median = timing.get("median_s")
    stats = rec.get("system_stats")
    return {
        "rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "hostname_hash": rec["provenance"].get("hostname_hash"),
        "status": rec["status"], "error": (rec["error"] or "").splitlines()[0] if rec["error"] else None,
        "median_step_s": median, "tokens_per_s": tokens_per_rank / median if median else None,
        # over all warm-up + timed steps, as the engine counts them (None for systems without the counter)
        "host_step_s": _time_s(stats, "host_step_s"), "host_worker_busy_s": _time_s(stats, "host_worker_busy_s"),
        "steps_counted": len(timing.get("step_times_s", [])) + len(timing.get("warmup_times_s", [])),
        "peak_host_rss_bytes": rec["memory"].get("peak_host_rss_bytes"),
        "peak_device_bytes": rec["memory"].get("peak_device_bytes"),
        "cores": where.get("cores"), "numa_nodes": where.get("numa_nodes"), "bound": where.get("bound", False),
        "host_threads": where.get("host_threads"),
    }


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]] | str:
    """Every rank's entry, in rank order, or the reason the gather failed."""
    import torch.distributed as dist

    try:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, mine)
        return [o for o in out if isinstance(o, dict)]
    except Exception as e:  # noqa: BLE001 - a failed gather is reported, not raised
        return f"{type(e).__name__}: {e}"


def _merge_ranks(rec: dict[str, Any], gathered: list[dict[str, Any]] | str | None) -> None:
    """Rank 0's view of all ranks; a rank that failed (or a gather that did) makes the record an error."""
    if gathered is None:  # this rank failed: it does not wait for the others (torchrun ends them)
        return
    if isinstance(gathered, str):
        rec["status"], rec["error"] = "error", f"gathering the ranks' results failed: {gathered}"
        return
    rec["ranks"] = sorted(gathered, key=lambda r: r["rank"])
    bad = [r for r in rec["ranks"] if r["status"] != "ok"]
    if bad and rec["status"] == "ok":
        rec["status"] = "oom" if all(r["status"] == "oom" for r in bad) else "error"
        rec["error"] = "; ".join(f"rank {r['rank']}: {r['status']}: {r['error']}" for r in bad)
    if rec["status"] != "ok":
        return
    medians = [r["median_step_s"] for r in rec["ranks"]]
    rec["timing"]["rank_median_spread_s"] = max(medians) - min(medians)
    rec["timing"]["median_of_ranks_s"] = statistics.median(medians)
