"""A parameter larger than `bucket_size` spans buckets (superoffload.packing.pack_pieces): its gradient, fp32
master and Adam state live in several bucket shards, its device weights stay one view across them.

- the packer: every tensor is covered once, in order; no bucket grows past `bucket_size` (so staging
  and upload slots follow the bucket size, not the largest tensor); a split tensor's full pieces fill
  unpadded buckets of their own, so its elements are contiguous across a chain of buckets;
- the engine equals the plain synchronous loop bit for bit with the tied embedding split over 3 buckets,
  on the CPU-only and the simulated device, fp32 and bf16;
- speculation equals validate-first bit for bit under clipping and NaN/Inf with a device tail bucket
  holding part of a tensor, with weight flow over a split tensor, and through an upload ring of depth 1;
- a checkpoint resumes across bucket sizes (split <-> whole) bit-exactly;
- host buffers that do not fit the host budget are an error at initialize naming the settings.
W=2 (re-sharding a split layout, flow over split tensors) is in test_multirank.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import superoffload
from superoffload.engine.config import ConfigError
from superoffload.packing import SHARD_ALIGN, ShapeTensor, chains, pack_pieces, plan_buckets, split_numel
from tests.engine.helpers import (
    OPT,
    Schedule,
    assert_state_equal,
    batches,
    make_model,
    make_schedule,
    run,
    train_engine,
    train_reference,
)

WTE = 131_072  # gpt-tiny's tied embedding / LM head: the last gradient to arrive


@settings(max_examples=200, deadline=None, derandomize=True)
@given(numels=st.lists(st.integers(1, 5000), min_size=1, max_size=12), bucket_size=st.integers(1, 3000),
       world=st.sampled_from([1, 2, 3, 4]), groups=st.lists(st.integers(0, 2), min_size=12, max_size=12))
def test_pieces_cover_each_tensor_once_and_buckets_stay_small(numels, bucket_size, world, groups):
    tensors = [ShapeTensor(f"t{i}", n, group=groups[i]) for i, n in enumerate(numels)]
    layouts = plan_buckets(tensors, list(range(len(tensors))), bucket_size, 0, world)
    full = split_numel(bucket_size, world)
    assert full % (world * SHARD_ALIGN) == 0
    for t in tensors:
        assert [pc.start for pc in t.pieces] == [sum(p.numel for p in t.pieces[:i]) for i in range(len(t.pieces))]
        assert sum(pc.numel for pc in t.pieces) == t.numel
        assert (len(t.pieces) > 1) == (t.numel > max(bucket_size, full))
        for pc in t.pieces[:-1]:  # a full piece fills an unpadded bucket alone
            lay = layouts[pc.bucket]
            assert lay.slots == [pc] and pc.numel == full == lay.padded
        assert [pc.bucket for pc in t.pieces] == list(range(t.pieces[0].bucket, t.pieces[-1].bucket + 1))
    for lay in layouts:
        assert lay.numel <= max(bucket_size, full)
        assert [pc.offset for pc in lay.slots] == [sum(p.numel for p in lay.slots[:i]) for i in range(len(lay.slots))]
        assert all(pc.start == 0 for pc in lay.slots[1:])  # only the first piece may continue a tensor
    for chain in chains(layouts):  # a chain is one contiguous run of each split tensor
        for a, b in zip(chain, chain[1:], strict=False):
            assert b.slots[0].tensor is a.slots[-1].tensor and b.slots[0].start > 0
    # the planner's bucket sizes (pack_pieces on sizes alone) are the laid-out buckets'
    assert [sum(n for _, _, n in b) for b in pack_pieces(numels, bucket_size, world)] == [lay.numel for lay in layouts]


def _splits(engine) -> dict[str, int]:
    return {s.name: len(s.pieces) for s in engine.slots if len(s.pieces) > 1}


@pytest.mark.parametrize("device", ["host", "sim"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tied_embedding_split_over_three_buckets_equals_the_synchronous_loop(device, precision):
    steps, seq = 12, 32
    data = batches(seq=seq, batch=2)
    ref_state, ref_losses = train_reference(make_model(seq=seq), precision, steps, data)
    engine, losses = train_engine(make_model(seq=seq), {"optimizer": OPT, "precision": precision,
                                                        "bucket_size": 50_000, "device": device}, steps, data)
    wte = next(s for s in engine.slots if s.name == "wte.weight")
    assert [pc.numel for pc in wte.pieces] == [50_000, 50_000, WTE - 100_000]
    assert engine.stats["buckets_host"] >= 3 and max(b.layout.numel for b in engine.buckets) <= 50_000
    # the embedding (and the LM head it is tied to) is one view across its three buckets' device weights
    homes = [engine.buckets[k].home for k in wte.buckets]
    assert wte.param.data_ptr() == homes[0][wte.pieces[0].offset:].data_ptr()
    assert homes[1].data_ptr() == homes[0].data_ptr() + homes[0].numel() * homes[0].element_size()
    assert losses == ref_losses
    sd = engine.state_dict()
    from superoffload.engine.checkpoint import param_state

    for name, st_ in param_state(sd).items():
        for k in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(st_[k].reshape(-1), ref_state[k][name]), f"{name}.{k}"
    engine.close()


@pytest.mark.parametrize("device,slots,mode,precision", [
    ("sim", 1, "deferred", "bf16"),  # a ring of depth 1: correct, only slower
    ("sim", 0, "full_copy", "fp16"),
    ("host", 2, "deferred", "fp32"),
])
def test_speculation_with_a_tail_bucket_holding_part_of_a_tensor(device, slots, mode, precision):
    """bucket_size 50,000 splits the tied embedding in 3; one device tail bucket holds its last piece while
    its first two pieces step on the host; every 65,536-element matrix is split in 2."""
    steps = 40
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": precision, "bucket_size": 50_000, "device_tail_buckets": 1,
           "rollback_mode": mode, "device": device}
    if precision == "fp16":
        cfg["loss_scale"] = {"init_scale": 2.0**8, "growth_interval": 20, "raise_at_min_scale": False}
    spec = run(make_model, {**cfg, "upload_slots": slots, "speculation_policy": {"max_rollback_rate": 1.0}},
               steps, make_schedule(steps), data)
    ref = run(make_model, {**cfg, "speculation": False}, steps, make_schedule(steps), data)
    wte = next(s for s in spec.slots if s.name == "wte.weight")
    on_device = [spec.buckets[k].on_device for k in wte.buckets]
    assert on_device == [False, False, True]
    assert _splits(spec)["blocks.0.mlp.fc.weight"] == 2
    assert_state_equal(spec.state_dict(), ref.state_dict())
    for a, b in zip(spec.model.parameters(), ref.model.parameters(), strict=True):
        assert torch.equal(a, b)
    s = spec.stats["speculation"]
    assert s["speculated"] == steps and s["rolled_back"] == s["clipped"] + s["skipped"] > 0
    if slots:  # the record lists the ring's uses and waits (on sim a copy is done when issued: no waits)
        ring = spec.stats["upload_ring"]
        assert spec.stats["upload_slots"] == slots and ring["uses"] > 0 and ring["waits"] == 0
        assert ring["wait_s"] >= 0
    else:
        assert spec.stats["upload_ring"] is None


@pytest.mark.parametrize("device", ["host", "sim"])
def test_weight_flow_over_split_tensors_equals_no_flow(device):
    """Flowed blocks 1 and 2 hold 65,536-element matrices split over two buckets of 40,000: their host
    store and device buffer span the chain, the parameter is one view of each."""
    steps = 20
    data = batches(seq=16, batch=1)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device": device,
           "speculation_policy": {"max_rollback_rate": 1.0}}
    flow = run(make_model, {**cfg, "flow_layers": [1, 2]}, steps, make_schedule(steps), data)
    ref = run(make_model, cfg, steps, make_schedule(steps), data)
    split = [s for s in flow.slots if s.name.startswith(("blocks.1.", "blocks.2.")) and len(s.pieces) > 1]
    assert {s.name for s in split} >= {"blocks.1.mlp.fc.weight", "blocks.2.mlp.fc2.weight"}
    assert all(flow.buckets[s.pieces[0].bucket].flowed for s in split)
    assert_state_equal(flow.state_dict(), ref.state_dict())
    assert flow.model.state_dict().keys() == ref.model.state_dict().keys()
    for (n, a), b in zip(flow.model.state_dict().items(), ref.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    assert flow.stats["weight_flow"]["fetches"] > 0


@pytest.mark.parametrize("first,then", [(40_000, 1 << 20), (1 << 20, 40_000)])
def test_resume_across_bucket_sizes_is_exact(tmp_path, first, then):
    """A checkpoint is per parameter, so it loads into another bucket layout: split <-> whole. Without
    clipping (the only layout-dependent arithmetic: the norm is summed per bucket) the resumed run
    equals the uninterrupted one bit for bit; NaN injections skip the same steps in both."""
    steps, half = 24, 12
    data = batches(seq=16, batch=1)
    sched = make_schedule(steps)
    inject_only = Schedule({}, sched.inject, base_clip=0.0)
    cfg = {"optimizer": OPT, "precision": "bf16", "speculation_policy": {"max_rollback_rate": 1.0}}
    ref = run(make_model, {**cfg, "bucket_size": then}, steps, inject_only, data)
    a = run(make_model, {**cfg, "bucket_size": first}, half, Schedule({}, sched.inject, base_clip=0.0), data)
    a.save_checkpoint(str(tmp_path), tag="half")
    model = make_model(seed=7)
    resume_sched = Schedule({}, sched.inject, base_clip=0.0)
    resume_sched.attach(model)
    b = superoffload.initialize(model, {**cfg, "bucket_size": then})
    b.load_checkpoint(str(tmp_path), tag="half")
    assert bool(_splits(a)) != bool(_splits(b))  # one layout splits the embedding, the other does not
    for i in range(half, steps):
        resume_sched.before_step(b, i)
        x = data.batch_at(i)
        b.backward(b(x.inputs[0], x.targets[0]))
        b.step()
    b.synchronize()
    assert_state_equal(b.state_dict(), ref.state_dict())


def test_host_buffers_over_the_budget_fail_at_initialize_naming_the_settings():
    model = make_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 50_000, "device": "sim",
           "host_budget_bytes": 5_000_000, "rollback_mode": "full_copy"}
    with pytest.raises(ConfigError) as e:
        superoffload.initialize(model, cfg)
    msg = str(e.value)
    for want in ("host_budget_bytes", "upload_slots: 2", "grad_cast: host", "rollback_mode: deferred",
                 "fp32 master, m, v"):
        assert want in msg, msg
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing was touched
    # what the message offers fits: 0.93M params x (12 B state + 2 B landing) + a 2-slot ring of 100 kB
    ok = superoffload.initialize(make_model(), {**cfg, "rollback_mode": "deferred", "grad_cast": "host",
                                                "upload_slots": 2, "host_budget_bytes": 14_000_000})
    b = batches(seq=16, batch=1).batch_at(0)
    ok.backward(ok(b.inputs[0], b.targets[0]))
    ok.step()
    assert ok.stats["pinned_bytes"] + ok.stats["host_state_bytes"] <= 14_000_000
