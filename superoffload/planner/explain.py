"""`superoffload explain`: print the plan for a model on a machine, the predicted stage times and why."""

from __future__ import annotations

import argparse
import json as jsonlib
import sys
from pathlib import Path

import superoffload.units as units
from superoffload.planner.costmodel import Prediction
from superoffload.planner.hardware import GB
from superoffload.planner.plan import Plan, PlanInfeasible, make_plan
from superoffload.planner.presets import PRESETS, get_profile
from superoffload.shapes import ModelShape, get_shape


def _shape(model: str | ModelShape) -> ModelShape:
    return model if isinstance(model, ModelShape) else get_shape(model)


def explain(model: str | ModelShape, seq: int, batch: int, hardware: str | Path = "gh200",
            activation_checkpointing: bool = True, json: bool = False,
            hbm_budget: float | None = None, chips: int = 1, ranks_per_node: int | None = None,
            sp: int | None = None, offload_checkpoints: bool | None = None, loss_tile: int | None = None,
            precision: str = "bf16", cores_per_rank: float | None = None, compute_threads: int | None = None,
            host_threads: int | None = None) -> str:
    """The plan as text (or JSON with ``json=True``) for one rank of ``chips`` ranks (``chips / sp``
    data-parallel groups of ``sp`` sequence-parallel ranks; None: the planner chooses, as for
    ``offload_checkpoints`` and ``loss_tile``, 0 = the plain loss)."""
    shape = _shape(model)
    hw = get_profile(hardware)
    plan = make_plan(shape, seq, batch, hw, activation_checkpointing=activation_checkpointing,
                     hbm_budget=hbm_budget, chips=chips, ranks_per_node=ranks_per_node, sp=sp,
                     offload_checkpoints=offload_checkpoints, loss_tile=loss_tile, precision=precision,
                     cores_per_rank=cores_per_rank, compute_threads=compute_threads, host_threads=host_threads)
    if json:
        return jsonlib.dumps({"plan": plan.to_dict(), "hardware": hw.to_dict()}, indent=2, sort_keys=True)
    return format_plan(plan, shape)


def format_ranges(xs: list[int]) -> str:
    """Sorted integers as ranges, "0-3,8" (the Linux cpulist form); "none" for an empty list."""
    if not xs:
        return "none"
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:  # type: ignore[list-item]
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def format_plan(plan: Plan, shape: ModelShape) -> str:
    p = plan.predicted
    chips = getattr(plan, "chips", 1)
    sp = getattr(plan, "sp", 1)
    on = (plan.hardware if chips == 1 else f"{chips} x {plan.hardware} (micro-batch per chip)" if sp == 1
          else f"{chips} x {plan.hardware} (micro-batch per group of {sp} sequence-parallel chips)")
    lines = [
        f"Plan for {shape.name} ({units.count(p.params if p else shape.total_params())} params), seq {plan.seq}, "
        f"micro-batch {plan.batch}, {getattr(plan, 'precision', 'bf16')}, on {on}"
        f"{'' if plan.activation_checkpointing else ' (no activation checkpointing)'}",
        "",
        f"  bucket_size          {plan.bucket_size:,} elements "
        f"({units.nbytes(plan.bucket_size * 4)} fp32)",
        f"  device_tail_buckets  {plan.device_tail_buckets}",
        f"  grad_cast            {plan.grad_cast}",
        f"  param_cast           {plan.param_cast}",
        f"  flow_layers          {format_ranges(plan.flow_layers)} ({len(plan.flow_layers)} of {shape.layers})",
        f"  flow_prefetch        {plan.flow_prefetch}",
        f"  host_optimizer       {plan.host_optimizer}",
        f"  rollback_mode        {plan.rollback_mode}",
        f"  speculation          {str(plan.speculation).lower()}",
        f"  upload_slots         {getattr(plan, 'upload_slots', 0)} ("
        + ("an upload buffer per host bucket)" if not getattr(plan, "upload_slots", 0) else
           "a ring of pinned slots: the first buckets in forward order speculate, the others step at publish)"),
    ]
    if chips > 1:
        lines.append(f"  replicate            {str(getattr(plan, 'replicate', False)).lower()} ("
                     + ("every rank holds and steps the whole optimizer state; gradients all-reduced, nothing "
                        "all-gathered)" if getattr(plan, "replicate", False) else
                        f"the optimizer state sharded over the {chips} ranks)"))
    if sp > 1 or plan.offload_checkpoints or plan.loss_tile is not None:
        lines += [
            "  long sequences (model side, superoffload.sequence):",
            f"    sp                 {sp} (Ulysses; {chips // sp} data-parallel group"
            f"{'s' if chips // sp > 1 else ''}, {plan.seq // sp:,} tokens of each sequence per rank)",
            f"    offload_checkpoints {str(plan.offload_checkpoints).lower()}",
            f"    loss_tile          {'plain loss' if plan.loss_tile is None else f'{plan.loss_tile:,} tokens'}",
        ]
    if p is not None:
        lines += [
            "",
            "Predicted (steady state, one optimizer step):",
            f"  step time            {p.step_time_s * 1e3:.1f} ms ({p.tokens_per_s:,.0f} tokens/s"
            + (f" per chip, {p.tokens_per_s * chips:,.0f} over {chips} chips)" if chips > 1 else ")"),
            f"  model TFLOPS         {units.rate(p.tflops)}{' per chip' if chips > 1 else ''} "
            f"(MFU {p.mfu:.1%}, HFU {p.hfu:.1%})",
            f"  device busy / idle   {p.gpu_busy_s * 1e3:.1f} / {p.gpu_idle_s * 1e3:.1f} ms; "
            f"exposed tail {p.tail_s * 1e3:.1f} ms",
            f"  peak HBM             {p.peak_hbm_bytes / GB:.1f} GB of "
            f"{plan.hbm_budget_bytes / GB:.1f} GB budget",
            f"  host memory          {p.host_bytes / GB:.1f} GB",
            "  busy time per stage (resources overlap, so these do not add up to the step):",
        ]
        stages = sorted(p.stage_s.items(), key=lambda kv: -kv[1])
        lines += [f"    {k:<18} {v * 1e3:9.1f} ms" for k, v in stages]
        lines += format_binding(p)
        lines += [""] + format_memory(p.memory, plan.hbm_budget_bytes, chips > 1, p.params / chips)
    lines += format_alternatives(getattr(plan, "alternatives", {}))
    lines += format_off(getattr(plan, "off", {}))
    # the "Off:" reasons are the section above, one per technique
    lines += ["", "Why:"] + [f"  - {r}" for r in plan.reasons if not r.startswith("Off: ")]
    return "\n".join(lines)


