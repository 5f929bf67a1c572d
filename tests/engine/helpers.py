"""Shared pieces of the engine tests: a reference synchronous loop and state comparison."""

from __future__ import annotations

import torch

import grace_adam
import superoffload
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPT = {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


def make_model(name: str = "gpt-tiny", seq: int = 32, seed: int = 0) -> torch.nn.Module:
    return build_model(get_shape(name), seq=seq, seed=seed)


def batches(name: str = "gpt-tiny", seq: int = 32, batch: int = 2, accum: int = 1, seed: int = 1):
    return SyntheticData(get_shape(name).vocab, seq, batch, grad_accum=accum, seed=seed)


def train_engine(model, cfg: dict, steps: int, data, hook=None) -> tuple[superoffload.SuperOffloadEngine, list]:
    """Train through the engine; `hook(engine, step)` runs before each step (schedules, injections)."""
    engine = superoffload.initialize(model, cfg)
    losses = []
    for i in range(steps):
        if hook:
            hook(engine, i)
        b = data.batch_at(i)
        for x, y in zip(b.inputs, b.targets, strict=True):
            loss = engine(x, y)
            engine.backward(loss)
            losses.append(loss.item())
        engine.step()
    engine.synchronize()
    return engine, losses


def train_reference(model, precision: str, steps: int, data, opt: dict = OPT, accum: int = 1) -> tuple[dict, list]:
    """The plain synchronous loop the engine must equal bit for bit: bf16/fp16/fp32 weights on the
    "device", fp32 master + m + v on the host, one GraceAdam call per parameter after backward."""
    params = dict(model.named_parameters())
    master = {n: p.detach().float().reshape(-1).clone() for n, p in params.items()}
    m = {n: torch.zeros_like(t) for n, t in master.items()}
    v = {n: torch.zeros_like(t) for n, t in master.items()}
    model.to(DT[precision])
    losses = []
    for i in range(steps):
        b = data.batch_at(i)
        for x, y in zip(b.inputs, b.targets, strict=True):
            loss = model(x, y)
            (loss / accum if accum > 1 else loss).backward()
            losses.append(loss.item())
        for n, p in params.items():
            if p.grad is None:
                continue
            grace_adam.adam_step(master[n], p.grad.float().reshape(-1), m[n], v[n], step=i + 1, lr=opt["lr"],
                                 beta1=opt["betas"][0], beta2=opt["betas"][1], eps=opt["eps"],
                                 weight_decay=opt["weight_decay"] if p.dim() >= 2 else 0.0)
            with torch.no_grad():
                p.copy_(master[n].view(p.shape))
            p.grad = None
    return {"master": master, "exp_avg": m, "exp_avg_sq": v}, losses


def assert_state_equal(a: dict, b: dict) -> None:
    """Two engine state_dicts hold bit-identical masters, moments, step counts and loss scale."""
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        for k, va in a["params"][name].items():
            vb = b["params"][name][k]
            if isinstance(va, torch.Tensor):
                assert torch.equal(va, vb), f"{name}.{k} differs"
            else:
                assert va == vb, f"{name}.{k}: {va} != {vb}"
    assert a["loss_scale"] == b["loss_scale"]
