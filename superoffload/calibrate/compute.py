"""Profile the compute of named workloads: the harness's own model, forward and backward, on this device.

The op-level compute terms of the cost model (GEMM and attention curves, elementwise traffic, per-op
dispatch) are built from microbenchmarks that know nothing of the model; on a small model on a CPU
they miss the strided copies of the attention reshapes, the loss, small-head-dim attention and the
like, 15-35 % of a forward. ``calibrate --workloads`` therefore also times the model itself, the way
profile-guided planners do (one profile per workload; the cost model still does every transfer, host
step, overlap and system overhead). The block and the embedding + head are separated by timing the
model at its own depth L (at most MAX_PROFILED_LAYERS, so a large model's profile fits beside its
activations) and at one block:

    block = (t(L blocks) - t(1 block)) / (L - 1),    top = t(1 block) - block

so nothing is scaled from a different width, sequence or batch. A profile key names the model, the
micro-batch and the precision unless fp32 (``planner.hardware.workload_key``; ``--dtype fp32,bf16`` profiles
both); the cost model uses an entry only when its shape signature (``planner.hardware.shape_signature``) and
precision match the workload's, and falls back to the op-level terms otherwise (always, for the presets).
``superoffload validate`` reports both.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from superoffload.options import PRECISIONS, torch_dtype
from superoffload.planner.hardware import shape_signature, workload_key
from superoffload.shapes import ModelShape, get_shape

MAX_PROFILED_LAYERS = 8
PROFILE_BYTES_PER_PARAM = 8  # fp32 weights + grads (activations of a profiled micro-batch come on top)
MIN_ITERS, MAX_ITERS, TARGET_S = 5, 40, 1.5  # timed iterations per model: about TARGET_S seconds of them


def mlp_step_timer(rows: int, iters: int) -> Any:
    """A timer of a training step's kind of compute, for measuring what runs beside it slows: a small MLP's
    forward and backward, `iters` times on `rows` rows; each call returns its seconds."""
    import torch

    x = torch.randn(rows, 256)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))

    def compute() -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            net(x).sum().backward()
        return time.perf_counter() - t0

    return compute


def parse_workloads(text: str) -> list[tuple[str, int, int]]:
    """``MODEL:SEQ:BATCH[,...]`` -> [(model, seq, batch)]; raises ValueError saying what to change."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"--workloads item {item!r}: write MODEL:SEQ:BATCH, e.g. gpt-tiny:128:2")
        model, seq, batch = parts
        try:
            s, b = int(seq), int(batch)
        except ValueError:
            raise ValueError(f"--workloads item {item!r}: SEQ and BATCH must be integers") from None
        if s < 1 or b < 1:
            raise ValueError(f"--workloads item {item!r}: SEQ and BATCH must be >= 1")
        out.append((model, s, b))
    if not out:
        raise ValueError("--workloads is empty: give MODEL:SEQ:BATCH[,...]")
    return out


def _time_model(shape: ModelShape, seq: int, batch: int, device: Any, dtype: str,
                sync: Any) -> tuple[float, float]:
    """Median forward and backward seconds of the harness's model (loss included) at this shape, its weights
    in the training precision as the SuperOffload engine trains it (and DeepSpeed's bf16 mode). Not under
    autocast, which keeps fp32 weights and casts them for every op: on the 2-core Xeon that made gpt-small's
    bf16 compute 37-66 % slower than the engine's (torch DDP, the `torch` system, does train under autocast)."""
    import torch

    from superoffload.engine.engine import place_in_precision
    from superoffload.harness.models import build_model

    model = place_in_precision(build_model(shape, seq=seq, seed=0), device, torch_dtype(dtype))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, shape.vocab, (batch, seq), generator=g).to(device)
    y = torch.randint(0, shape.vocab, (batch, seq), generator=g).to(device)
    fwd, bwd = [], []
    deadline = None
    for i in range(3 + MAX_ITERS):  # 3 warm-up iterations: allocator, autograd graph, kernel selection
        sync()
        t0 = time.perf_counter()
        loss = model(x, y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if i < 3:
            continue
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        deadline = deadline or t0 + TARGET_S
        if len(fwd) >= MIN_ITERS and time.perf_counter() > deadline:
            break
    del model
    return statistics.median(fwd), statistics.median(bwd)


def profile_workload(shape: ModelShape, seq: int, batch: int, device: str = "cpu",
                     dtype: str = "fp32") -> dict[str, Any]:
    """One profile entry: forward/backward seconds of one block and of the rest (embedding, final norm,
    head, loss), from the model at its depth and at one block (two blocks when it has one)."""
    import torch

    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    deep = _profiled(shape)
    shallow = 1 if deep.layers > 1 else 2
    deep_f, deep_b = _time_model(deep, seq, batch, device, dtype, sync)
    one_f, one_b = _time_model(dataclasses.replace(shape, layers=shallow), seq, batch, device, dtype, sync)
    span = deep.layers - shallow
    block_f, block_b = (deep_f - one_f) / span, (deep_b - one_b) / span
    # a negative difference is noise on a model whose blocks cost next to nothing: clamp, never extrapolate
    block_f, block_b = max(block_f, 0.0), max(block_b, 0.0)
    top_f = max(0.0, one_f - shallow * block_f)
    top_b = max(0.0, one_b - shallow * block_b)
    return {"shape": shape_signature(shape), "dtype": dtype, "device": device.type,
            "block_fwd_s": block_f, "block_bwd_s": block_b, "top_fwd_s": top_f, "top_bwd_s": top_b,
            "profiled_layers": [deep.layers, shallow], "model_fwd_s": deep_f, "model_bwd_s": deep_b}


def _profiled(shape: ModelShape) -> ModelShape:
    return dataclasses.replace(shape, layers=min(shape.layers, MAX_PROFILED_LAYERS))


def parse_dtypes(text: str) -> list[str]:
    """``fp32`` or ``fp32,bf16``: the precisions to profile --workloads in; ValueError naming a bad one."""
    dtypes = list(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    bad = [d for d in dtypes if d not in PRECISIONS]
    if bad or not dtypes:
        raise ValueError(f"--dtype: each of {', '.join(PRECISIONS)} (comma-separated), not {text!r}")
    return dtypes


def check_workloads(workloads: list[tuple[str, int, int]], dtype: str,
                    memory_bytes: float = float("inf")) -> dict[str, ModelShape]:
    """Shapes of the named models; ValueError (saying what to change) for an unknown model or dtype (one, or
    several comma-separated)."""
    parse_dtypes(dtype)
    shapes = {}
    for m, _, _ in workloads:
        try:
            shapes[m] = get_shape(m)
        except (KeyError, ValueError) as e:
            raise ValueError(f"--workloads: {e}") from None
    for m, shape in shapes.items():
        need = PROFILE_BYTES_PER_PARAM * _profiled(shape).total_params()
        if need > memory_bytes:
            raise ValueError(f"--workloads: {m} needs about {need / 2**30:.1f} GiB to profile (fp32 weights and "
                             f"grads), more than the {memory_bytes / 2**30:.1f} GiB here; profile a smaller model")
    return shapes


def profile_workloads(workloads: list[tuple[str, int, int]], device: str, dtype: str,
                      memory_bytes: float = float("inf")) -> dict[str, dict[str, Any]]:
    """Every workload profiled in each precision of ``dtype`` (``fp32`` or ``fp32,bf16``)."""
    shapes = check_workloads(workloads, dtype, memory_bytes)
    return {workload_key(m, s, b, d): profile_workload(shapes[m], s, b, device, d)
            for d in parse_dtypes(dtype) for m, s, b in workloads}