def format_off(off: dict) -> list[str]:
    """Every technique the plan turned off: why, and how to force it on."""
    if not off:
        return []
    lines = ["", "Turned off (why; how to turn it on):"]
    for key, o in off.items():
        lines.append(f"  {key:<20} {o['technique']}: {o['reason']}")
        lines.append(f"  {'':<20}   on: {o['force']}")
    return lines


RESOURCE_NAMES = {"compute": "the device's compute stream", "host": "the host CPU", "d2h": "the link, device to host",
                  "h2d": "the link, host to device", "net": "the network between chips"}


def format_binding(p: Prediction) -> list[str]:
    """What bounds the step: each resource's busy share of it, the busiest first, with its stages."""
    shares = sorted(p.resource_s.items(), key=lambda kv: -kv[1])
    if not shares or p.step_time_s <= 0:
        return []
    name, busy = shares[0]
    stages = ", ".join(p.resource_stages.get(name, []))
    out = [f"  bound by             {RESOURCE_NAMES.get(name, name)}: busy {busy * 1e3:.1f} ms of the "
           f"{p.step_time_s * 1e3:.1f} ms step ({busy / p.step_time_s:.0%}; {stages})"]
    out += [f"    then {RESOURCE_NAMES.get(r, r)}: {t * 1e3:.1f} ms ({t / p.step_time_s:.0%})" for r, t in shares[1:3]]
    return out


