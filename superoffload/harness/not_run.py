"""A point refused before it runs because it cannot fit, kept as a run record: infeasible by design, not an error.

`superoffload bench run` checks memory before it builds anything (the cost model's estimate for the system
against this machine's free device and host memory) and refuses a point that cannot fit with exit status 2
and one line "... needs about X GiB of device memory (...) but Y GiB is available; ...". A sweep that asks
for such a point on purpose (torch, which keeps weights, gradients and AdamW state on the GPU, at a model the
GPU cannot hold) keeps the answer as a record of status "oom" whose error starts "infeasible by design (not
run)", with ``not_run`` saying which check refused it, so every reader shows the point, and as a memory limit:

    python -m superoffload.harness.not_run --message-file ERR --out REC.json --system torch --model gpt-5b \\
        --seq 1024 --batch 8 --precision bf16 --steps 5 --warmup 2 --checkpointing --device cuda

Any other option of bench run is accepted and left out of the record. Exit status 0 when the message was
such a refusal and the record was written; 3 (nothing written) when it was any other failure, which stays the
caller's to report.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from superoffload.harness import record
from superoffload.harness.system import RunConfig
from superoffload.shapes import get_shape

# bench run's memory refusal (cli/bench_run.py, _require): the memory that does not fit and the two sizes
REFUSAL = re.compile(r"needs about (?P<need>[0-9.]+ [GM]iB) of (?P<memory>device|host) memory .*? but "
                     r"(?P<available>[0-9.]+ [GM]iB) is available")
PREFIX = "infeasible by design (not run): "


def refusal(message: str) -> dict[str, str] | None:
    """{memory, need, available} when ``message`` is bench run's memory refusal, else None."""
    m = REFUSAL.search(" ".join(message.split()))
    return m.groupdict() if m else None


def not_run_record(run: RunConfig, message: str, device_name: str = "unknown") -> dict[str, Any] | None:
    """A schema-valid record (status "oom") for a point bench run refused as too large; None when ``message``
    is not that refusal."""
    why = refusal(message)
    if why is None:
        return None
    line = next((x for x in message.splitlines() if "needs about" in x), message).strip()
    line = line.removeprefix("superoffload bench run: error: ")
    shape = get_shape(run.model)
    rec = record.new_record(run, shape, params=shape.total_params(), rank=0, device_name=device_name,
                            status="oom", error=PREFIX + line)
    rec["not_run"] = {"reason": "infeasible", "check": "bench run's memory check (the cost model's estimate "
                      "against this machine's free memory, before anything is built)", **why}
    record.validate(rec)
    return rec


def _device_name(device: str) -> str:
    import torch

    if device in ("cuda", "auto") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    from superoffload.harness.provenance import cpu_model

    return cpu_model()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--message-file", required=True, help="bench run's stderr")
    ap.add_argument("--out", required=True)
    keys = {"--system": str, "--model": str, "--seq": int, "--batch": int, "--steps": int, "--warmup": int,
            "--precision": str, "--device": str, "--grad-clip": float, "--threads": int, "--init-device": str}
    for name, kind in keys.items():
        ap.add_argument(name, type=kind, required=name in ("--system", "--model"))
    ap.add_argument("--checkpointing", action="store_true")
    a, _ = ap.parse_known_args(argv)  # the rest of bench run's options do not change the record's point
    fields = {k.lstrip("-").replace("-", "_") for k in keys}
    given = {k: v for k, v in vars(a).items() if k in fields and v is not None}
    run = RunConfig(**given, activation_checkpointing=a.checkpointing)
    rec = not_run_record(run, Path(a.message_file).read_text(errors="replace"), _device_name(run.device))
    if rec is None:
        print(f"not_run: {a.message_file} is not bench run's memory refusal; nothing written", file=sys.stderr)
        return 3
    record.write_record(a.out, rec)
    print(f"{run.system} {run.model} seq={run.seq}: {rec['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
