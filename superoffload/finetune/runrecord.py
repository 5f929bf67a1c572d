"""The run record of a fine-tuning run: a `superoffload bench run` record, built by the same module.

``DIR/record.json`` follows ``superoffload/harness/record.schema.json`` and is built by
``superoffload.harness.record`` (``new_record``, ``record_steps``, ``timing_block``, ``throughput_block``),
so ``superoffload bench compare`` and the report read it like any run and a new metric reaches both kinds
of record at once. Differences, all inside the schema:

- ``losses`` holds every optimizer step of the run, restored ones included after ``--resume``;
  ``timing`` covers this process's steps after its first ``run.warmup`` (excluded) steps;
  ``run.warmup + run.steps`` is the run's total number of steps; throughput is from this rank's median.
- ``system_stats.finetune`` describes the fine-tuning: model source and precision, tokenizer, data (file,
  sha256, format, rows, learned tokens), LR schedule, checkpoints, resume point, final directory.
"""

from __future__ import annotations

from typing import Any

from superoffload.harness import record
from superoffload.harness.system import RunConfig
from superoffload.shapes import ModelShape


def finish_record(rec: dict[str, Any], *, run: RunConfig, shape: ModelShape, losses: list[float | None],
                  times: list[float], warmup: int, peak_flops: tuple[float, str] | None,
                  peak_device_bytes: int | None, skipped: list[bool] | None = None) -> dict[str, Any]:
    """Fill losses (None: no learned token; NaN/Inf: marked in ``loss_nonfinite``), the skipped steps,
    timing, throughput and memory; a run that skipped most steps is an error; validate against the schema."""
    record.record_steps(rec, losses, skipped)
    rec["memory"] = record.memory_block(peak_device_bytes)
    if rec["status"] == "ok" and times[warmup:]:
        rec["timing"] = record.timing_block(times, warmup)
        if peak_flops is not None:
            rec["throughput"] = record.throughput_block(run, shape, rec["timing"]["median_s"], *peak_flops)
    record.validate(rec)
    return rec
