"""Calibrate each training system's per-step machinery on a degenerate model.

What the cost model does not see of a system (DeepSpeed's and FSDP2's hooks, flattening and
communication layer even at world size 1, the SuperOffload engine's per-bucket Python work) is
measured here, never on the models that ``validate`` checks. The fit:

    overhead = fixed + per_layer * blocks + per_tensor * parameter tensors + per_bucket * buckets
               + per_param * parameters

- **Model**: a tiny LM of ``blocks`` blocks, each ``per_block`` 8-wide Linear layers, trained by the
  system exactly as the harness trains it; each configuration changes one count at a time.
- **Net of the model**: from each step time we subtract what the cost model charges separately for
  the same model (its plain forward + backward, measured; for torch-AdamW systems the optimizer's
  per-tensor loop). ``per_param`` is the slope between the same two-block model WIDE_A and WIDE_B wide
  (the state is out of cache in both, as in the validated models), less what the cost model itself
  charges per parameter (copies, casts, Adam).
- **Isolation**: each system runs in a subprocess of its own, so a DeepSpeed or process-group failure
  costs that system only (it is then left out, and the profile's notes say why).
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from superoffload.catalog import REFERENCE
from superoffload.planner.systems import SYSTEMS as MODELLED

WIDTH, WIDE_A, WIDE_B, VOCAB, SEQ = 8, 512, 2048, 16, 4
# (blocks, Linear layers per block, SuperOffload bucket size in params); WIDE is BASE's structure with one
# bucket at widths WIDE_A and WIDE_B
# Each variant adds enough (8 blocks, 28 tensors) that its difference to BASE stands well above the
# step-to-step noise of a DeepSpeed step on a small shared host (about 1-2 ms).
BASE, MORE_BLOCKS, MORE_TENSORS, MORE_BUCKETS = (2, 1, 1 << 20), (10, 1, 1 << 20), (2, 8, 1 << 20), (2, 8, 32)
WIDE = (2, 1, 1 << 24)
# stages the cost model charges per parameter (everything but the compute of forward and backward)
PER_PARAM_STAGES = ("d2h", "h2d", "host_adam", "host_cast", "host_commit", "host_copy_wait", "device_cast",
                    "device_copy", "device_adam", "weight_fetch")
# every system the cost model compares but the reference, whose step is the model and its optimizer alone: the
# cost model charges both itself (superoffload/catalog.py)
SYSTEMS = tuple(s for s in MODELLED if s != REFERENCE)
TORCH_ADAM_SYSTEMS = ("fsdp_offload",)  # the cost model charges torch.optim's per-tensor loop itself


class DegenerateLM(nn.Module):
    """Embedding -> ``blocks`` x (``per_block`` Linear(width, width)) -> untied head; ``forward(idx,
    targets)`` returns the loss like the harness's models. ``blocks`` is what FSDP wraps per unit."""

    def __init__(self, blocks: int, per_block: int, width: int = WIDTH) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(nn.Sequential(*(nn.Linear(width, width) for _ in range(per_block)))
                                    for _ in range(blocks))
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(x).view(-1, VOCAB), targets.view(-1))


def param_tensors(blocks: int, per_block: int) -> int:
    return 2 + 2 * blocks * per_block  # embedding, head, weight + bias per Linear


def param_count(blocks: int, per_block: int, width: int = WIDTH) -> int:
    return 2 * VOCAB * width + blocks * per_block * (width * width + width)


BATCHES = 64  # distinct batches a measurement cycles through


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random batches, a different one each step. On one fixed batch the degenerate model memorizes it
    within a few steps, its gradients shrink towards zero and Adam's moments into fp32 subnormals, which
    x86 cores process many times slower (benchmarks/calibration_batches.py; numbers in docs/results.md);
    the validated runs never see that."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, VOCAB, (1, SEQ), generator=g), torch.randint(0, VOCAB, (1, SEQ), generator=g))
            for _ in range(BATCHES)]


