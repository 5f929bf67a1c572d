"""superoffload.AdamW in a plain torch loop against torch.optim.AdamW on the same model, data and seed.

The loop is what a torch user writes: `loss.backward()`, `torch.nn.utils.clip_grad_norm_`, `opt.step()`,
a torch LR scheduler, `opt.zero_grad()`. Losses agree within 1e-5 relative (the host kernel's few ulps per
step against torch's, docs/grace_adam.md); the engine's own promises (speculation equals validating
first, a resume equals not stopping) are bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import superoffload
from superoffload.engine import ConfigError
from tests.engine.helpers import assert_state_equal
from tests.integrations.tiny import decay_groups, max_rel, tiny_llama, token_batches

SPECULATE = {"speculation": True, "speculation_policy": {"max_rollback_rate": 1.0}, "bucket_size": 20_000}


class WithSide(nn.Module):
    """A Llama plus a parameter used on odd steps only (no gradient on even ones)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.lm = tiny_llama(seed)
        self.side = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, ids: torch.Tensor, use_side: bool) -> torch.Tensor:
        loss = self.lm(input_ids=ids, labels=ids).loss
        return loss + (self.side.square().sum() * 0.01 if use_side else 0.0)


def train(make_opt, steps: int = 10, accum: int = 2, clip: float | None = 1.85, hook=None, seed: int = 0,
          clip_fn=None, device_of=None) -> tuple[list[float], torch.optim.Optimizer, nn.Module]:
    model = WithSide(seed)
    opt = make_opt(model)
    device = device_of(model) if device_of else torch.device("cpu")
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=1e-4)
    data = token_batches(steps * accum)
    clip_fn = clip_fn or torch.nn.utils.clip_grad_norm_
    losses = []
    for i in range(steps):
        if hook:
            hook(opt, i)
        for k in range(accum):
            loss = model(data[i * accum + k].to(device), use_side=i % 2 == 1)
            (loss / accum).backward()
            losses.append(loss.item())
        if clip is not None:
            clip_fn(model.parameters(), clip)
        opt.step()
        sched.step()
        opt.zero_grad()
    return losses, opt, model


def torch_adamw(model):
    return torch.optim.AdamW(decay_groups(model.lm, 0.1, extra_lr=1e-3) + [{"params": [model.side]}],
                             lr=3e-3, betas=(0.9, 0.95))


def so_adamw(**kw):
    def make(model):
        return superoffload.AdamW(decay_groups(model.lm, 0.1, extra_lr=1e-3) + [{"params": [model.side]}],
                                  lr=3e-3, betas=(0.9, 0.95), model=model, **{**SPECULATE, **kw})
    return make


@pytest.fixture(scope="module")
def reference():
    return train(torch_adamw)


@pytest.mark.parametrize("device", ["host", "sim"])
def test_a_torch_loop_trains_as_torch_adamw_with_clipping_speculated(reference, device):
    ref, *_ = reference
    losses, opt, _ = train(so_adamw(device=device))
    assert max_rel(ref, losses) < 1e-5
    spec = opt.stats["speculation"]
    assert spec["clipped"] > 0 and spec["clipped"] < spec["steps"]  # clipping fired on some steps only
    assert spec["speculated"] >= 8 and spec["rolled_back"] > 0 and spec["committed"] > 0
    assert opt.stats["buckets_host"] > 1
    if device == "sim":  # a hazard in a finalizer (a free) only warns: check the simulator's record too
        assert opt.engine.backend.hb.hazards == []


def test_max_grad_norm_and_a_clip_imported_before_superoffload_clip_alike(reference):
    ref, *_ = reference
    by_arg, opt, _ = train(so_adamw(max_grad_norm=1.85), clip=None)
    assert max_rel(ref, by_arg) < 1e-5 and opt.stats["speculation"]["clipped"] > 0
    from torch.nn.utils.clip_grad import clip_grad_norm_ as bound_early  # a reference bound by name
    by_name, _, _ = train(so_adamw(), clip_fn=bound_early)
    assert by_name == train(so_adamw())[0]


def test_speculation_equals_validating_first_bit_for_bit():
    _, spec, _ = train(so_adamw(), clip=1.9)
    _, first, _ = train(so_adamw(speculation=False), clip=1.9)
    assert spec.stats["speculation"]["speculated"] > 0 and first.stats["speculation"].get("speculated", 0) == 0
    assert_state_equal(spec.engine.state_dict(), first.engine.state_dict())


