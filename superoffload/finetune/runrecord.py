"""The run record of a fine-tuning run: the same schema and helpers as `superoffload bench run`.

``DIR/record.json`` follows ``superoffload/harness/record.schema.json`` and is built from the same parts
as the runner's records (``stats.summarize`` for timing, ``flops.throughput`` and ``peak.resolve_peak``
for tokens/s, TFLOPS, MFU and HFU, ``provenance.collect``, ``record.write_record`` to validate and write
it atomically), so ``superoffload bench compare`` and the report read it like any run. Differences, all
inside the schema:

- ``losses`` holds every optimizer step of the run, restored ones included after ``--resume``;
  ``timing`` covers this process's steps after its first ``run.warmup`` (excluded) steps;
  ``run.warmup + run.steps`` is the run's total number of steps.
- ``system_stats.finetune`` describes the fine-tuning: model source and dtype, tokenizer, data (file,
  sha256, format, rows, learned tokens), LR schedule, checkpoints, resume point, final directory.
"""

from __future__ import annotations

import datetime as _dt
import resource
from typing import Any

import torch

from superoffload.harness import flops, peak, provenance, record
from superoffload.harness.stats import summarize
from superoffload.harness.system import RunConfig
from superoffload.shapes import ModelShape


def model_block(shape: ModelShape, params: int) -> dict[str, Any]:
    return {"name": shape.name, "params": params, "matmul_params": shape.matmul_params(),
            "shape_params": shape.total_params(), "layers": shape.layers, "hidden": shape.hidden,
            "heads": shape.heads, "vocab": shape.vocab, "ffn_hidden": shape.ffn_hidden,
            "kv_heads": shape.n_kv_heads, "family": shape.family}


def host_peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def new_record(run: RunConfig, shape: ModelShape, params: int, rank: int, device_name: str) -> dict[str, Any]:
    return {
        "schema_version": 1, "status": "ok", "error": None, "system": "superoffload",
        "model": model_block(shape, params),
        "run": {**run.to_dict(), "global_batch": run.global_batch, "tokens_per_step": run.tokens_per_step,
                "rank": rank},
        "timing": None, "losses": [], "throughput": None, "memory": {}, "telemetry": None,
        "system_stats": None, "rollbacks": None, "plan": None,
        "provenance": provenance.collect(device_name),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def finish_record(rec: dict[str, Any], *, run: RunConfig, shape: ModelShape, losses: list[float | None],
                  times: list[float], warmup: int, peak_flops: tuple[float, str] | None,
                  peak_device_bytes: int | None, skipped: list[bool] | None = None) -> dict[str, Any]:
    """Fill losses (None: no learned token; NaN/Inf: marked in ``loss_nonfinite``), the skipped steps,
    timing, throughput and memory; a run that skipped most steps is an error; validate against the schema."""
    finite = [v is not None and v == v and abs(v) != float("inf") for v in losses]
    rec["losses"] = [v if ok else None for v, ok in zip(losses, finite, strict=True)]
    rec["loss_nonfinite"] = [v is not None and not ok for v, ok in zip(losses, finite, strict=True)]
    rec["step_skipped"] = skipped
    verdict = record.nonfinite_verdict(skipped)
    if verdict and rec["status"] == "ok":
        rec["status"], rec["error"] = "error", verdict
    rec["memory"] = {"peak_device_bytes": peak_device_bytes, "peak_host_rss_bytes": host_peak_rss()}
    timed = times[warmup:]
    if rec["status"] == "ok" and timed:
        rec["timing"] = {"step_times_s": timed, "warmup_times_s": times[:warmup], **summarize(timed)}
        if peak_flops is not None:
            value, source = peak_flops
            tp = flops.throughput(shape, run.seq, run.batch * run.grad_accum * run.seq, rec["timing"]["median_s"],
                                  value, run.activation_checkpointing)
            rec["throughput"] = {
                "tokens_per_s": tp.tokens_per_s, "model_tflops": tp.model_tflops,
                "hardware_tflops": tp.hardware_tflops, "mfu": tp.mfu, "hfu": tp.hfu,
                "peak_flops": value, "peak_flops_source": source,
                "model_flops_per_token": flops.model_flops_per_token(shape, run.seq),
                "hardware_flops_per_token": flops.hardware_flops_per_token(shape, run.seq,
                                                                           run.activation_checkpointing),
            }
    record.validate(rec)
    return rec


def resolve_peak(device: torch.device, dtype: torch.dtype, override: float | None) -> tuple[float, str]:
    return peak.resolve_peak(device, dtype, override)