def _median_step(fn: Any, steps: int) -> float:
    """The median step, the statistic run records report (a minimum would catch a DeepSpeed step on a
    lucky schedule of its worker threads and process, which the validated runs do not see)."""
    for _ in range(3):
        fn()  # warm-up: hooks installed lazily, allocator, first optimizer step
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_backward_s(blocks: int, per_block: int, steps: int = 30, width: int = WIDTH) -> float:
    """The plain autograd work of the degenerate model: what the cost model's compute terms cover."""
    torch.manual_seed(0)
    m = DegenerateLM(blocks, per_block, width)
    batches = itertools.cycle(_batches())

    def fb() -> None:
        x, y = next(batches)
        m(x, y).backward()
        m.zero_grad(set_to_none=True)

    return _median_step(fb, steps)


def system_step_s(system: str, blocks: int, per_block: int, bucket: int, steps: int = 30,
                  optimizer_tensor_s: float = 0.0, width: int = WIDTH) -> tuple[float, int]:
    """(step seconds minus the separately modelled work, SuperOffload host+device buckets or 0)."""
    from superoffload.harness.system import Batch, RunConfig
    from superoffload.harness.systems import create_system
    from superoffload.shapes import ModelShape

    torch.manual_seed(0)
    model = DegenerateLM(blocks, per_block, width)
    shape = ModelShape(name="degenerate", layers=blocks, hidden=width, heads=1, vocab=VOCAB, ffn_hidden=width,
                       max_seq=SEQ)
    cuda = torch.cuda.is_available()
    opts: dict[str, Any] = {}
    if system == "superoffload":
        # the plan's CPU rule (no speculation when the device is the host); explicit bucket size
        opts = {"plan": False, "bucket_size": bucket, "speculation": cuda}
    run = RunConfig(system=system, model="gpt-tiny", seq=SEQ, batch=1, grad_clip=1.0,
                    device="cuda" if cuda else "cpu", threads=torch.get_num_threads(), system_options=opts)
    sysobj = create_system(system)
    sysobj.setup(model, shape, run)
    batches = itertools.cycle([Batch([x], [y]) for x, y in _batches()])

    def step() -> None:
        sysobj.step(next(batches))
        if cuda:
            torch.cuda.synchronize()

    try:
        t = _median_step(step, steps)
        stats = sysobj.stats() if system == "superoffload" else {}
    finally:
        sysobj.teardown()
    buckets = int(stats.get("buckets_host", 0)) + int(stats.get("buckets_device", 0))
    t -= forward_backward_s(blocks, per_block, width=width)
    if system in TORCH_ADAM_SYSTEMS:
        t -= optimizer_tensor_s * param_tensors(blocks, per_block)
    return t, buckets


def fit(system: str, optimizer_tensor_s: float = 0.0) -> dict[str, float]:
    """The five coefficients, each from the configuration that changes one count (and, where it must,
    the parameter count, whose slope comes first); clamped at 0: a negative slope is measurement noise,
    not a speed-up."""
    def step(cfg: tuple[int, int, int], width: int = WIDTH) -> tuple[float, int]:
        return system_step_s(system, *cfg, optimizer_tensor_s=optimizer_tensor_s, width=width)

    def params(cfg: tuple[int, int, int]) -> int:
        return param_count(*cfg[:2])

    base, _ = step(BASE)
    # size-dependent work (copies into flat buffers, partitioning, the optimizer): the slope between two
    # wide versions of the same structure; calibrate later takes off what the cost model charges per
    # parameter itself (net_of_model)
    narrow, wide = step(WIDE, WIDE_A)[0], step(WIDE, WIDE_B)[0]
    per_param = max(0.0, (wide - narrow) / (param_count(*WIDE[:2], WIDE_B) - param_count(*WIDE[:2], WIDE_A)))
    tensors, few = step(MORE_TENSORS)
    per_tensor = max(0.0, (tensors - base - per_param * (params(MORE_TENSORS) - params(BASE)))
                     / (param_tensors(*MORE_TENSORS[:2]) - param_tensors(*BASE[:2])))
    # an extra block adds one layer, its tensors and its parameters
    blocks, _ = step(MORE_BLOCKS)
    added = param_tensors(*MORE_BLOCKS[:2]) - param_tensors(*BASE[:2])
    per_layer = max(0.0, (blocks - base - added * per_tensor - per_param * (params(MORE_BLOCKS) - params(BASE)))
                    / (MORE_BLOCKS[0] - BASE[0]))
    per_bucket = 0.0
    if system == "superoffload":
        many, n_many = step(MORE_BUCKETS)  # the same model as MORE_TENSORS, cut into more buckets
        per_bucket = max(0.0, (many - tensors) / max(1, n_many - few))
    fixed = max(0.0, base - BASE[0] * per_layer - param_tensors(*BASE[:2]) * per_tensor - few * per_bucket
                - per_param * params(BASE))
    return {"fixed_s": fixed, "per_layer_s": per_layer, "per_tensor_s": per_tensor, "per_bucket_s": per_bucket,
            "per_param_raw_s": per_param}


