"""CUDA-only engine checks: pinned buffers, streams, overlap. Skipped cleanly without a GPU."""

import pytest
import torch

import superoffload
from tests.engine.helpers import OPT, assert_state_equal, batches, make_model

pytestmark = pytest.mark.cuda


def _train(cfg, steps=6):
    data = batches(seq=64, batch=2)
    engine = superoffload.initialize(make_model(seq=64), {"optimizer": OPT, "device": "cuda", **cfg})
    for i in range(steps):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0].cuda(), b.targets[0].cuda()))
        engine.step()
    engine.synchronize()
    return engine


def test_host_state_is_pinned_and_device_state_in_hbm():
    engine = _train({"precision": "bf16", "bucket_size": 30_000, "device_tail_buckets": 1}, steps=1)
    host = [b for b in engine.buckets if not b.on_device]
    assert all(b.master.is_pinned() and b.upload.is_pinned() and b.landing.is_pinned() for b in host)
    assert all(b.dev_grad.is_cuda for b in engine.buckets)
    tail = [b for b in engine.buckets if b.on_device]
    assert tail and all(b.master.is_cuda and b.exp_avg.is_cuda for b in tail)
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in engine.model.parameters())


@pytest.mark.parametrize("cfg", [{"precision": "bf16"}, {"precision": "bf16", "grad_cast": "host"},
                                 {"precision": "bf16", "param_cast": "device"}, {"precision": "fp16"}])
def test_speculation_bit_identical_on_cuda(cfg):
    base = {"bucket_size": 30_000, "device_tail_buckets": 1, "grad_clip": 0.05, **cfg}
    a = _train({**base, "speculation_policy": {"max_rollback_rate": 1.0}})
    b = _train({**base, "speculation": False})
    assert_state_equal(a.state_dict(), b.state_dict())
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_host_steps_overlap_backward():
    """Speculative host steps start while backward is still running: after backward() returns and
    before step(), the worker has already stepped buckets (their uploads are recorded)."""
    data = batches(seq=256, batch=4)
    model = make_model("gpt-small", seq=256)
    engine = superoffload.initialize(model, {"optimizer": OPT, "device": "cuda", "precision": "bf16",
                                             "bucket_size": 1 << 20})
    for i in range(3):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0].cuda(), b.targets[0].cuda()))
        busy_before_step = engine.counters.snapshot().get("host_step_s", 0.0)
        engine.step()
    engine.synchronize()
    assert busy_before_step > 0
    assert engine.stats["bytes"]["d2h"] > 0 and engine.stats["bytes"]["h2d"] > 0


def test_engine_matches_cpu_engine_within_tolerance():
    """The same training on CUDA and CPU-only: different matmul kernels, so a tolerance, not bits."""
    data = batches(seq=64, batch=2)
    losses = {}
    for dev in ("cuda", "cpu"):
        engine = superoffload.initialize(make_model(seq=64), {"optimizer": OPT, "device": dev,
                                                              "bucket_size": 30_000})
        losses[dev] = []
        for i in range(5):
            b = data.batch_at(i)
            loss = engine(b.inputs[0].to(dev), b.targets[0].to(dev))
            engine.backward(loss)
            engine.step()
            losses[dev].append(loss.item())
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-3)
