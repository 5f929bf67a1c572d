"""Weight flow (docs/weight_flow.md): flowed blocks keep their weights on the host, fetched before each use.

Training with flow on must be bit-identical to the same training with flow off (losses, engine state,
final weights), under speculation with clipping and NaN/Inf injections, with and without activation
checkpointing; the device storage must really be released between uses; bad configs fail at
initialize; a checkpoint resume with flow on is bit-exact.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import superoffload
from superoffload.engine import ConfigError
from superoffload.models import build_model, get_shape
from tests.engine.helpers import OPT, Schedule, assert_state_equal, batches, make_schedule, train_engine

SEQ = 16


def model_fn(name: str = "gpt-tiny", ac: bool = False, seed: int = 0):
    return lambda: build_model(get_shape(name), seq=SEQ, seed=seed, activation_checkpointing=ac)


def blocks_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.blocks if hasattr(model, "blocks") else model.model.model.layers


def run(make, cfg: dict, steps: int, sched: Schedule | None, data, accum: int = 1):
    model = make()
    if sched is not None:
        sched.attach(model)
    return train_engine(model, {**cfg, "grad_accum": accum}, steps, data,
                        hook=sched.before_step if sched is not None else None)


def assert_same_weights(a, b) -> None:
    """Every parameter bit-identical; flowed ones are brought to the device for the comparison."""
    with contextlib.ExitStack() as stack:
        for e in (a, b):
            if e.flow is not None:
                stack.enter_context(e.flow.materialized())
        for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            assert torch.equal(pa, pb), name


def released(engine, i: int) -> bool:
    """Block i's device storage is freed (its parameters read from the host store meanwhile)."""
    blk = engine.flow.blocks.get(i) if engine.flow is not None else None
    return blk is not None and not blk.resident and all(
        st.device_flat.untyped_storage().size() == 0 for st in blk.stores)


# (model, flow_layers, prefetch, activation checkpointing, precision, extra config, grad accumulation)
CASES = [
    ("gpt-tiny", [1, 2], 1, False, "fp32", {}, 1),
    ("gpt-tiny", [1, 2], 2, True, "bf16", {}, 1),
    ("gpt-tiny", [0, 1, 2, 3], 1, True, "fp32", {}, 1),
    ("gpt-tiny", [0, 3], 2, False, "bf16", {"rollback_mode": "full_copy"}, 1),
    ("gpt-tiny", [3], 1, True, "bf16", {"param_cast": "device", "grad_cast": "host"}, 1),
    ("gpt-tiny", [0, 2], 0, False, "fp16", {"loss_scale": {"init_scale": 2.0**8, "growth_interval": 5}}, 1),
    ("gpt-tiny", [1, 3], 1, True, "bf16", {}, 2),
    ("llama-tiny", [0, 1], 1, True, "bf16", {}, 1),
    ("llama-tiny", [1], 2, False, "fp32", {}, 1),
]


@pytest.mark.parametrize("name,layers,prefetch,ac,precision,extra,accum", CASES)
def test_flow_is_bit_identical_to_no_flow(name, layers, prefetch, ac, precision, extra, accum):
    steps = 20  # make_schedule: clipping fires at 3 and 17; NaN/Inf skip 5, 10 (two buckets) and 16
    data = batches(name, seq=SEQ, batch=1, accum=accum)
    cfg = {"optimizer": OPT, "precision": precision, "bucket_size": 40_000, "device_tail_buckets": 1,
           "speculation_policy": {"max_rollback_rate": 1.0}, **extra}
    make = model_fn(name, ac)
    ref, ref_losses = run(make, cfg, steps, make_schedule(steps), data, accum)
    flow, losses = run(make, {**cfg, "flow_layers": layers, "flow_prefetch": prefetch}, steps,
                       make_schedule(steps), data, accum)
    assert losses == ref_losses
    assert_state_equal(flow.state_dict(), ref.state_dict())
    s, r = ({k: v for k, v in e.stats["speculation"].items() if k != "rollback_time_s"} for e in (flow, ref))
    assert s == r and s["rolled_back"] > 0 and s["skipped"] > 0
    st = flow.stats["weight_flow"]  # before assert_same_weights, which makes every block resident
    assert st["layers"] == sorted(layers) and st["resident_blocks"] == 0
    flowed = [blocks_of(flow.model)[i] for i in layers]
    assert st["bytes"] == sum(p.numel() * p.element_size() for b in flowed for p in b.parameters())
    # each micro-batch fetches every flowed block once for forward and once for backward (recompute too)
    assert st["h2d_bytes_last_step"] == 2 * accum * st["bytes"]
    assert 1 <= st["peak_resident_blocks"] <= min(len(layers), prefetch + 2)
    assert all(released(flow, i) for i in layers)
    assert_same_weights(flow, ref)
    flow.close()
    ref.close()


