"""The CUDA code path on the simulated discrete device (`device: sim`).

- It computes exactly what the CPU-only path computes: every trajectory test's configuration, run on
  `sim`, is bit-identical to the same run on `host` (losses, optimizer state, weights).
- Its checker has teeth: switching off any one ordering point (a stream wait, an event record, an event
  wait, a host-side wait on a bucket's upload count or idle flag, the record_stream of a freed gradient)
  makes it report the hazard that point prevents. One test per point.
- A synchronizing call on the training thread's hot path is reported.
- The memory the engine holds is what the design says (pinned only for transfer buffers, each allocated
  once at its exact size; no gradient buffer per host bucket on the device).
"""

from __future__ import annotations

import time

import pytest
import torch

import superoffload
from superoffload.device import HazardError, SyncOnHotPathError
from superoffload.engine import HostWorkerError
from superoffload.harness.models import build_model, get_shape
from tests.engine.helpers import (
    OPT,
    assert_state_equal,
    batches,
    bits,
    device_kernels_on_host,
    make_schedule,
    train_engine,
)
from tests.engine.helpers import run_losses as run

SEQ = 16
SPEC = {"speculation_policy": {"max_rollback_rate": 1.0}}


def model_fn(name: str = "gpt-tiny", ac: bool | str = False):
    return lambda: build_model(get_shape(name), seq=SEQ, seed=0, activation_checkpointing=ac)


def assert_same_run(a, la, b, lb) -> None:
    assert la == lb
    assert_state_equal(a.state_dict(), b.state_dict())
    for e in (a, b):
        e.synchronize()
    ctx = [e.flow.materialized() for e in (a, b) if e.flow is not None]
    for c in ctx:
        c.__enter__()
    try:
        for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            assert torch.equal(bits(pa), bits(pb)), name
    finally:
        for c in ctx:
            c.__exit__(None, None, None)


@pytest.fixture
def cuda_kernels_on_host():
    """See `device_kernels_on_host`: the two runs differ only in the path a bucket takes."""
    with device_kernels_on_host():
        yield


# (model, extra config, grad accumulation, activation checkpointing)
SIM_CASES = [
    ("gpt-tiny", {"precision": "bf16", "device_tail_buckets": 1}, 1, False),
    ("gpt-tiny", {"precision": "fp16", "device_tail_buckets": 1,
                  "loss_scale": {"init_scale": 2.0**8, "growth_interval": 5}}, 1, False),
    ("gpt-tiny", {"precision": "bf16", "rollback_mode": "full_copy"}, 2, False),
    ("gpt-tiny", {"precision": "bf16", "grad_cast": "host", "param_cast": "device"}, 1, False),
    ("gpt-tiny", {"precision": "fp32", "device_tail_buckets": 2}, 1, True),
    ("gpt-tiny", {"precision": "bf16", "flow_layers": [1, 2], "flow_prefetch": 1}, 1, True),
    ("llama-tiny", {"precision": "bf16", "flow_layers": [0], "device_tail_buckets": 1}, 1, False),
    # checkpoints in host memory (superoffload.sequence): the engine binds its device to the offloader
    ("gpt-tiny", {"precision": "bf16", "device_tail_buckets": 1}, 2, "offload"),
    ("llama-tiny", {"precision": "bf16", "flow_layers": [1]}, 1, "offload"),
]


@pytest.mark.parametrize("name,extra,accum,ac", SIM_CASES)
def test_sim_is_bit_identical_to_host(name, extra, accum, ac, cuda_kernels_on_host):
    """Clipping fires at steps 3 and 10, NaN/Inf skip steps 5 and 6 (make_schedule(12))."""
    steps = 12
    data = batches(name, seq=SEQ, batch=1, accum=accum)
    cfg = {"optimizer": OPT, "bucket_size": 40_000, **SPEC, **extra}
    host, lh = run(model_fn(name, ac), {**cfg, "device": "host"}, steps, make_schedule(steps), data, accum)
    sim, ls = run(model_fn(name, ac), {**cfg, "device": "sim"}, steps, make_schedule(steps), data, accum)
    assert sim.backend.kind == "sim" and not sim.backend.shares_host_memory
    assert sim.stats["bytes"]["d2h"] > 0 and sim.stats["bytes"]["h2d"] + sim.stats.get("weight_flow", {}).get(
        "h2d_bytes_total", 0) > 0  # the discrete path really copied
    s = sim.stats["speculation"]
    assert s["rolled_back"] > 0 and s["skipped"] > 0 and s["speculated"] == steps
    assert_same_run(sim, ls, host, lh)
    if ac == "offload":  # the offloader's copies went through the simulated device's streams and events
        assert {"checkpoint: copy to host", "checkpoint: prefetched input landed"} <= sim.backend.points_seen
    for e in (host, sim):
        e.close()


