"""`superoffload bench memory`: the engine's measured memory against the planner's, for one run.

Trains a model for a few steps with the SuperOffload engine (the planner's plan for this machine unless
`-o plan=false`; `-o KEY=VALUE` overrides engine config keys as in `bench run`), resets the peak after
warm-up, and reports:
- device peak bytes, measured (the memory ledger: on `sim` every allocation of the engine and of the
  model's ops; on CUDA the allocator's peak) and planned (`planner.memory.engine_memory` for the same
  engine config), with both broken down by category;
- pinned host bytes, measured (allocated, after any rounding) and needed (what the transfer buffers
  need), and pageable host bytes, with the planner's numbers beside them;
- host bytes per trained parameter (pinned + pageable, measured and planned) and the upload ring's share
  of them (config `upload_slots`; 0 without a ring): the number the largest model per host rests on.

Long sequences (superoffload/sequence), single process: `offload_checkpoints` builds the model with its
checkpoints in host memory (`activation_checkpointing="offload"`), `loss_tile` swaps in the tiled loss
(`enable_sequence_parallel(model, None, loss_tile=...)`, SP = 1). The engine binds its device to the
model's offloader, so on `sim` and CUDA the block inputs it prefetches back are device `activations` in
the ledger (the planner's window of two block inputs) and its host copies are pinned. The ledger keeps
no host peaks, so the checkpoints' host bytes are the offloader's own count
(`ActivationOffloader.stats().peak_host_bytes`), added to the pinned host bytes (pageable on the `host`
backend) and reported as the host category `activation_checkpoints`.

The JSON (`--json`, one object on stdout, or `--out FILE`) follows
superoffload/harness/memory_bench.schema.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import sys
from typing import Any

from superoffload.harness.models import MODELS

RECORD_KIND = "memory_bench"


def _planned(shape: Any, seq: int, batch: int, checkpointing: bool, cfg: Any, world: int,
             device_is_host: bool, offload_checkpoints: bool = False, loss_tile: int | None = None) -> Any:
    from superoffload.planner.costmodel import engine_memory_input
    from superoffload.planner.memory import engine_memory

    if shape.learned_positions:  # the harness builds position embeddings for the run's sequence length
        shape = dataclasses.replace(shape, max_seq=seq)
    inp = engine_memory_input(cfg.to_dict(), world=world, device_is_host=device_is_host,
                              offload_checkpoints=offload_checkpoints, loss_tile=loss_tile)
    return engine_memory(shape, seq, batch, checkpointing, inp)


def _train(engine: Any, data: Any, warmup: int, steps: int, offloader: Any) -> None:
    """``warmup`` steps, then ``steps`` more with the device's peak memory (and the checkpoint offloader's, if
    any) reset before them, so the peaks are the measured steps' alone."""
    dev = engine.backend
    for i in range(warmup + steps):
        if i == warmup:
            engine.synchronize()
            dev.reset_peak_memory()
            if offloader is not None:
                offloader.reset_peak()
        b = data.batch_at(i)
        for x, y in zip(b.inputs, b.targets, strict=True):
            engine.backward(engine(x.to(dev.torch_device), y.to(dev.torch_device)))
        engine.step()
    engine.synchronize()


