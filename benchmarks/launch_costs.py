"""What one training step launches: the SuperOffload engine beside plain torch on the same model, counted.

    python benchmarks/launch_costs.py --device sim|host|cuda --model gpt-tiny --seq 128 --batch 2 \\
        --precision fp32|bf16|fp16 [--bucket-size N] [--device-tail-buckets N] [--steps 1] [--warmup 2] \\
        [--grad-clip 1.0] [--checkpointing] --out launch_costs.json

Per step, per phase (forward, backward, step), on the training thread: aten ops, kernel launches, host<->device
copies, event records and waits, stream switches, `wait_stream` calls, host syncs and the engine's Python calls
(superoffload/harness/launch_counts.py says how each is counted). Torch is the same model in the training
precision with foreach AdamW after `clip_grad_norm_`; the engine is `superoffload.initialize` with the given
bucket size and tail buckets (engine defaults otherwise) and the same clipping. `--steps` counted steps follow
`--warmup` uncounted ones (the engine's first step measures its bucket layout); counts are deterministic, so
the last counted step is the headline and `steady` says whether every counted step agreed.

On `sim` the simulated device runs the CUDA backend's kernels (`TorchKernels`), so what it counts is what a GPU
would launch; `host` keeps GraceAdam's. On `cuda` the model is built on the GPU (seconds for gpt-1b).
Prints a table (engine, torch, the engine's extra, per bucket and per parameter tensor) and writes JSON
atomically, its headline numbers at the top level (scripts/device_check.sh's report lists them), then the
whole counts, the comparison and provenance. A run cut off after the engine's count leaves that much behind
(status "partial").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

import superoffload
from superoffload.harness import launch_counts as lc
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape
from superoffload.harness.processes import claim_holds
from superoffload.harness.provenance import collect
from superoffload.harness.systems.torch_system import split_decay_groups
from superoffload.options import torch_dtype

LR, WEIGHT_DECAY = 1e-4, 0.1


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Atomically: a reader (or a run cut off) sees the old file or the new one, never half of one; and only
    while the guard running this (workflows/scripts/guard.py) has not given up on it."""
    if not claim_holds():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _model(args: argparse.Namespace, device: str) -> torch.nn.Module:
    return build_model(get_shape(args.model), seq=args.seq, seed=0, activation_checkpointing=args.checkpointing,
                       device=device)


def _sim_with_cuda_kernels(backend: Any) -> None:
    """The simulated device runs what the CUDA backend runs (set before the first step builds anything)."""
    if backend.kind == "sim" and backend.kernels.name != "torch":
        from superoffload.device.kernels import TorchKernels

        backend.kernels = TorchKernels()


def engine_counts(args: argparse.Namespace, batch: tuple[torch.Tensor, ...]) -> tuple[list[lc.PhaseCounts], str]:
    init = "cuda" if args.device == "cuda" else "cpu"
    model = _model(args, init)
    cfg: dict[str, Any] = {"device": args.device, "precision": args.precision, "grad_clip": args.grad_clip,
                           "optimizer": {"lr": LR, "weight_decay": WEIGHT_DECAY}, "host_threads": args.threads}
    if args.bucket_size is not None:
        cfg["bucket_size"] = args.bucket_size
    if args.device_tail_buckets is not None:
        cfg["device_tail_buckets"] = args.device_tail_buckets
    engine = superoffload.initialize(model, cfg)
    try:
        _sim_with_cuda_kernels(engine.backend)
        batch = tuple(t.to(engine.device) for t in batch)
        counted = [lc.count_engine_step(engine, model, batch, warmup=args.warmup if i == 0 else 0)
                   for i in range(args.steps)]
        return counted, engine.backend.kernels.name
    finally:
        engine.close()


def torch_counts(args: argparse.Namespace, batch: tuple[torch.Tensor, ...]) -> list[lc.PhaseCounts]:
    device = "cuda" if args.device == "cuda" else "cpu"
    model = _model(args, device).to(torch_dtype(args.precision))
    opt = torch.optim.AdamW(split_decay_groups(model, WEIGHT_DECAY), lr=LR, foreach=True)
    batch = tuple(t.to(device) for t in batch)
    return [lc.count_torch_step(model, opt, batch, args.grad_clip, warmup=args.warmup if i == 0 else 0)
            for i in range(args.steps)]


def headline(cmp: dict[str, Any], engine: lc.PhaseCounts) -> dict[str, Any]:
    """The top-level numbers (what device_check's summary lists), most telling first."""
    fb, step, total = cmp["forward_backward"], cmp["step"], cmp["total"]
    buckets = engine.buckets_host + engine.buckets_device
    per = fb["extra_per_bucket"]
    return {
        "engine_aten_ops_per_step": total["engine"]["aten_ops"], "torch_aten_ops_per_step": total["torch"]["aten_ops"],
        "extra_fwd_bwd_aten_ops_per_bucket": per["aten_ops"],
        "engine_step_aten_ops": step["engine"]["aten_ops"], "torch_step_aten_ops": step["torch"]["aten_ops"],
        "engine_launches_per_step": total["engine"]["launches"], "torch_launches_per_step": total["torch"]["launches"],
        "extra_fwd_bwd_launches_per_bucket": per["launches"],
        "engine_copies_per_step": total["engine"]["copies"],
        "engine_event_records_per_step": total["engine"]["event_records"],
        "engine_event_waits_per_step": total["engine"]["event_waits"],
        "engine_wait_streams_per_step": total["engine"]["wait_streams"],
        "engine_stream_switches_per_step": total["engine"]["stream_switches"],
        "engine_host_syncs_per_step": total["engine"]["host_syncs"],
        "engine_py_calls_per_step": total["engine"]["py_engine"],
        "engine_py_calls_per_bucket": total["engine"]["py_engine"] / buckets if buckets else None,
        "buckets_host": engine.buckets_host, "buckets_device": engine.buckets_device,
        "tensors": engine.tensors, "params": engine.params,
    }