def test_sim_resume_is_bit_exact_and_crosses_backends(cuda_kernels_on_host):
    """A checkpoint written on the simulated device resumes bit-exactly there and on the host device."""
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device_tail_buckets": 1, **SPEC,
           "grad_clip": 0.5}
    data = batches(seq=SEQ, batch=1)
    full, full_losses = train_engine(model_fn()(), {**cfg, "device": "sim"}, 8, data)
    first, _ = train_engine(model_fn()(), {**cfg, "device": "sim"}, 4, data)
    sd = first.state_dict()
    for device in ("sim", "host"):
        model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=9)  # different init: all comes from sd
        resumed = superoffload.initialize(model, {**cfg, "device": device})
        resumed.load_state_dict(sd)
        losses = []
        for i in range(4, 8):
            b = data.batch_at(i)
            loss = resumed(b.inputs[0], b.targets[0])
            resumed.backward(loss)
            resumed.step()
            losses.append(loss.item())
        assert losses == full_losses[4:]
        assert_state_equal(resumed.state_dict(), full.state_dict())
        resumed.close()


def test_sim_runs_the_cuda_kernels_and_speculation_is_exact():
    """The simulated device runs the CUDA backend's kernels (one fp64-accumulated norm per bucket, torch's fused Adam
    with device step and scale tensors): speculation still equals validate-first bit for bit, and no
    synchronizing call is made on the hot path (a blocking copy of the step count, as before, would be)."""
    data = batches(seq=SEQ, batch=1)
    cfg = {"optimizer": OPT, "device": "sim", "precision": "bf16", "bucket_size": 40_000, "device_tail_buckets": 2}
    spec, ls = run(model_fn(), {**cfg, **SPEC}, 10, make_schedule(10), data)
    ref, lr = run(model_fn(), {**cfg, "speculation": False}, 10, make_schedule(10), data)
    assert spec.backend.kernels.name == "torch"
    assert_same_run(spec, ls, ref, lr)