def test_the_facade_equals_the_native_engine_bit_for_bit():
    """Accumulation by two backward() calls of loss / 2 against engine.backward(loss) with grad_accum 2."""
    _, opt, _ = train(so_adamw(weight_decay_split=False), clip=None, accum=2)
    model = WithSide()
    groups = decay_groups(model.lm, 0.1, extra_lr=1e-3) + [{"params": [model.side]}]
    for g in groups:
        g.setdefault("lr", 3e-3)
        g.setdefault("weight_decay", 1e-2)
        g["betas"] = (0.9, 0.95)
    engine = superoffload.initialize(model, {**SPECULATE, "grad_accum": 2, "optimizer": {"lr": 3e-3}}, groups)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(engine.optimizer, T_max=10, eta_min=1e-4)
    data = token_batches(20)
    for i in range(10):
        for k in range(2):
            engine.backward(engine(data[2 * i + k], use_side=i % 2 == 1))
        engine.step()
        sched.step()
    assert_state_equal(opt.engine.state_dict(), engine.state_dict())


def test_windows_longer_and_shorter_than_predicted_still_sum_as_torch():
    """Two micro-batches per step, then three (a gradient after its bucket left: the extra launch adds
    to the landed shard), then one (validated first), then two again."""
    sizes = [2, 2, 3, 1, 2, 3, 2]

    def run(make):
        model = WithSide()
        opt = make(model)
        data = token_batches(sum(sizes), seed=3)
        losses, j = [], 0
        for n in sizes:
            for _ in range(n):
                loss = model(data[j], use_side=j % 3 == 0)
                loss.backward()
                losses.append(loss.item())
                j += 1
            opt.step()
            opt.zero_grad()
        return losses, opt

    ref, _ = run(torch_adamw)
    for device in ("host", "sim"):
        losses, opt = run(so_adamw(device=device))
        assert max_rel(ref, losses) < 1e-5, device
        assert device == "host" or opt.engine.backend.hb.hazards == []
        assert opt.engine.plain.overruns == 2 and opt.stats["speculation"]["speculated"] >= 3


def test_hyperparameters_changed_mid_run_take_effect(reference):
    def hook(opt, i):
        if i == 4:
            for g in opt.param_groups:
                g["betas"], g["eps"], g["weight_decay"] = (0.8, 0.99), 1e-6, g["weight_decay"] * 2

    ref, *_ = train(torch_adamw, hook=hook)
    losses, *_ = train(so_adamw(), hook=hook)
    assert max_rel(ref, losses) < 1e-5 and max_rel(ref, reference[0]) > 1e-4


def test_warmup_from_zero_learning_rate():
    def run(make):
        model = WithSide()
        opt = make(model)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / 3 if s < 3 else 1.0)
        start = [p.detach().clone() for p in model.parameters()]
        losses = []
        for i, ids in enumerate(token_batches(6)):
            loss = model(ids, use_side=True)
            loss.backward()
            losses.append(loss.item())
            opt.step()
            sched.step()
            opt.zero_grad()
            if i == 0:  # the first step ran at lr 0: nothing moved
                model(ids, use_side=True)  # the next forward waits for the returned weights
                assert all(torch.equal(a, b) for a, b in zip(start, model.parameters(), strict=True))
        return losses

    ref, losses = run(torch_adamw), run(so_adamw())
    assert max_rel(ref, losses) < 1e-5


def test_reentrant_checkpointing_nests_graph_tasks_and_still_trains_as_torch():
    def run(make):
        model = WithSide()
        if hasattr(model.lm, "activation_checkpointing_enable"):  # transformers 5 renamed it
            model.lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        else:
            model.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.train()
        opt = make(model)
        losses = []
        for ids in token_batches(6, seed=4):
            loss = model(ids, use_side=False)
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        return losses, opt

    (ref, _), (losses, opt) = run(torch_adamw), run(so_adamw())
    assert max_rel(ref, losses) < 1e-5
    assert opt.engine.plain.overruns == 0 and opt.stats["speculation"]["speculated"] == 5