@pytest.mark.parametrize("ac", [False, True])
def test_storage_is_released_between_uses(ac):
    model = model_fn(ac=ac)()
    engine = superoffload.initialize(model, {"optimizer": OPT, "bucket_size": 40_000, "flow_layers": [1, 3],
                                             "flow_prefetch": 1})
    blocks = blocks_of(model)
    seen: list[str] = []

    def inside(i):  # runs after the flow's pre-hook on the block: the weights must be there
        def hook(module, args):
            assert not released(engine, i), f"block {i} runs without its weights"
            seen.append(f"fwd{i}")
        return hook

    def after_forward(module, args, out):  # between forward and backward
        assert released(engine, 1) and released(engine, 3)
        assert not released(engine, 0) and not released(engine, 2)
        seen.append("between")

    def in_backward(p):  # block 1's weights get gradients long after block 3's backward is done
        assert released(engine, 3)
        seen.append("bwd1")

    handles = [blocks[i].attn.qkv.register_forward_pre_hook(inside(i)) for i in (1, 3)]
    handles.append(model.register_forward_hook(after_forward))
    handles.append(blocks[1].attn.qkv.weight.register_post_accumulate_grad_hook(in_backward))
    data = batches(seq=SEQ, batch=1)
    for i in range(3):
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0], b.targets[0]))
        assert released(engine, 1) and released(engine, 3)
        engine.step()
    # with activation checkpointing the recompute runs the blocks' forward again inside backward
    per_step = ["fwd1", "fwd3", "between"] + (["fwd3", "fwd1"] if ac else []) + ["bwd1"]
    assert seen == per_step * 3
    for h in handles:
        h.remove()
    with engine.flow.materialized():
        assert not released(engine, 1) and not released(engine, 3)
    assert released(engine, 1) and released(engine, 3)
    # inference under no_grad fetches and releases too
    with torch.no_grad():
        engine.eval()
        engine(data.batch_at(0).inputs[0])
        engine.train()
    assert released(engine, 1) and released(engine, 3)
    engine.close()  # the model becomes a plain module again, weights on the device
    assert not released(engine, 1) and not released(engine, 3)
    model(data.batch_at(0).inputs[0], data.batch_at(0).targets[0]).backward()


def test_block_left_resident_across_a_step_is_refetched():
    """A forward that raises inside a flowed block leaves it (and its prefetched neighbour) resident; a
    host step that then rewrites their weights (clipping forces a redo here) must not be missed."""
    data = batches(seq=SEQ, batch=1)

    def go(extra: dict):
        model = model_fn()()
        engine = superoffload.initialize(model, {"optimizer": OPT, "bucket_size": 40_000, "grad_clip": 1e-3,
                                                 "speculation_policy": {"max_rollback_rate": 1.0}, **extra})
        boom = [False]

        def hook(module, args):
            if boom[0]:
                raise RuntimeError("boom")

        model.blocks[1].mlp.register_forward_pre_hook(hook)
        losses = []
        for i in range(4):
            b = data.batch_at(i)
            loss = engine(b.inputs[0], b.targets[0])
            engine.backward(loss)
            losses.append(loss.item())
            boom[0] = True
            with pytest.raises(RuntimeError, match="boom"):
                engine(b.inputs[0], b.targets[0])
            boom[0] = False
            engine.step()
        engine.synchronize()
        return engine, losses

    ref, ref_losses = go({})
    flow, losses = go({"flow_layers": [1, 2]})
    assert flow.stats["speculation"]["rolled_back"] >= 3
    assert losses == ref_losses
    assert_same_weights(flow, ref)
    flow.close()
    ref.close()


def test_checkpoint_resume_with_flow_is_bit_exact():
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device_tail_buckets": 1,
           "flow_layers": [0, 2, 3], "flow_prefetch": 2}
    data = batches(seq=SEQ, batch=1)
    full, full_losses = run(model_fn(ac=True), cfg, 12, None, data)
    first, _ = run(model_fn(ac=True), cfg, 6, None, data)
    sd = first.state_dict()
    for flow_layers in ([0, 2, 3], []):  # a flow checkpoint resumes with flow on, and with it off
        resumed = superoffload.initialize(model_fn(ac=True, seed=99)(), {**cfg, "flow_layers": flow_layers})
        resumed.load_state_dict(sd)  # different init: every weight must come from sd, host stores too
        losses = []
        for i in range(6, 12):
            b = data.batch_at(i)
            loss = resumed(b.inputs[0], b.targets[0])
            resumed.backward(loss)
            resumed.step()
            losses.append(loss.item())
        resumed.synchronize()
        assert losses == full_losses[6:]
        assert_state_equal(resumed.state_dict(), full.state_dict())
        assert_same_weights(resumed, full)
        resumed.close()