def measure(model: str, seq: int, batch: int, *, device: str = "sim", dtype: str = "bf16", grad_accum: int = 1,
            checkpointing: bool = False, options: dict[str, Any] | None = None, warmup: int = 2,
            steps: int = 1, seed: int = 0, offload_checkpoints: bool = False,
            loss_tile: int | None = None) -> dict[str, Any]:
    """Run the engine on `model` and return the memory record (see the module doc)."""
    if offload_checkpoints and not checkpointing:
        raise ValueError("offload_checkpoints keeps activation checkpoints in host memory: it needs checkpointing")
    import superoffload
    from superoffload.harness import provenance
    from superoffload.harness.data import SyntheticData
    from superoffload.harness.models import build_model, get_shape
    from superoffload.harness.system import RunConfig
    from superoffload.harness.systems.superoffload_system import engine_config, plan_for

    shape = get_shape(model)
    run = RunConfig(system="superoffload", model=model, seq=seq, batch=batch, grad_accum=grad_accum,
                    precision=dtype, device=device, activation_checkpointing=checkpointing,
                    system_options=dict(options or {}))
    plan = plan_for(shape, run)
    cfg = engine_config(run, plan)
    net = build_model(shape, seq=seq, seed=seed,
                      activation_checkpointing="offload" if offload_checkpoints else checkpointing)
    if loss_tile is not None:
        from superoffload.sequence import enable_sequence_parallel

        enable_sequence_parallel(net, None, loss_tile=loss_tile)  # SP = 1: the tiled token-normalized loss
    engine = superoffload.initialize(net, cfg)
    dev = engine.backend
    try:
        data = SyntheticData(shape.vocab, seq, batch, grad_accum=grad_accum, seed=seed)
        _train(engine, data, warmup, steps, net.activation_offloader if offload_checkpoints else None)
        rep = dev.memory_report()
        world = engine.comm.world
        ckpt_host = net.activation_offloader.stats().peak_host_bytes if offload_checkpoints else 0
        params = sum(s.numel for s in engine.slots)
        ring = engine.upload_ring.arena.nbytes if engine.upload_ring is not None else 0
    finally:
        engine.close()
    est = _planned(shape, seq, batch, checkpointing, cfg, world, dev.shares_host_memory, offload_checkpoints,
                   loss_tile)
    planned_pinned = est.pinned_total
    planned_pageable = sum(v for k, v in est.host.items() if k not in est.pinned_keys)
    host_measured = {k: int(v) for k, v in rep["host_by_category"].items()}
    host_total = int(rep["host_needed_bytes"]["pinned"]) + int(rep["host_needed_bytes"]["pageable"])
    pinned_ckpt = 0
    if offload_checkpoints:  # the offloader's own count (see the module doc): pinned on CUDA
        host_measured["activation_checkpoints"] = int(ckpt_host)
        pinned_ckpt = int(ckpt_host) if not dev.shares_host_memory else 0
    return {
        "kind": RECORD_KIND, "schema_version": 1,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "model": model, "seq": seq, "batch": batch, "grad_accum": grad_accum, "dtype": dtype,
        "activation_checkpointing": checkpointing, "device": dev.kind, "world_size": world,  # the file's key
        "device_peak_bytes": {"measured": int(rep["device_peak_bytes"]), "planned": int(est.device_total)},
        "pinned_host_bytes": {"measured": int(rep["host_allocated_bytes"]["pinned"]) + pinned_ckpt,
                              "needed": int(rep["host_needed_bytes"]["pinned"]) + pinned_ckpt,
                              "planned": int(planned_pinned)},
        "pageable_host_bytes": {"measured": int(rep["host_needed_bytes"]["pageable"])
                                + (int(ckpt_host) if offload_checkpoints and dev.shares_host_memory else 0),
                                "planned": int(planned_pageable)},
        "params": int(params),
        "host_bytes_per_param": {"measured": host_total / max(1, params),
                                 "planned": (planned_pinned + planned_pageable) / max(1, params),
                                 "upload_ring": ring / max(1, params)},
        "device_by_category": {"measured": {k: int(v) for k, v in rep["device_at_peak"].items()},
                               "planned": {k: int(v) for k, v in est.device.items()}},
        "host_by_category": {"measured": host_measured,
                             "planned": {k: int(v) for k, v in est.host.items()}},
        "config": cfg.to_dict(), "plan": plan.to_dict() if plan is not None else None,
        "provenance": provenance.collect(dev.name()),
    }