def test_state_dict_resumes_bit_identically_and_loads_with_weights_only(tmp_path):
    full, opt_full, model_full = train(so_adamw(), steps=6)

    model = WithSide()
    opt = so_adamw()(model)
    fresh = opt.state_dict()
    # before the first step: torch's schema with no state, and no tensors at all (the weights are the masters)
    assert fresh["state"] == {} and fresh["engine"] is None
    assert not any(isinstance(v, torch.Tensor) for g in fresh["param_groups"] for v in g.values())
    data = token_batches(12)

    def steps(opt, model, lo, hi, sched):
        for i in range(lo, hi):
            for k in range(2):
                (model(data[2 * i + k], use_side=i % 2 == 1) / 2).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.85)
            opt.step()
            sched.step()
            opt.zero_grad()

    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, eta_min=1e-4)
    steps(opt, model, 0, 3, sched)
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), "model": model.state_dict()}, tmp_path / "c.pt")
    blob = torch.load(tmp_path / "c.pt", weights_only=True)  # what the HF Trainer loads optimizer.pt with
    model2 = WithSide(seed=5)
    model2.load_state_dict(blob["model"])
    opt2 = so_adamw()(model2)
    opt2.load_state_dict(blob["opt"])
    sched2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=6, eta_min=1e-4)
    sched2.load_state_dict(blob["sched"])
    steps(opt2, model2, 3, 6, sched2)
    assert_state_equal(opt2.engine.state_dict(), opt_full.engine.state_dict())
    for a, b in zip(model2.parameters(), model_full.parameters(), strict=True):
        assert torch.equal(a, b)


def test_closure_zero_grad_and_a_step_without_gradients():
    model = WithSide()
    opt = so_adamw()(model)
    ids = token_batches(1)[0]
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()  # no gradient yet: nothing changes, as in torch
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    model(ids, use_side=True).backward()
    opt.zero_grad()  # the window is discarded
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    def closure():
        opt.zero_grad()
        loss = model(ids, use_side=True)
        loss.backward()
        return loss

    loss = opt.step(closure)
    opt.synchronize()
    assert isinstance(loss, torch.Tensor) and not torch.equal(before[0], next(model.parameters()))
    model(ids, use_side=True).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_without_a_model_the_step_returns_every_weight_before_it_ends():
    def run(make):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        opt = make(net)
        g = torch.Generator().manual_seed(2)
        losses = []
        for _ in range(6):
            x = torch.randn(8, 16, generator=g)
            loss = net(x).square().mean()
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        return losses, opt

    ref, _ = run(lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    losses, opt = run(lambda m: superoffload.AdamW(m.parameters(), lr=1e-2, speculation=True))
    assert max_rel(ref, losses) < 1e-5
    assert opt.engine.config.overlap_param_return is False and "no model= given" in opt.plan_notes[0]


def test_the_plan_fills_what_was_not_given():
    model = tiny_llama()
    opt = superoffload.AdamW(model.parameters(), lr=1e-3, model=model, bucket_size=20_000)
    ids = token_batches(1)[0]
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert opt.plan is not None and (opt.plan.seq, opt.plan.batch) == (16, 2)
    assert opt.engine.config.bucket_size == 20_000  # given: kept
    assert opt.engine.config.speculation is opt.plan.speculation  # whichever way the CPU plan priced it
    assert "given: bucket_size" in opt.plan_notes[0]


@pytest.mark.parametrize("kw,msg", [
    ({"capturable": True}, "capturable=True"),
    ({"differentiable": True}, "differentiable=True"),
    ({"lr": -1.0}, "Invalid learning rate"),
    ({"config": {"optimizer": {"lr": 1e-3}}}, "optimizer' block"),
    ({"grad_accum": 2}, "the loop decides accumulation"),
    ({"max_grad_norm": 1.0, "grad_clip": 2.0}, "disagree"),
    ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "host"}, "move the model first"),
])
def test_bad_arguments_are_refused_before_any_work(kw, msg):
    model = WithSide()
    with pytest.raises((ValueError, ConfigError), match=msg):
        superoffload.AdamW(model.parameters(), model=model, **kw)


