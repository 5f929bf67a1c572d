"""CUDA-only engine checks: pinned transfer buffers, device memory, streams, overlap, no hidden syncs.
Skipped cleanly without a GPU; the same code path runs in CI on the simulated device (test_sim.py).
Run with TORCH_CUDA_SANITIZER=1 (scripts/device_check.sh does) to have PyTorch's CUDA sanitizer check
the stream ordering of every kernel as well."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import superoffload
from superoffload.engine.checkpoint import param_state
from tests.engine.helpers import OPT, assert_state_equal, batches, make_model

pytestmark = pytest.mark.cuda


def _train(cfg, steps=6, name="gpt-tiny", seq=64):
    # Two runs compared here must see the same gradients: flash and memory-efficient attention backward are
    # not deterministic (use_deterministic_algorithms only warns for them; on an H200 the fp32 runs of
    # test_tail_buckets_... differed by more than the optimizers' ulps), the math kernel is
    data = batches(name, seq=seq, batch=2)
    engine = superoffload.initialize(make_model(name, seq=seq), {"optimizer": OPT, "device": "cuda", **cfg})
    with sdpa_kernel(SDPBackend.MATH):
        for i in range(steps):
            b = data.batch_at(i)
            engine.backward(engine(b.inputs[0].cuda(), b.targets[0].cuda()))
            engine.step()
    engine.synchronize()
    return engine


def test_only_transfer_buffers_are_pinned_and_weights_live_in_hbm():
    engine = _train({"precision": "bf16", "bucket_size": 30_000, "device_tail_buckets": 1}, steps=2)
    host = [b for b in engine.buckets if b.host is not None]
    assert host and all(b.host.landing.is_pinned() and b.host.upload.is_pinned() for b in host)
    assert not any(b.host.master.is_pinned() for b in host)  # fp32 state never crosses the link
    tail = [b for b in engine.buckets if b.tail is not None]
    assert tail and all(t.is_cuda for b in tail for t in b.tail.values())
    assert all(b.home.is_cuda for b in engine.buckets)
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in engine.model.parameters())
    rep = engine.backend.memory_report()
    assert rep["host_allocated_bytes"]["pinned"] == rep["host_needed_bytes"]["pinned"]  # exact, no rounding


@pytest.mark.parametrize("cfg", [{"precision": "bf16"}, {"precision": "bf16", "grad_cast": "host"},
                                 {"precision": "bf16", "param_cast": "device"}, {"precision": "fp16"},
                                 {"precision": "bf16", "rollback_mode": "full_copy"}])
def test_speculation_bit_identical_on_cuda(cfg, monkeypatch):
    """Speculation equals validate-first bit for bit, with no synchronizing call on the hot path
    (torch.cuda.set_sync_debug_mode("error") inside backward, step and the forward hooks)."""
    monkeypatch.setenv("SUPEROFFLOAD_CUDA_SYNC_DEBUG", "error")
    base = {"bucket_size": 30_000, "device_tail_buckets": 1, "grad_clip": 0.05, **cfg}
    a = _train({**base, "speculation_policy": {"max_rollback_rate": 1.0}})
    b = _train({**base, "speculation": False})
    assert_state_equal(a.state_dict(), b.state_dict())
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_host_steps_overlap_backward():
    """Speculative host steps start while backward is still running: after backward() returns and
    before step(), the worker has already stepped buckets."""
    data = batches(seq=256, batch=4)
    engine = superoffload.initialize(make_model("gpt-small", seq=256), {
        "optimizer": OPT, "device": "cuda", "precision": "bf16", "bucket_size": 1 << 20,
        "speculation_policy": {"max_rollback_rate": 1.0}})
    for i in range(3):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0].cuda(), b.targets[0].cuda()))
        busy_before_step = engine.counters.snapshot().get("host_step_s", 0.0)
        engine.step()
    engine.synchronize()
    assert busy_before_step > 0
    assert engine.stats["bytes"]["d2h"] > 0 and engine.stats["bytes"]["h2d"] > 0


def test_engine_matches_host_engine_within_tolerance():
    """The same training on CUDA and CPU-only: different matmul kernels, so a tolerance, not bits."""
    data = batches(seq=64, batch=2)
    losses = {}
    for dev in ("cuda", "host"):
        engine = superoffload.initialize(make_model(seq=64), {"optimizer": OPT, "device": dev,
                                                              "bucket_size": 30_000})
        losses[dev] = []
        for i in range(5):
            b = data.batch_at(i)
            x, y = (t.to(engine.device) for t in (b.inputs[0], b.targets[0]))
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            losses[dev].append(loss.item())
    assert losses["cuda"] == pytest.approx(losses["host"], rel=1e-3)


def test_device_memory_against_the_planner():
    """bench memory on CUDA: the engine's own categories exact at a small model; the allocator's peak
    within 15 % of the planned peak where the engine's memory dominates (gpt-1b; H200, 2026-12-04: -1.1 %).
    At gpt-small the CUDA peak was 302 MB against 160 MB planned (the simulated device measures 161 MB):
    CUDA's activations (attention and cuBLAS kernels) are not the CPU's, and the planner models the CPU's;
    docs/results.md keeps that gap in the open."""
    from superoffload.harness.microbench.memory import measure

    rec = measure("gpt-small", 256, 2, device="cuda", options={"plan": False, "bucket_size": 1 << 20,
                                                               "device_tail_buckets": 2})
    m, p = rec["device_by_category"]["measured"], rec["device_by_category"]["planned"]
    assert m["weights"] == p["weights"] and m["tail_state"] == p["tail_state"] and m["staging"] == p["staging"]
    assert rec["pinned_host_bytes"]["measured"] == rec["pinned_host_bytes"]["needed"]
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("the gpt-1b peak check needs a GPU with 40 GiB")
    rec = measure("gpt-1b", 1024, 2, device="cuda", checkpointing=True)
    d = rec["device_peak_bytes"]
    assert abs(d["planned"] / d["measured"] - 1) <= 0.15, rec["device_by_category"]


def test_tail_buckets_match_host_buckets_within_tolerance():
    """Tail buckets step with torch's fused Adam on CUDA: a few ulps from GraceAdam, not bits."""
    a = _train({"precision": "fp32", "bucket_size": 30_000, "device_tail_buckets": 0})
    b = _train({"precision": "fp32", "bucket_size": 30_000, "device_tail_buckets": 3})
    sa, sb = param_state(a.state_dict()), param_state(b.state_dict())
    for n in sa:
        assert torch.allclose(sa[n]["master"], sb[n]["master"], rtol=1e-5, atol=1e-6), n