def modelled_per_param_s(system: str, hw: Any) -> float:
    """Seconds per parameter the cost model already charges ``system`` outside forward/backward compute
    (copies, casts, Adam), from two GPT shapes of the degenerate widths on the profile ``hw``."""
    import dataclasses

    from superoffload.planner.costmodel import Workload, predict
    from superoffload.planner.systems import Options
    from superoffload.shapes import ModelShape

    bare = dataclasses.replace(hw, system_step_s=None)
    # the degenerate runs train in fp32 (RunConfig's default), so the model is asked about fp32 too
    opts = Options(speculation=torch.cuda.is_available(), bucket_size=WIDE[2], grad_clip=1.0, precision="fp32")
    work = []
    for width in (WIDE_A, WIDE_B):
        shape = ModelShape(name="degenerate", layers=BASE[0], hidden=width, heads=1, vocab=VOCAB,
                           ffn_hidden=width, max_seq=SEQ)
        pred = predict(system, Workload(shape, SEQ, 1, False), bare, opts)
        work.append((shape.total_params(), sum(pred.stage_s.get(k, 0.0) for k in PER_PARAM_STAGES)))
    return max(0.0, (work[1][1] - work[0][1]) / (work[1][0] - work[0][0]))


def net_of_model(hw: Any) -> dict[str, dict[str, float]]:
    """``hw.system_step_s`` with per_param_s = the measured per-parameter slope minus what the cost model
    charges per parameter itself (so nothing is counted twice); the raw slope stays for the record."""
    out = {}
    for system, c in (hw.system_step_s or {}).items():
        raw = c.get("per_param_raw_s", 0.0)
        out[system] = {**c, "per_param_s": max(0.0, raw - modelled_per_param_s(system, hw))}
    return out


def measure(systems: tuple[str, ...] = SYSTEMS, optimizer_tensor_s: float = 0.0,
            timeout_s: float = 180.0) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Each system in a subprocess of its own; returns (coefficients per system, notes)."""
    out: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    for system in systems:
        coeffs, why = _measure_one(system, optimizer_tensor_s, timeout_s)
        if coeffs is None:
            notes.append(f"system step machinery of {system} not measured: {why}")
            continue
        out[system] = coeffs
        notes.append(f"system step machinery of {system} measured on a degenerate {WIDTH}-wide LM "
                     f"(blocks x Linear layers {BASE[:2]}, {MORE_BLOCKS[:2]}, {MORE_TENSORS[:2]})")
    return out, notes


def _measure_one(system: str, optimizer_tensor_s: float, timeout_s: float) -> tuple[dict[str, float] | None, str]:
    cmd = [sys.executable, "-m", "superoffload.calibrate.systems", system, repr(optimizer_tensor_s),
           str(torch.get_num_threads())]  # the subprocess measures at the caller's thread count
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    lines = res.stdout.strip().splitlines()
    try:
        return {k: float(v) for k, v in json.loads(lines[-1]).items()}, ""
    except (IndexError, json.JSONDecodeError, ValueError, AttributeError):
        err = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"rc {res.returncode}: {err[:160]}"


def _main(argv: list[str]) -> int:
    import logging
    import warnings

    logging.disable(logging.WARNING)  # DeepSpeed's info lines would bury the JSON answer
    warnings.filterwarnings("ignore")
    system = argv[0]
    opt_tensor = float(argv[1]) if len(argv) > 1 else 0.0
    if len(argv) > 2:
        from superoffload.calibrate.threads import set_threads

        set_threads(int(argv[2]))
    print(json.dumps(fit(system, opt_tensor)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