def format_table(rec: dict[str, Any]) -> str:
    mib = 2**20

    def row(name: str, measured: float, planned: float) -> str:
        err = f"{planned / measured - 1:+.1%}" if measured else "n/a"
        return f"{name:<24}{measured / mib:>12.2f}{planned / mib:>12.2f}{err:>9}"

    d, p, g = rec["device_peak_bytes"], rec["pinned_host_bytes"], rec["pageable_host_bytes"]
    lines = [f"{rec['model']} seq {rec['seq']} batch {rec['batch']} {rec['dtype']} on {rec['device']} (MiB)",
             f"{'':<24}{'measured':>12}{'planned':>12}{'error':>9}",
             row("device peak", d["measured"], d["planned"])]
    m_cat, p_cat = rec["device_by_category"]["measured"], dict(rec["device_by_category"]["planned"])
    # the ledger counts what the model's ops allocate as one category
    p_cat["activations"] = p_cat.get("activations", 0) + p_cat.pop("backward_transients", 0)
    keys = sorted((set(m_cat) | set(p_cat)) - {"reserve"})
    lines += [row(f"  {k}", m_cat.get(k, 0), p_cat.get(k, 0)) for k in keys]
    lines += [row("pinned host", p["measured"], p["planned"]),
              f"  needed by the buffers: {p['needed'] / mib:.2f} MiB (allocated {p['measured'] / mib:.2f})",
              row("pageable host", g["measured"], g["planned"])]
    if "host_bytes_per_param" in rec:
        b = rec["host_bytes_per_param"]
        lines.append(f"host B/param (pinned + pageable, {rec['params'] / 1e6:.2f}M params): measured "
                     f"{b['measured']:.2f}, planned {b['planned']:.2f}; the upload ring's share {b['upload_ring']:.2f}")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="the engine's measured device and host memory vs the planner's",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=list(MODELS), metavar="MODEL", help="model from the zoo")
    p.add_argument("--seq", type=int, required=True, help="sequence length")
    p.add_argument("--batch", type=int, default=1, help="micro-batch (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="bf16", help="precision (default bf16)")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--offload-checkpoints", action="store_true",
                   help="with --checkpointing: the checkpoints in host memory (superoffload.sequence)")
    p.add_argument("--loss-tile", type=int, default=None,
                   help="the tiled loss with this many tokens per tile (superoffload.sequence, SP = 1)")
    p.add_argument("--device", choices=["auto", "cuda", "host", "sim", "cpu"], default="sim",
                   help="sim (default: the CUDA code path on a simulated device, every allocation measured), "
                        "cuda, or host")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="engine config override (JSON value), as in bench run; -o plan=false for engine defaults")
    p.add_argument("--json", action="store_true", help="print one JSON object to stdout instead of the table")
    p.add_argument("--out", default=None, help="also write the JSON record to this file (atomically)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from superoffload.harness.arguments import key_value
    from superoffload.harness.record import write_result

    if args.seq < 1 or args.batch < 1 or args.grad_accum < 1 or (args.loss_tile is not None and args.loss_tile < 1):
        print("superoffload bench memory: error: --seq, --batch, --grad-accum and --loss-tile must be >= 1",
              file=sys.stderr)
        return 2
    try:
        opts = dict(key_value(o) for o in args.option)
    except argparse.ArgumentTypeError as e:
        print(f"superoffload bench memory: error: {e}", file=sys.stderr)
        return 2
    try:
        rec = measure(args.model, args.seq, args.batch, device=args.device, dtype=args.dtype,
                      grad_accum=args.grad_accum, checkpointing=args.checkpointing, options=opts,
                      offload_checkpoints=args.offload_checkpoints, loss_tile=args.loss_tile)
    except ValueError as e:  # ConfigError included: a bad option or device, before any training
        print(f"superoffload bench memory: error: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_result(args.out, rec, RECORD_KIND)
    print(json.dumps(rec) if args.json else format_table(rec))
    return 0
