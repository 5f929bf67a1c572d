"""`superoffload finetune`: fine-tune a Hugging Face causal LM (or a zoo model) with the engine.

Every user error (a missing path, a dataset without the expected fields, --max-length beyond the model's
positions, --steps 0, ...) is one line on stderr and exit status 2, before any training step. A failure
during training is written into the run record (status error / oom) and exits 1. SIGTERM / SIGUSR1
(pre-emption) stop at the next step with a checkpoint and exit 75, SIGINT likewise with 130
(docs/finetune.md, "Pre-emption").
"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Fine-tune MODEL (a local Hugging Face directory, never downloaded, or a zoo name) on DATA (.json/.jsonl "
    "Alpaca 'instruction'/'input'/'output' or 'text' records, or a .bin of token ids) for STEPS optimizer "
    "steps with the SuperOffload engine: bf16, activation checkpointing, warm-up + cosine LR, the planner's "
    "plan for this machine. Writes checkpoints, DIR/final (save_pretrained) and DIR/record.json. Under "
    "torchrun every rank trains its own rows (--batch per rank) and the engine sums their gradients. "
    "Checkpoints are verified on --resume (a damaged newest one is skipped with a note). Exit status: 0 done, "
    "1 failed during training, 2 bad input, 75 pre-empted by SIGTERM/SIGUSR1 (checkpointed: --resume "
    "continues), 130 Ctrl-C (checkpointed)."
)


def _pair(s: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers like 0.9,0.999, got {s!r}") from None
    return a, b


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a Hugging Face model (or a zoo model) end to end",
                       description=DESCRIPTION)
    g = p.add_argument_group("what to train")
    g.add_argument("--model", required=True, metavar="PATH_OR_ZOO_NAME",
                   help="local directory saved with save_pretrained (nothing is downloaded), a directory written "
                        "by an earlier finetune of a zoo model, or a zoo name (gpt-tiny, gpt-small, llama-tiny, ...)")
    g.add_argument("--data", required=True, metavar="FILE",
                   help=".json (a list) / .jsonl (one per line) of Alpaca instruction/input/output or text "
                        "records, or .bin token ids")
    g.add_argument("--steps", required=True, type=int, help="optimizer steps of the whole run (>= 1)")
    g.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: checkpoints/, final/, record.json")
    g.add_argument("--config", default=None, metavar="FILE",
                   help="engine config (JSON/YAML) whose keys override the planned config, e.g. "
                        "{\"speculation_policy\": {\"max_rollback_rate\": 1.0}}")
    d = p.add_argument_group("data")
    d.add_argument("--max-length", type=int, default=None, metavar="L",
                   help="tokens per row (default: min(2048, the model's max positions))")
    d.add_argument("--pad", action="store_true",
                   help="one example per row, truncated and right-padded to L (default: pack examples into "
                        "full rows)")
    d.add_argument("--data-dtype", choices=["uint16", "uint32"], default="uint16",
                   help="token id type of a .bin file (default uint16)")
    o = p.add_argument_group("optimization")
    o.add_argument("--batch", type=int, default=4, help="micro-batch: rows per step per rank (default 4)")
    o.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    o.add_argument("--lr", type=float, default=1e-5, help="peak learning rate (default 1e-5)")
    o.add_argument("--warmup-ratio", type=float, default=0.05,
                   help="linear LR warm-up as a fraction of --steps (default 0.05)")
    o.add_argument("--warmup-steps", type=int, default=None, help="LR warm-up steps (overrides --warmup-ratio)")
    o.add_argument("--min-lr-ratio", type=float, default=0.0,
                   help="the cosine decay ends at this fraction of --lr (default 0)")
    o.add_argument("--weight-decay", type=float, default=0.01,
                   help="AdamW weight decay on matrices (default 0.01)")
    o.add_argument("--betas", type=_pair, default=(0.9, 0.999), help="Adam betas (default 0.9,0.999)")
    o.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clipping; 0 disables (default 1.0)")
    o.add_argument("--precision", "--dtype", dest="precision", choices=["bf16", "fp16", "fp32"], default="bf16",
                   help="precision of the device weights (default bf16; --dtype is its old name)")
    o.add_argument("--no-checkpointing", action="store_true", help="no activation checkpointing")
    o.add_argument("--seed", type=int, default=42, help="seed of the data order and zoo weights (default 42)")
    c = p.add_argument_group("checkpoints and output")
    c.add_argument("--save-every", type=int, default=0, metavar="K",
                   help="checkpoint every K steps (default 0: only at the end)")
    c.add_argument("--keep-checkpoints", type=int, default=2, help="newest checkpoints kept (default 2)")
    c.add_argument("--resume", action="store_true",
                   help="continue from DIR's newest intact checkpoint, bit-exactly (same settings required); "
                        "at --steps: write a missing final/ and record.json")
    c.add_argument("--stop-after", type=int, default=None, metavar="K",
                   help="stop after step K with a checkpoint, as a pre-emption would (continue with --resume)")
    c.add_argument("--save-dtype", choices=["auto", "bf16", "fp16", "fp32"], default="auto",
                   help="dtype of DIR/final's weights, cast from the fp32 master (default auto: the dtype the "
                        "model was stored in, else --precision)")
    m = p.add_argument_group("machine and reporting")
    m.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    m.add_argument("--threads", type=int, default=None, help="host threads for torch (default: torch's default)")
    m.add_argument("--hardware", default=None,
                   help="planner profile: a preset name or a `superoffload calibrate` JSON (default: from the device)")
    m.add_argument("--no-plan", action="store_true", help="engine defaults instead of the planner's plan")
    m.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (default: GPU table or "
                   "measured CPU matmul peak)")
    m.add_argument("--log-every", type=int, default=10, metavar="K",
                   help="without a terminal: one log line every K steps (default 10)")
    m.add_argument("--timing-warmup", type=int, default=2,
                   help="first steps of the process excluded from throughput and MFU (default 2)")
    m.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from superoffload.finetune import FinetuneConfig, FinetuneInputError, prepare, train

    cfg = FinetuneConfig(
        model=args.model, data=args.data, steps=args.steps, out=args.out, config=args.config,
        max_length=args.max_length, pad=args.pad, batch=args.batch, grad_accum=args.grad_accum, lr=args.lr,
        warmup_ratio=args.warmup_ratio, warmup_steps=args.warmup_steps, min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay, betas=args.betas, grad_clip=args.grad_clip, precision=args.precision,
        save_dtype=args.save_dtype, activation_checkpointing=not args.no_checkpointing, seed=args.seed,
        save_every=args.save_every, keep_checkpoints=args.keep_checkpoints, resume=args.resume,
        stop_after=args.stop_after, log_every=args.log_every, timing_warmup=args.timing_warmup,
        device=args.device, threads=args.threads, hardware=args.hardware, plan=not args.no_plan,
        peak_flops=args.peak_flops, data_dtype=args.data_dtype, progress=not args.no_progress)
    try:
        prepared = prepare(cfg)
        rec = train(prepared)
    except FinetuneInputError as e:
        print("superoffload finetune: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    finally:
        _leave_process_group()
    if prepared.rank == 0:
        print(summary_line(rec))
    if rec["status"] == "preempted":  # checkpointed at the step it stopped: a requeue resumes it
        return int(rec["system_stats"]["finetune"]["exit_code"])
    return 0 if rec["status"] == "ok" else 1


def _leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def summary_line(rec: dict) -> str:
    ft = rec["system_stats"]["finetune"]
    head = f"finetune {rec['model']['name']} ({ft['model_kind']}), {len(rec['losses'])} steps"
    if rec["status"] != "ok":
        return f"{head}: {rec['status'].upper()}: {(rec['error'] or '').splitlines()[0]}"
    losses = [v for v in rec["losses"] if v is not None]
    tp = rec["throughput"]
    perf = (f"{tp['tokens_per_s']:.0f} tok/s, {tp['model_tflops']:.3g} TFLOPS, MFU {100 * tp['mfu']:.1f}%"
            if tp else "no timed steps")
    where = ft["final_dir"] or ft["checkpoint"]
    loss = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no finite loss"
    return f"{head}: {loss}, {perf}; saved {where}"
