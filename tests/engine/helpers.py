"""Shared pieces of the engine tests: a reference synchronous loop and state comparison."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from unittest import mock

import torch

import grace_adam
import superoffload
from superoffload.harness.data import SyntheticData
from superoffload.models import build_model, get_shape

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPT = {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


@contextlib.contextmanager
def device_kernels_on_host() -> Iterator[None]:
    """The host device with the device kernels the simulated device runs (the CUDA backend's): the tail
    buckets' Adam is torch's fused kernel on both, so a host run and a simulated-device run differ only in
    the path a bucket takes (streams, events, copies across the link) and must agree bit for bit. (Left
    alone, the host device steps its tail with GraceAdam, bit-identical to its host buckets, a few ulps from
    torch's fused kernel: tests/engine/test_engine.py.)"""
    import superoffload.engine.engine as engine_mod
    from superoffload.device.kernels import TorchKernels

    real = engine_mod.get_device

    def get_device(kind, budget=None):
        dev = real(kind, budget)
        if dev.kind == "host":
            dev.kernels = TorchKernels()
        return dev

    with mock.patch.object(engine_mod, "get_device", get_device):
        yield


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


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern (so that NaNs compare equal to themselves)."""
    t = t.detach().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def assert_state_equal(a: dict, b: dict) -> None:
    """Two engine state_dicts hold bit-identical masters, moments, step counts and loss scale."""
    from superoffload.engine.checkpoint import param_state

    pa, pb = param_state(a), param_state(b)
    assert pa.keys() == pb.keys()
    for name in pa:
        assert pa[name].keys() == pb[name].keys(), name
        for k, va in pa[name].items():
            vb = pb[name][k]
            if isinstance(va, torch.Tensor):
                assert torch.equal(bits(va), bits(vb)), f"{name}.{k} differs"
            else:
                assert va == vb, f"{name}.{k}: {va} != {vb}"
    assert a["loss_scale"] == b["loss_scale"]


class Schedule:
    """Per-step clipping thresholds and gradient injections, identical for both runs.

    `clip[step]` sets grad_clip for that step (a tiny value forces clipping to fire); `inject[step]` is
    a list of (bucket selector, value) pairs: the first gradient element of the first parameter of that
    bucket becomes `value` (nan / inf) after accumulation, before the engine sees it.
    """

    def __init__(self, clip: dict[int, float], inject: dict[int, list[tuple[str, float]]], base_clip: float):
        self.clip, self.inject, self.base_clip = clip, inject, base_clip
        self.step = 0
        self.engine = None

    def target_names(self) -> list[tuple[str, float]]:
        eng, out = self.engine, []
        if eng is None or not eng.layout_measured:
            return out
        host = [b for b in eng.buckets if not b.on_device]
        dev = [b for b in eng.buckets if b.on_device]
        pick = {"first": host[0] if host else None, "middle": host[len(host) // 2] if host else None,
                "last": host[-1] if host else None, "tail": dev[0] if dev else None}
        for sel, value in self.inject.get(self.step, []):
            b = pick[sel]
            if b is not None:
                out.append((b.slots[0].name, value))
        return out

    def attach(self, model: torch.nn.Module) -> None:
        # registered before initialize: runs before the engine's hook on the same parameter
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda p, name=name: self._inject(name, p))

    def _inject(self, name: str, p: torch.Tensor) -> None:
        if self.engine is None or not self.engine.is_boundary:
            return  # inject only in the micro-step that completes the accumulation
        for target, value in self.target_names():
            if target == name:
                p.grad.view(-1)[0] = value

    def before_step(self, engine, i: int) -> None:
        self.engine, self.step = engine, i
        engine.config.grad_clip = self.clip.get(i, self.base_clip)


def run(model_fn, cfg: dict, steps: int, sched: Schedule, data, accum: int = 1):
    return run_losses(model_fn, cfg, steps, sched, data, accum)[0]


def run_losses(model_fn, cfg: dict, steps: int, sched: Schedule, data, accum: int = 1):
    """(engine, losses) of a run under `sched` (schedules attach before initialize)."""
    model = model_fn()
    sched.attach(model)
    return train_engine(model, {**cfg, "grad_accum": accum}, steps, data, hook=sched.before_step)


def make_schedule(steps: int) -> Schedule:
    clip = {i: 1e-3 for i in range(3, steps, 7)}  # clipping fires on these steps
    inject = {}
    for k, i in enumerate(range(5, steps, 11)):
        sel = ["first", "middle", "last", "tail"][k % 4]
        inject[i] = [(sel, math.nan if k % 2 else math.inf)]
    inject[steps // 2] = [("first", math.nan), ("last", math.inf)]
    return Schedule(clip, inject, base_clip=1e3)