# ----------------------------------------------------------------------------------------------
# mutation tests: each ordering point is needed
# ----------------------------------------------------------------------------------------------
class _Alternating(torch.nn.Module):
    """`b` runs (and gets a gradient) only on every other forward: its bucket is launched without a
    gradient and without its weights having been waited for by a forward. It runs on the first
    (measuring) step, so its bucket arrives first and is returned last, after `a`'s."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
        self.calls = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.a(x.to(self.a.weight.dtype))
        if self.calls % 2 == 0:
            y = self.b(y)
        return y.float().square().mean()


def _train(point: str, cfg: dict, model: torch.nn.Module | None = None, steps: int = 4, between=None,
           before_step=None):
    model = model if model is not None else model_fn()()
    engine = superoffload.initialize(model, {"optimizer": OPT, "bucket_size": 40_000, "device": "sim",
                                             "precision": "bf16", **SPEC, **cfg})
    engine.backend.disabled_points.add(point)
    data = batches(seq=SEQ, batch=1)
    gen = torch.Generator().manual_seed(0)
    try:
        for i in range(steps):
            if isinstance(model, _Alternating):
                x = (torch.randn(4, 16, generator=gen),)
            else:
                b = data.batch_at(i)
                x = (b.inputs[0], b.targets[0])
            try:
                engine.backward(engine(*x))
            except RuntimeError as e:
                if "boom" not in str(e):
                    raise
                engine.zero_grad()  # the window is discarded; train on
                continue
            if before_step is not None and i >= 1:
                before_step(engine)
            engine.step()
            if between is not None:
                between(engine)
        engine.synchronize()
    finally:
        seen = set(engine.backend.points_seen)
        engine.close()
    return seen


def _worker_idle(engine) -> None:
    """Wait until the worker has run everything, without a happens-before edge (polling, not drain)."""
    deadline = time.monotonic() + 300  # a hang guard: quiet, the worker is idle within milliseconds
    while engine.worker._pending:
        assert time.monotonic() < deadline, "the host worker never went idle"
        time.sleep(0.005)


def _slow_publish(monkeypatch) -> None:
    """Finalize publishes late: the next forward runs before the new weights are written."""
    from superoffload.engine.bucket import Bucket

    real = Bucket._publish

    def late(self, src):
        time.sleep(0.05)
        real(self, src)

    monkeypatch.setattr(Bucket, "_publish", late)


# point -> (extra config, scenario)
POINTS = {
    "launch: side stream waits for the gradients": ({}, None),
    "launch: staging slot free": ({"staging_buffers": 1}, None),
    "launch: staging slot read": ({"staging_buffers": 1}, None),
    "launch: gradient landed": ({}, None),
    "launch: waits for the bucket's host tasks": ({}, "idle"),  # a deferred commit reads landing after publishing
    "validate: compute waits for the bucket norms": ({}, None),
    "forward: waits for its buckets' weights": ({}, None),
    "forward: waits for the upload count": ({}, "slow_publish"),
    "publish: weights written": ({}, None),
    "host: upload buffer free": ({"bucket_size": 272}, "alternating"),  # one Linear per bucket
    # an upload ring of one slot: every bucket publishes through it
    "host: upload slot free": ({"bucket_size": 272, "upload_slots": 1}, "alternating"),
    "publish: upload slot read": ({"bucket_size": 272, "upload_slots": 1}, "alternating"),
    "speculate: gradient landed": ({}, None),
    "flow fetch: copy waits for compute": ({"flow_layers": [1, 2]}, None),
    "flow fetch: weights copied": ({"flow_layers": [1, 2]}, None),
    "flow use: compute waits for the fetch": ({"flow_layers": [1, 2]}, None),
    "flow release: waits for the fetch copy": ({"flow_layers": [1, 2]}, "raise_in_backward"),
    "flow fetch: waits for the upload count": ({"flow_layers": [1, 2]}, "slow_publish"),
    "flow store write: waits for fetches reading it": ({"flow_layers": [1, 2], "flow_prefetch": 1}, "raise_in_forward"),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_each_ordering_point_is_needed(point, monkeypatch):
    cfg, scenario = POINTS[point]
    kw: dict = {}
    if scenario == "alternating":
        kw["model"] = _Alternating()
    elif scenario == "idle":
        kw["between"] = _worker_idle
    elif scenario == "slow_publish":
        _slow_publish(monkeypatch)
    elif scenario == "raise_in_forward":
        kw["before_step"] = _raise_inside_block(1)
    elif scenario == "raise_in_backward":
        kw["model"] = _raising_backward(block=2, step=2)
    with pytest.raises((HazardError, HostWorkerError)) as info:
        _train(point, cfg, **kw)
    assert "unordered" in str(info.value) or "HazardError" in str(info.value)
    # and with the point in place the same scenario is clean (it was exercised)
    monkeypatch.undo()
    if scenario == "slow_publish":
        _slow_publish(monkeypatch)
    assert point in _train("", cfg, **kw)


def _raise_inside_block(i: int):
    """Between backward and step: a forward (an eval) that raises inside block i leaves block i+1
    prefetched and never used by compute; the step then rewrites its host store."""
    def between(engine) -> None:
        blocks = engine.model.blocks
        h = blocks[i].mlp.register_forward_pre_hook(lambda m, a: (_ for _ in ()).throw(RuntimeError("boom")))
        b = batches(seq=SEQ, batch=1).batch_at(0)
        try:
            with pytest.raises(RuntimeError, match="boom"):
                engine(b.inputs[0], b.targets[0])
        finally:
            h.remove()
    return between


def _raising_backward(block: int, step: int) -> torch.nn.Module:
    """A model whose backward raises at `step` right after block `block`'s first gradient, when the
    block before it has just been prefetched (and will never be used)."""
    model = model_fn()()
    count = [0]

    def boom(p):
        count[0] += 1
        if count[0] == step:
            raise RuntimeError("boom")

    model.blocks[block].mlp.fc2.bias.register_post_accumulate_grad_hook(boom)
    return model


def test_every_ordering_point_has_a_mutation_test():
    """The list above covers every point the engine names (a new point needs its own test)."""
    seen = _train("", {"flow_layers": [1, 2], "speculation": True}) | _train("", {"speculation": False})
    assert seen <= set(POINTS), sorted(seen - set(POINTS))


def test_sync_on_the_hot_path_is_reported():
    model = model_fn()()
    engine = superoffload.initialize(model, {"optimizer": OPT, "device": "sim", "bucket_size": 40_000})
    b = batches(seq=SEQ, batch=1).batch_at(0)
    engine.backward(engine(b.inputs[0], b.targets[0]))
    engine.step()  # measuring step: clean
    model.ln_f.weight.register_post_accumulate_grad_hook(lambda p: p.grad.abs().sum().item())
    with pytest.raises(SyncOnHotPathError, match="hot path"):
        engine.backward(engine(b.inputs[0], b.targets[0]))
    assert any("_local_scalar_dense" in c for c in engine.backend.sync_calls)


# ----------------------------------------------------------------------------------------------
# memory
# ----------------------------------------------------------------------------------------------
def test_memory_ledger_transfer_buffers_pinned_exact_and_allocated_once():
    cfg = {"optimizer": OPT, "device": "sim", "precision": "bf16", "bucket_size": 40_000,
           "device_tail_buckets": 1, **SPEC}
    data = batches(seq=SEQ, batch=1)
    engine, _ = train_engine(model_fn()(), cfg, 1, data)
    rep = engine.backend.memory_report()
    host = [b for b in engine.buckets if b.host is not None]
    # pinned: landing (fp32) + upload (bf16) per host bucket shard, nothing else
    need = sum(b.shard_numel * (4 + 2) for b in host)
    assert need <= rep["host_needed_bytes"]["pinned"] <= need + 2 * 64 * len(host)  # 64 B alignment each
    assert rep["host_allocated_bytes"]["pinned"] == rep["host_needed_bytes"]["pinned"]
    # fp32 master, m, v are pageable
    assert rep["host_by_category"]["optimizer_state"] >= 12 * sum(b.shard_numel for b in host)
    before = dict(rep["host_allocated_bytes"])
    engine.load_state_dict(engine.state_dict())  # resume: no second set
    for i in range(1, 4):
        bb = data.batch_at(i)
        engine.backward(engine(bb.inputs[0], bb.targets[0]))
        engine.step()
    engine.synchronize()
    assert engine.backend.memory_report()["host_allocated_bytes"] == before
    engine.close()


def test_device_memory_holds_no_gradient_buffer_per_host_bucket():
    """Host buckets pass through a ring of staging slots; autograd's gradients are freed once flattened,
    so at the end of backward the device holds the weights, the ring and the tail state, not 6 B/param."""
    cfg = {"optimizer": OPT, "device": "sim", "precision": "bf16", "bucket_size": 40_000, "staging_buffers": 2}
    data = batches(seq=SEQ, batch=1)
    engine = superoffload.initialize(model_fn()(), cfg)
    for i in range(3):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0], b.targets[0]))
        if i == 2:
            held = engine.backend.memory_report()["device_live"]
            assert held["grads"] == 0  # every gradient consumed
            assert all(s.param.grad is None for s in engine.slots)
        engine.step()
    largest = max(b.layout.padded for b in engine.buckets)
    assert held["staging"] == 2 * 4 * largest + 8 * len(engine.buckets)  # ring of fp32 slots + the fp64 norms
    n = sum(b.layout.padded for b in engine.buckets)
    assert held["weights"] == 2 * n  # bf16 weights, nothing else per parameter
    engine.close()


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_torch_kernels_one_call_over_many_slices_equals_a_call_per_slice(amsgrad, bias_correction):
    """The device tail steps every bucket's slices in one `adam_steps` call (tail.py):
    each slice gets the bits a call of its own gives it."""
    from superoffload.device.kernels import TorchKernels

    g = torch.Generator().manual_seed(0)
    sizes = [7, 1, 300, 64]

    def state():
        return [[torch.randn(n, generator=g) for n in sizes] for _ in range(3)] + [
            [torch.rand(n, generator=g) for n in sizes] for _ in range(2)]

    p, grad, m, v, vmax = state()
    one = [[t.clone() for t in ts] for ts in (p, grad, m, v, vmax)]
    before = p[2].clone()
    hp = {"step": 3, "lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "adamw": True,
          "bias_correction": bias_correction, "grad_scale": 0.5}
    TorchKernels.adam_steps(p, grad, m, v, vmax if amsgrad else None, **hp)
    for i in range(len(sizes)):
        TorchKernels.adam_step(one[0][i], one[1][i], one[2][i], one[3][i],
                               max_exp_avg_sq=one[4][i] if amsgrad else None, **hp)
    for a, b in zip((p, m, v, vmax), (one[0], one[2], one[3], one[4]), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(p[2], before)  # it stepped


def test_host_pool_beside_a_discrete_device_leaves_the_training_threads_cpu(monkeypatch):
    """host_threads null beside a discrete device: GraceAdam's pool is the affinity mask minus the training
    thread's CPU, pinned; an explicit host_threads, or the CPU-only device, leave the pool alone."""
    import grace_adam

    if not grace_adam.native_available():
        pytest.skip("the pool belongs to GraceAdam's native kernel")
    monkeypatch.delenv("GRACE_ADAM_CPUS", raising=False)
    before = grace_adam.get_num_threads()
    try:
        engine = superoffload.initialize(model_fn()(), {"optimizer": OPT, "device": "sim"})
        pool = engine.stats["host_pool"]
        assert pool["cpus"] == grace_adam.cpus_beside_training(1) and pool["threads"] == len(pool["cpus"])
        assert grace_adam.get_num_threads() == pool["threads"]
        engine.close()
        for cfg in ({"device": "sim", "host_threads": 1}, {"device": "host"}):
            engine = superoffload.initialize(model_fn()(), {"optimizer": OPT, **cfg})
            assert engine.stats["host_pool"] is None
            engine.close()
    finally:
        grace_adam.set_num_threads(before)
        grace_adam.set_affinity(None)