def _cell(v: float | int | None) -> str:
    if v is None:
        return "-"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"


def table(cmp: dict[str, Any], engine: lc.PhaseCounts) -> str:
    """Engine, torch and the extra per part of the step; the extra per bucket and the counts per tensor."""
    host, tail = engine.buckets_host, engine.buckets_device
    # one run cannot split the extra between host and tail buckets: per kind only when all are of one kind
    kind, key = (("host bucket", "extra_per_host_bucket") if not tail else ("tail bucket", "extra_per_tail_bucket")
                 if not host else ("bucket", "extra_per_bucket"))
    head = ["counter"]
    for part in ("fwd+bwd", "step", "total"):
        head += [f"{part} engine", "torch", "extra"]
    head += [f"fwd+bwd extra/{kind}", f"step extra/{kind}", "engine/tensor", "torch/tensor"]
    rows = [head]
    for f in lc.FIELDS:
        row = [f]
        for part in ("forward_backward", "step", "total"):
            row += [_cell(cmp[part][x][f]) for x in ("engine", "torch", "extra")]
        row += [_cell(cmp["forward_backward"][key][f]), _cell(cmp["step"][key][f]),
                _cell(cmp["total"]["engine_per_tensor"][f]), _cell(cmp["total"]["torch_per_tensor"][f])]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    return (f"per step (extra = engine - torch), {host} host + {tail} tail buckets, {engine.tensors} parameter "
            f"tensors\n" + "\n".join(lines))


def run(args: argparse.Namespace, meta: dict[str, Any], done: dict[str, Any]) -> dict[str, Any]:
    """Count both systems; what is counted goes into `done` as it completes (and the engine's to the file)."""
    shape = get_shape(args.model)
    batch = SyntheticData(shape.vocab, args.seq, args.batch, seed=1).micro_batch(0, 0)
    t0 = time.perf_counter()
    engines, kernels = engine_counts(args, batch)
    done.update(kernels=kernels, engine_s=round(time.perf_counter() - t0, 2), engine=engines[-1].to_dict(),
                engine_steps=[e.total().numbers() for e in engines])
    write_json(args.out, {**meta, "status": "partial", **done})
    if args.device == "cuda":
        torch.cuda.empty_cache()
    t1 = time.perf_counter()
    torches = torch_counts(args, batch)
    done.update(torch_s=round(time.perf_counter() - t1, 2), torch=torches[-1].to_dict(),
                torch_steps=[t.total().numbers() for t in torches])
    engine, torch_ = engines[-1], torches[-1]
    cmp = lc.compare(engine, torch_)
    steady = all(x.total().numbers() == engine.total().numbers() for x in engines) and \
        all(x.total().numbers() == torch_.total().numbers() for x in torches)
    print(f"{args.model} seq {args.seq} batch {args.batch} {args.precision} on {args.device} (engine kernels: "
          f"{kernels}), {engine.tensors} tensors, {engine.params:,} params, bucket_size "
          f"{args.bucket_size or 'engine default'}; the counted engine step: {engine.outcome}")
    print(table(cmp, engine))
    return {"status": "ok", **{k: meta[k] for k in ("device", "model", "seq", "batch", "precision")},
            **headline(cmp, engine), "steady": steady, **meta, **done, "compare": cmp}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("sim", "host", "cuda"), default="sim")
    p.add_argument("--model", default="gpt-tiny")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    p.add_argument("--bucket-size", type=int, default=None, help="elements (default: the engine's)")
    p.add_argument("--device-tail-buckets", type=int, default=None, help="default: the engine's")
    p.add_argument("--steps", type=int, default=1, help="counted steps, after the warm-up")
    p.add_argument("--warmup", type=int, default=2, help="uncounted steps first (the first measures the layout)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="both systems clip at this norm (0: no clipping)")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing (both systems)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch and the engine's host Adam (default: 1 on sim and host, where two "
                        "threads on a busy 2-core machine made a bf16 torch step 20x slower; the defaults on cuda)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads is None and args.device != "cuda":
        args.threads = 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # the counts do not depend on it
    meta: dict[str, Any] = {
        "device": args.device, "model": args.model, "seq": args.seq, "batch": args.batch,
        "precision": args.precision, "bucket_size": args.bucket_size, "device_tail_buckets": args.device_tail_buckets,
        "steps": args.steps, "warmup": args.warmup, "grad_clip": args.grad_clip, "checkpointing": args.checkpointing,
        "threads": args.threads,
        "command": " ".join(["python benchmarks/launch_costs.py", *(sys.argv[1:] if argv is None else argv)]),
        # the lent GPU's copy of the tree has no .git: device_check.sh names the commit
        "provenance": {**collect(args.device), "device_check_commit": os.environ.get("DEVICE_CHECK_COMMIT")},
    }
    done: dict[str, Any] = {}
    try:
        result = run(args, meta, done)
    except Exception as e:  # noqa: BLE001 - the file says what failed and keeps what was counted
        write_json(args.out, {**meta, "status": "error", "error": f"{type(e).__name__}: {e}", **done,
                              "traceback": traceback.format_exc()[-4000:]})
        traceback.print_exc()
        return 1
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