def _value(v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return format_ranges(v) if v else "none"
    return f"{v:,}" if isinstance(v, int) else str(v)


def format_alternatives(alternatives: dict) -> list[str]:
    """Each choice against its runner-up, both priced on the final plan with only that knob changed."""
    if not alternatives:
        return []
    lines = ["", "Runner-up per choice (predicted step with only that knob changed):"]
    for key, a in alternatives.items():
        chosen = _value(a["chosen"])
        if a["step_s"] is not None:
            chosen += f" {a['step_s'] * 1e3:.1f} ms"
        if a["runner_up"] is None:
            other = "none"
        elif a["runner_up_step_s"] is None:
            other = f"{_value(a['runner_up'])} (not priced)"
        else:
            gap = a["runner_up_step_s"] / a["step_s"] - 1 if a["step_s"] else 0.0
            other = f"{_value(a['runner_up'])} {a['runner_up_step_s'] * 1e3:.1f} ms ({gap:+.1%})"
        lines.append(f"  {key:<20} {chosen}; runner-up {other}: {a['why']}")
    return lines


def format_memory(memory: dict, budget: float | None = None, per_rank: bool = False,
                  params: float | None = None) -> list[str]:
    """A prediction's memory (``Prediction.memory``) by category, device and host, in GB; with ``params``
    (this rank's share of the model) host categories also in bytes per parameter."""
    if not memory or "device" not in memory:
        return []
    pinned = set(memory.get("pinned_keys", ()))
    device, host = memory["device"], memory.get("host", {})
    dev_total, host_total = sum(device.values()), sum(host.values())
    pinned_total = sum(v for k, v in host.items() if k in pinned)
    of = f" of {budget / GB:.1f} GB budget" if budget else ""
    lines = [f"Memory by category{' (per rank)' if per_rank else ''}:",
             f"  device                   {dev_total / GB:9.2f} GB{of}"]
    lines += [f"    {k:<22} {v / GB:9.2f} GB" for k, v in device.items()]
    def per(v: float) -> str:
        return f" {v / params:6.2f} B/param" if params else ""

    lines += [f"  host                     {host_total / GB:9.2f} GB{per(host_total)} "
              f"({pinned_total / GB:.2f} GB pinned)"]
    lines += [f"    {k:<22} {v / GB:9.2f} GB{per(v)}{' pinned' if k in pinned else ''}" for k, v in host.items()]
    return lines


def _run(args: argparse.Namespace) -> int:
    """Every user error is one line on stderr and exit status 2."""
    try:
        for name in ("seq", "batch", "chips"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(args, name)}")
        if args.sp is not None:
            if args.sp < 1:
                raise ValueError(f"--sp must be a positive integer, got {args.sp}")
            if args.chips % args.sp:
                raise ValueError(f"--sp {args.sp} must divide --chips {args.chips} (chips = sp x data-parallel groups)")
            if args.seq % args.sp:
                raise ValueError(f"--seq {args.seq} must be divisible by --sp {args.sp} (a rank holds seq/sp tokens)")
        if args.loss_tile is not None and args.loss_tile < 0:
            raise ValueError(f"--loss-tile must be >= 0 tokens (0: the plain loss), got {args.loss_tile}")
        if args.ranks_per_node is not None and not args.ranks_per_node >= 1:
            raise ValueError(f"--ranks-per-node must be a positive integer, got {args.ranks_per_node}")
        if args.hbm_budget_gb is not None and not args.hbm_budget_gb > 0:
            raise ValueError(f"--hbm-budget-gb must be > 0, got {args.hbm_budget_gb}")
        if args.cores_per_rank is not None and not args.cores_per_rank > 0:
            raise ValueError(f"--cores-per-rank must be > 0, got {args.cores_per_rank}")
        for name in ("threads", "host_threads"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
        text = explain(args.model, args.seq, args.batch, args.hardware,
                       activation_checkpointing=not args.no_checkpointing, json=args.json,
                       hbm_budget=args.hbm_budget_gb * GB if args.hbm_budget_gb else None,
                       chips=args.chips, ranks_per_node=args.ranks_per_node, sp=args.sp,
                       offload_checkpoints=args.offload_checkpoints, loss_tile=args.loss_tile,
                       precision=args.precision, cores_per_rank=args.cores_per_rank, compute_threads=args.threads,
                       host_threads=args.host_threads)
    except PlanInfeasible as e:
        return _fail("infeasible", e)
    except ValueError as e:  # unknown model or hardware, a bad profile file, a bad number
        return _fail("error", e)
    print(text)
    return 0


def _fail(kind: str, e: Exception) -> int:
    print(f"superoffload explain: {kind}: " + " ".join(str(e).split()), file=sys.stderr)
    return 2


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``explain`` to an argparse sub-command set; the handler is ``args.func(args) -> int``."""
    p = subparsers.add_parser("explain", help="print the planner's choices for a model and why")
    p.add_argument("--model", default="gpt-13b", help="model zoo name (e.g. gpt-13b, llama3.1-8b)")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1, help="micro-batch (sequences)")
    p.add_argument("--hardware", default="gh200",
                   help=f"preset ({', '.join(PRESETS)}) or a profile JSON written by `calibrate`")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="training precision the plan is for (default bf16; the CPU harness runs fp32)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--no-checkpointing", action="store_true", help="disable activation checkpointing")
    p.add_argument("--hbm-budget-gb", type=float, default=None, help="override the device memory budget")
    p.add_argument("--chips", type=int, default=1,
                   help="data-parallel ranks, one per chip, each with its own micro-batch (default 1); each "
                        "host holds 1/chips of the optimizer state; collectives are charged per link class")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="chips per node in the layout (default: as many as a node of the profile holds)")
    p.add_argument("--sp", type=int, default=None,
                   help="Ulysses sequence-parallel degree: divides --chips and the model's heads; each rank holds "
                        "seq/sp tokens (default: the planner chooses, 1 unless memory needs more)")
    p.add_argument("--offload-checkpoints", action=argparse.BooleanOptionalAction, default=None,
                   help="activation checkpoints in host memory (default: the planner chooses)")
    p.add_argument("--loss-tile", type=int, default=None,
                   help="tokens per tile of the tiled loss, 0 for the plain loss (default: the planner chooses)")
    p.add_argument("--cores-per-rank", type=float, default=None,
                   help="host cores one rank may use, e.g. a `bench run --bind-cores` slice (default: the profile's "
                        "cores over the ranks sharing a host when the device is the host, else the chip's own host)")
    p.add_argument("--threads", type=int, default=None,
                   help="compute threads per rank when the device is the host (bench run --threads; default: the "
                        "profile's measured count, else 1); the host worker overlaps compute only with a core left")
    p.add_argument("--host-threads", type=int, default=None,
                   help="host optimizer threads per rank (engine host_threads; default: the cores left beside the "
                        "compute, at least 1); host Adam is priced at the profile's rate for that many threads")
    p.set_defaults(func=_run)