def test_a_model_wrapped_in_ddp_is_refused(monkeypatch):
    import torch.distributed as dist

    # a baseline run earlier in this test process keeps its one-rank default group for the life of the process
    # (baselines/_common.py says why): wrap with that one, else with a group made and destroyed here
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = WithSide()
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        with pytest.raises(ConfigError, match="wrapped in DistributedDataParallel"):
            superoffload.AdamW(model.parameters(), model=wrapped)
    finally:
        if created:
            dist.destroy_process_group()


def test_fp16_weights_a_grad_scaler_and_later_unfreezing_are_refused():
    half = nn.Linear(4, 4).half()
    with pytest.raises(ConfigError, match="fp16 needs loss scaling"):
        superoffload.AdamW(half.parameters())
    model = WithSide()
    opt = superoffload.AdamW(model.parameters(), model=model)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(token_batches(1)[0], use_side=True)).backward()
    with pytest.raises(RuntimeError, match="GradScaler"):
        scaler.step(opt)
    model = WithSide()
    model.side.requires_grad_(False)
    opt = superoffload.AdamW(model.parameters(), model=model)
    model.side.requires_grad_(True)
    with pytest.raises(RuntimeError, match="side had requires_grad=False when the engine was built"):
        model(token_batches(1)[0], use_side=True).backward()  # the backward that gives it a gradient
    with pytest.raises(RuntimeError, match="parameter groups are fixed"):
        opt.add_param_group({"params": [nn.Parameter(torch.ones(2))]})
    with pytest.raises(RuntimeError, match="not engine.backward"):
        opt.engine.backward(torch.ones(()))


@pytest.mark.cuda
def test_a_model_moved_after_the_optimizer_was_built_is_an_error():
    model = WithSide()
    opt = superoffload.AdamW(model.parameters(), model=model)
    model.cuda()  # the same Parameter objects, now on the GPU; the engine was laid out for the host
    with pytest.raises(RuntimeError, match="build the optimizer after model.to"):
        opt.step()


@pytest.mark.cuda
def test_on_cuda_a_torch_loop_trains_as_torch_adamw(reference):
    def make(model):
        model.cuda()
        return so_adamw()(model)

    ref, *_ = reference
    losses, opt, _ = train(make, device_of=lambda m: next(m.parameters()).device)
    assert max_rel(ref, losses) < 1e-4 and opt.stats["speculation"]["speculated"] >= 8


def test_clipping_a_subset_or_mixed_parameters_is_an_error_not_a_silent_no_op():
    model = WithSide()
    other = nn.Linear(4, 4)
    opt = superoffload.AdamW(model.lm.parameters(), model=model.lm)
    (model(token_batches(1)[0], use_side=True) + other(torch.ones(4)).sum()).backward()
    with pytest.raises(RuntimeError, match="does not train"):
        torch.nn.utils.clip_grad_norm_([*model.lm.parameters(), *other.parameters()], 1.0)
    with pytest.raises(RuntimeError, match="of the .* parameters"):
        torch.nn.utils.clip_grad_norm_(list(model.lm.parameters())[:3], 1.0)
    assert float(torch.nn.utils.clip_grad_norm_(other.parameters(), 1e9)) > 0  # others: torch's, untouched
    norm = float(torch.nn.utils.clip_grad_norm_(model.lm.parameters(), 1e9))
    assert norm == pytest.approx(opt.grad_norm()) and norm > 0


@pytest.mark.parametrize("device", ["host", "sim"])
def test_weight_flow_through_the_optimizer_is_bit_identical_to_resident_weights(device):
    """flow_layers= (blocks whose weights live in host memory, fetched before each use) with a plain loop."""
    from tests.engine.helpers import batches, make_model

    def run(extra):
        model = make_model()
        opt = superoffload.AdamW(model.parameters(), lr=2e-3, model=model, device=device, bucket_size=40_000,
                                 speculation=True, speculation_policy={"max_rollback_rate": 1.0}, **extra)
        data = batches()
        for i in range(4):
            b = data.batch_at(i)
            model(b.inputs[0], b.targets[0]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
        opt.synchronize()
        return opt

    flow, resident = run({"flow_layers": [1, 2]}), run({})
    assert flow.stats["weight_flow"]["fetches"] > 0 and flow.stats["speculation"]["speculated"] == 3
    assert_state_equal(flow.engine.state_dict(), resident.engine.state_dict())
    if device == "sim":
        assert flow.engine.backend.hb.hazards == []