def test_frozen_and_unused_weights_in_flowed_blocks():
    def make():
        m = model_fn(ac=True)()
        m.blocks[1].ln1.weight.requires_grad_(False)  # frozen: not the engine's; LayerNorm backward reads it
        m.blocks[2].extra = torch.nn.Linear(4, 4)  # never used: never gets a gradient
        return m

    data = batches(seq=SEQ, batch=1)
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000}
    ref, ref_losses = run(make, cfg, 8, None, data)
    flow, losses = run(make, {**cfg, "flow_layers": [1, 2]}, 8, None, data)
    assert losses == ref_losses
    assert_state_equal(flow.state_dict(), ref.state_dict())
    assert flow.stats["weight_flow"]["resident_blocks"] == 0
    assert_same_weights(flow, ref)
    assert flow.state_dict()["params"]["blocks.2.extra.weight"]["step"] == 0
    flow.close()
    ref.close()


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.head = torch.nn.Linear(8, 8)
        self.head.weight = self.blocks[1].weight

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


@pytest.mark.parametrize("make,cfg,msg", [
    (model_fn(), {"flow_layers": [4]}, r"flow_layers \[4\] out of range: blocks has 4 blocks"),
    (model_fn(), {"flow_layers": [-1]}, "flow_layers must be a list of block indices"),
    (model_fn(), {"flow_layers": "1"}, "flow_layers must be a list"),
    (model_fn(), {"flow_layers": [1, 1]}, "more than once"),
    (model_fn(), {"flow_layers": [1], "flow_prefetch": -1}, "flow_prefetch must be an integer >= 0"),
    (model_fn(), {"flow_layers": [1], "flow_module_list": "nope.x"}, "no list of blocks at flow_module_list"),
    (model_fn(), {"flow_layers": [1], "flow_module_list": "ln_f"}, "not an nn.ModuleList"),
    (model_fn(), {"flow_layers": [1], "flow_module_list": "a..b"}, "dotted attribute path"),
    (model_fn("llama-tiny"), {"flow_layers": [2]}, r"model.model.layers has 2 blocks"),
    (lambda: torch.nn.Sequential(torch.nn.Linear(4, 4)), {"flow_layers": [0]}, "set flow_module_list"),
    # the tied embedding (131,072 elements, the last to arrive) fills the last 4 buckets of 40,000: 6 reach layer 0
    (model_fn(), {"flow_layers": [0], "bucket_size": 40_000, "device_tail_buckets": 6},
     r"device_tail_buckets=6 can put weights of flowed layer\(s\) \[0\].*Lower device_tail_buckets"),
    (_Tied, {"flow_layers": [1]}, "shared with another module cannot flow"),
])
def test_bad_flow_config_fails_at_initialize(make, cfg, msg):
    model = make()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(ConfigError, match=msg):
        superoffload.initialize(model, cfg)
    for n, p in model.named_parameters():  # a refused config leaves the model's weights in place
        assert p.untyped_storage().size() > 0 and torch.equal(p, before[n]), n


def test_flow_module_list_explicit_path_and_stats_without_flow():
    engine = superoffload.initialize(model_fn()(), {"flow_layers": [2], "flow_module_list": "blocks"})
    assert engine.stats["weight_flow"]["module_list"] == "blocks"
    engine.close()
    plain = superoffload.initialize(model_fn()(), {})
    assert plain.flow is None and "weight_flow" not in plain.stats
    plain.close()


@pytest.mark.cuda
@pytest.mark.parametrize("ac", [False, True])
def test_flow_on_cuda_is_bit_identical_pinned_and_frees_hbm(ac):
    """CUDA only (skipped here): the same bits as without flow, pinned host stores, and the flowed
    weights' HBM really freed between steps."""
    data = batches("gpt-small", seq=64, batch=2)
    layers = [1, 2, 3, 4, 5]

    def go(extra: dict):
        start = torch.cuda.memory_allocated()
        model = build_model(get_shape("gpt-small"), seq=64, seed=0, activation_checkpointing=ac)
        engine = superoffload.initialize(model, {
            "optimizer": OPT, "device": "cuda", "precision": "bf16", "bucket_size": 1 << 20,
            "device_tail_buckets": 1, "grad_clip": 0.05, "speculation_policy": {"max_rollback_rate": 1.0},
            **extra})
        losses = []
        for i in range(6):
            b = data.batch_at(i)
            loss = engine(b.inputs[0].cuda(), b.targets[0].cuda())
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        engine.synchronize()
        return engine, losses, torch.cuda.memory_allocated() - start

    ref, ref_losses, ref_bytes = go({})
    flow, losses, flow_bytes = go({"flow_layers": layers, "flow_prefetch": 2})
    assert losses == ref_losses
    assert_state_equal(flow.state_dict(), ref.state_dict())
    st = flow.stats["weight_flow"]
    assert all(st.host.is_pinned() for b in flow.flow.blocks.values() for st in b.stores)
    assert all(released(flow, i) for i in layers)
    assert ref_bytes - flow_bytes >= st["bytes"]  # between steps no flowed weight occupies HBM
    assert st["h2d_bytes_last_step"] == 2 * st["bytes"] and st["peak_resident_blocks"] <= 4
    assert_same_weights(flow, ref)
