"""Convergence check: the engine and plain torch train gpt-tiny on the same real text; the loss curves
must coincide.

    python -m superoffload.finetune.convergence --out results/convergence.json [--steps 300]

Corpus: a fixed list of Python standard library modules read from this interpreter's own install
(``sysconfig.get_paths()["stdlib"]``), so it exists wherever the project installs and nothing is
downloaded; tokenized with the byte-level tokenizer (``superoffload.finetune.tokenizer``) into a .bin of
uint16 ids. The exact bytes depend on the Python version; the result file records the files, their
total size and sha256.

Both runs start from the same weights (``build_model`` with one seed), read the same rows in the same
order (``superoffload.finetune.data.TrainData``), use the same loss (token-mean cross-entropy), fp32,
AdamW with the same hyper-parameters and weight-decay split, global-norm clipping at 1.0 and the same
warm-up + cosine schedule:

- ``superoffload``: ``superoffload.finetune.run_finetune`` (the `finetune` command's own loop), the
  planner's plan with speculation forced on (``speculation: true``,
  ``speculation_policy.max_rollback_rate: 1.0``), so every step speculates during backward and is
  validated after it; when clipping fires, the speculative step is rolled back and redone;
- ``torch``: ``torch.optim.AdamW(fused=True)`` with ``torch.nn.utils.clip_grad_norm_``.

GraceAdam and torch's fused AdamW agree to a few ulps per step (docs/grace_adam.md); training amplifies
such differences chaotically but without bias, so the curves should agree to a few 1e-3 relative. The
result (``convergence.schema.json``) holds both curves and their maximum differences.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import math
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

CORPUS_FILES = ("textwrap.py", "heapq.py", "bisect.py", "difflib.py", "argparse.py")
RESULT_KIND = "convergence"
DEFAULTS = dict(steps=300, seq=128, batch=8, lr=1e-3, warmup=20, weight_decay=0.1, betas=(0.9, 0.95),
                eps=1e-8, grad_clip=1.0, seed=1234, model="gpt-tiny")
ENGINE_OVERRIDES = {"speculation": True, "speculation_policy": {"max_rollback_rate": 1.0}}


# ------------------------------------------------------------------------------------------ corpus
def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in CORPUS_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"standard library source not found: {', '.join(missing)} (a Python install "
                                f"without .py sources?)")
    return files


def build_corpus(out: Path) -> dict[str, Any]:
    """Write the byte-level token file of the corpus to ``out``; return its description."""
    from superoffload.finetune.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    files = corpus_files()
    ids: list[int] = []
    for f in files:
        ids += tok.encode(f.read_text(encoding="utf-8")) + [tok.eos_id]
    arr = np.asarray(ids, dtype=np.uint16)
    arr.tofile(out)
    return {"files": [f.name for f in files], "stdlib": str(files[0].parent), "tokens": int(arr.size),
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest(), "tokenizer": tok.name,
            "python": sys.version.split()[0]}


# ------------------------------------------------------------------------------------------ the two runs
def run_superoffload(data: Path, out: Path, s: dict[str, Any]) -> tuple[list[float], dict[str, Any], float]:
    from superoffload.finetune.train import FinetuneConfig, run_finetune

    t0 = time.perf_counter()
    rec = run_finetune(FinetuneConfig(
        model=s["model"], data=str(data), steps=s["steps"], out=str(out), config=ENGINE_OVERRIDES,
        max_length=s["seq"], batch=s["batch"], lr=s["lr"], warmup_steps=s["warmup"], weight_decay=s["weight_decay"],
        betas=tuple(s["betas"]), eps=s["eps"], grad_clip=s["grad_clip"], dtype="fp32", save_dtype="fp32",
        activation_checkpointing=False, seed=s["seed"], progress=False, print_plan=False, timing_warmup=0))
    if rec["status"] != "ok":
        raise RuntimeError(f"the superoffload run failed: {rec['error']}")
    return [float(v) for v in rec["losses"]], rec, time.perf_counter() - t0


def run_torch(data: Path, s: dict[str, Any]) -> tuple[list[float], torch.nn.Module, float]:
    from superoffload.engine.params import decay_groups
    from superoffload.finetune.data import TrainData, load_rows
    from superoffload.finetune.model import load_model
    from superoffload.finetune.schedule import WarmupCosine, make_scheduler
    from superoffload.finetune.train import learned_tokens, step_loss_parts

    t0 = time.perf_counter()
    loaded = load_model(s["model"], seed=s["seed"], activation_checkpointing=False)
    model = loaded.module
    rows = load_rows(data, loaded.tokenizer, max_length=s["seq"], pad=False, seed=s["seed"], vocab=loaded.shape.vocab)
    batches = TrainData(rows, s["batch"], 1, s["seed"])
    opt = torch.optim.AdamW(decay_groups(model.parameters(), s["weight_decay"]), lr=s["lr"], betas=tuple(s["betas"]),
                            eps=s["eps"], fused=True)
    sched = make_scheduler(opt, WarmupCosine(total=s["steps"], warmup=s["warmup"]))
    losses = []
    for step in range(s["steps"]):
        [(x, y)] = batches.step_batches(step)
        total = max(1, learned_tokens([(x, y)]))
        loss_sum = step_loss_parts(loaded.logits(model, x), y)
        (loss_sum / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss_sum.detach().double()) / total)
    return losses, model, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ comparison
def compare(a: list[float], b: list[float]) -> dict[str, Any]:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    rel = [d / max(abs(y), 1e-12) for d, y in zip(diffs, b, strict=True)]
    i, j = max(range(len(diffs)), key=diffs.__getitem__), max(range(len(rel)), key=rel.__getitem__)
    return {"max_abs_diff": diffs[i], "max_abs_diff_step": i + 1, "max_rel_diff": rel[j], "max_rel_diff_step": j + 1,
            "mean_abs_diff": sum(diffs) / len(diffs), "identical_steps": sum(d == 0 for d in diffs)}


def weights_diff(final_dir: Path, model: torch.nn.Module) -> dict[str, float]:
    from safetensors.torch import load_file

    saved = load_file(str(final_dir / "model.safetensors"))
    params = dict(model.named_parameters())
    diffs = [(saved[n].float() - params[n].detach().float()).abs() for n in saved]
    return {"weights_max_abs_diff": max(float(d.max()) for d in diffs),
            "weights_mean_abs_diff": float(sum(d.sum() for d in diffs) / sum(d.numel() for d in diffs))}


def check(steps: int | None = None, tolerance_rel: float = 5e-3, threads: int | None = None,
          workdir: Path | None = None) -> dict[str, Any]:
    """Run both trainings and return the result object (``convergence.schema.json``)."""
    s = dict(DEFAULTS)
    if steps is not None:
        s["steps"] = steps
        s["warmup"] = min(s["warmup"], max(1, steps // 10))
    if threads:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        data = tmp / "corpus.bin"
        corpus = build_corpus(data)
        so_losses, rec, so_s = run_superoffload(data, tmp / "superoffload", s)
        torch_losses, model, torch_s = run_torch(data, s)
        wd = weights_diff(tmp / "superoffload" / "final", model)
    cmp = compare(so_losses, torch_losses)
    cmp.update(wd, tolerance_rel=tolerance_rel, within_tolerance=cmp["max_rel_diff"] <= tolerance_rel)
    spec = rec.get("rollbacks") or {}
    return {
        "kind": RESULT_KIND, "schema_version": 1, "status": "ok",
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "corpus": corpus,
        "settings": {**s, "betas": list(s["betas"]), "dtype": "fp32", "tokens_per_step": s["seq"] * s["batch"],
                     "schedule": "linear warm-up + cosine to 0", "superoffload_config": ENGINE_OVERRIDES,
                     "superoffload_plan": rec["plan"]["hardware"] if rec.get("plan") else None,
                     "torch_optimizer": "torch.optim.AdamW(fused=True) + clip_grad_norm_"},
        "curves": {"superoffload": so_losses, "torch": torch_losses},
        "comparison": cmp,
        "speculation": {k: spec.get(k, 0) for k in ("steps", "speculated", "committed", "rolled_back", "clipped",
                                                      "skipped", "validate_first")},
        "timing_s": {"superoffload": so_s, "torch": torch_s},
        "provenance": rec["provenance"],
    }


def summary(result: dict[str, Any]) -> str:
    c, s = result["comparison"], result["settings"]
    curves = result["curves"]
    return (f"convergence: {s['model']}, {s['steps']} steps of {s['tokens_per_step']} tokens on "
            f"{result['corpus']['tokens']:,} bytes of stdlib source: loss {curves['torch'][0]:.4f} -> "
            f"{curves['torch'][-1]:.4f} (torch) / {curves['superoffload'][-1]:.4f} (superoffload); "
            f"max |dloss| {c['max_abs_diff']:.3g} at step {c['max_abs_diff_step']}, max relative "
            f"{c['max_rel_diff']:.3g} (tolerance {c['tolerance_rel']:g}: "
            f"{'within' if c['within_tolerance'] else 'EXCEEDED'}); weights max |d| {c['weights_max_abs_diff']:.3g}; "
            f"speculated {result['speculation']['speculated']}, rolled back {result['speculation']['rolled_back']}")


def main(argv: list[str] | None = None) -> int:
    from superoffload.harness.record import write_result

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="result JSON (convergence.schema.json)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help=f"steps (default {DEFAULTS['steps']})")
    p.add_argument("--tolerance", type=float, default=5e-3,
                   help="maximum relative loss difference accepted (default 5e-3)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: with 2 threads on a shared 2-core machine, torch's OpenMP "
                        "barriers stalled one 300-step run for minutes; the check is about numbers, not speed)")
    a = p.parse_args(argv)
    if a.steps < 1:
        print("convergence: error: --steps must be >= 1", file=sys.stderr)
        return 2
    result = check(a.steps, a.tolerance, a.threads)
    write_result(a.out, result, RESULT_KIND)
    print(summary(result))
    return 0 if result["comparison"]["within_tolerance"] and all(map(math.isfinite, result["curves"]["superoffload"])) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
