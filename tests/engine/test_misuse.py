"""Training-loop patterns a user can write, and what they observe: torch's semantics, or a clear error.

Every pattern runs with speculation forced on (`max_rollback_rate: 1.0`), clipping that fires on some
steps, both rollback modes, fp32 and bf16, on a model that is not from the zoo, on the CPU-only device
and on the simulated discrete device (the CUDA code path); results are compared bit for bit with the
validate-first run of the same pattern or with the run the pattern must equal.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import superoffload
from superoffload.engine import ConfigError
from superoffload.engine.checkpoint import param_state
from tests.engine.helpers import assert_state_equal, bits

VOCAB, WIDTH, SEQ = 64, 32, 8
OPT = {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1}
CLIP = {1: 1e-3, 4: 1e-3}  # clipping fires on these steps; the rest commit


class TinyLM(nn.Module):
    """A small residual MLP language model (not from the zoo)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                                  nn.Linear(2 * WIDTH, WIDTH)) for _ in range(3))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for b in self.blocks:
            h = h + b(h)
        logits = self.head(self.norm(h)).float()
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)
    x = torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)
    return x[:, :-1], x[:, 1:]


CFGS = [
    pytest.param({"precision": "fp32", "rollback_mode": "deferred", "device": "host"}, id="fp32-deferred-host"),
    pytest.param({"precision": "bf16", "rollback_mode": "full_copy", "device": "host"}, id="bf16-full_copy-host"),
    pytest.param({"precision": "bf16", "rollback_mode": "deferred", "device": "sim"}, id="bf16-deferred-sim"),
    pytest.param({"precision": "fp32", "rollback_mode": "full_copy", "device": "sim"}, id="fp32-full_copy-sim"),
]


def engine_for(cfg: dict, speculate: bool = True, **extra) -> superoffload.SuperOffloadEngine:
    spec = {"speculation_policy": {"max_rollback_rate": 1.0}} if speculate else {"speculation": False}
    return superoffload.initialize(TinyLM(), {"optimizer": OPT, "bucket_size": 3000, "device_tail_buckets": 1,
                                              **spec, **cfg, **extra})


def train(engine, steps, *, skip=(), before_step=None, between=None) -> list[float]:
    losses = []
    for i in range(steps):
        if i in skip:
            continue
        engine.config.grad_clip = CLIP.get(i, 0.0)
        loss = engine(*batch(i))
        engine.backward(loss)
        losses.append(loss.item())
        if before_step is not None:
            before_step(engine, i)
        engine.step()
        if between is not None:
            between(engine, i)
    engine.synchronize()
    return losses


def assert_same(a, b) -> None:
    assert_state_equal(a.state_dict(), b.state_dict())
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(bits(pa), bits(pb)), n


# ----------------------------------------------------------------------------------------------
# 1. between backward() and step(): the pre-step weights, everywhere a loop can look
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", CFGS)
def test_forward_and_reads_between_backward_and_step_see_pre_step_weights(cfg):
    eval_x, eval_y = batch(99)
    seen: dict[int, tuple] = {}

    def look(engine, i):
        with torch.no_grad():
            loss = engine(eval_x, eval_y)
        params = [p.detach().clone() for p in engine.model.parameters()]
        seen[i] = (loss, copy.deepcopy(engine.model.state_dict()), params)

    for speculate in (True, False):
        engine = engine_for(cfg, speculate)
        pre: dict[int, tuple] = {}

        def before_backward_snapshot(engine, i, pre=pre):
            with torch.no_grad():
                pre[i] = (engine(eval_x, eval_y), copy.deepcopy(engine.model.state_dict()),
                          [p.detach().clone() for p in engine.model.parameters()])

        train(engine, 6, before_step=look, between=lambda e, i: None)
        # replay: the same loop with a snapshot taken *before* each backward instead
        ref = engine_for(cfg, speculate)
        for i in range(6):
            ref.config.grad_clip = CLIP.get(i, 0.0)
            ref.synchronize()
            before_backward_snapshot(ref, i)
            ref.backward(ref(*batch(i)))
            ref.step()
        ref.synchronize()
        for i in range(6):
            assert torch.equal(seen[i][0], pre[i][0]), f"step {i}: a forward between backward and step saw " \
                                                       f"other weights"
            for k, v in pre[i][1].items():
                assert torch.equal(bits(seen[i][1][k]), bits(v)), f"step {i}: model.state_dict()[{k!r}]"
            for j, v in enumerate(pre[i][2]):
                assert torch.equal(bits(seen[i][2][j]), bits(v)), f"step {i}: model.parameters()[{j}]"
        assert_same(engine, ref)  # and the look did not perturb training


# ----------------------------------------------------------------------------------------------
# 2. exceptions: a consistent state, and zero_grad() continues as if the batch was never seen
# ----------------------------------------------------------------------------------------------
def _raise_late_in_backward(engine, when: set[int], counter: list[int]):
    """A post-accumulate-grad hook on the first block's weight (its gradient arrives late in backward, after
    most buckets were launched and speculated) that raises on the listed backward calls."""
    def hook(p):
        counter[0] += 1
        if counter[0] in when:
            raise RuntimeError("out of memory (injected)")
    return engine.model.blocks[0][1].weight.register_post_accumulate_grad_hook(hook)


@pytest.mark.parametrize("cfg", CFGS)
def test_exception_in_backward_then_zero_grad_equals_skipping_the_batch(cfg):
    engine = engine_for(cfg)
    counter = [0]
    _raise_late_in_backward(engine, {4}, counter)  # the 4th backward: step 3
    losses = []
    for i in range(7):
        engine.config.grad_clip = CLIP.get(i, 0.0)
        loss = engine(*batch(i))
        try:
            engine.backward(loss)
        except RuntimeError as e:
            assert "injected" in str(e) and i == 3
            with pytest.raises(RuntimeError, match=r"call engine\.zero_grad\(\)"):
                engine.backward(engine(*batch(i)))  # refused before any work
            engine.zero_grad()
            continue
        losses.append(loss.item())
        engine.step()
    engine.synchronize()
    assert engine.stats["speculation"]["speculated"] >= 5
    ref = engine_for(cfg)
    ref_losses = train(ref, 7, skip={3})
    assert losses == ref_losses
    assert_same(engine, ref)


@pytest.mark.parametrize("cfg", CFGS[:2])
def test_exception_in_a_later_micro_batch_discards_the_window(cfg):
    engine = engine_for(cfg, grad_accum=2)
    counter = [0]
    _raise_late_in_backward(engine, {6}, counter)  # window 2's second micro-batch
    for w in range(5):
        try:
            for m in range(2):
                engine.backward(engine(*batch(10 * w + m)))
        except RuntimeError:
            assert w == 2
            engine.zero_grad()
            continue
        engine.step()
    engine.synchronize()
    ref = engine_for(cfg, grad_accum=2)
    for w in (0, 1, 3, 4):
        for m in range(2):
            ref.backward(ref(*batch(10 * w + m)))
        ref.step()
    ref.synchronize()
    assert_same(engine, ref)


def test_exception_in_forward_needs_nothing():
    cfg = {"precision": "bf16", "device": "sim"}
    engine = engine_for(cfg)
    boom = [False]

    def hook(module, args):
        if boom[0]:
            raise RuntimeError("forward failed")

    engine.model.blocks[1].register_forward_pre_hook(hook)
    for i in range(5):
        boom[0] = i == 2
        engine.config.grad_clip = CLIP.get(i, 0.0)
        try:
            loss = engine(*batch(i))
        except RuntimeError:
            continue
        engine.backward(loss)
        engine.step()
    engine.synchronize()
    ref = engine_for(cfg)
    train(ref, 5, skip={2})
    assert_same(engine, ref)


# ----------------------------------------------------------------------------------------------
# 3. more backward() calls than grad_accum
# ----------------------------------------------------------------------------------------------
def test_extra_backward_is_refused_before_any_work():
    cfg = {"precision": "bf16", "device": "host"}
    engine = engine_for(cfg)
    for i in range(4):
        engine.config.grad_clip = CLIP.get(i, 0.0)
        engine.backward(engine(*batch(i)))
        if i == 2:
            with pytest.raises(RuntimeError, match="grad_accum"):
                engine.backward(engine(*batch(50)))
        engine.step()
    engine.synchronize()
    ref = engine_for(cfg)
    train(ref, 4)
    assert_same(engine, ref)


@pytest.mark.parametrize("device", ["host", "sim"])
def test_a_parameter_unfrozen_after_initialize_is_an_error_at_its_first_backward(device):
    """torch's AdamW over model.parameters() would train it from then on; the engine has no buffers for it.
    Never a silently growing .grad: the backward that gives it a gradient raises, and zero_grad() then
    continues as if that batch never came (bit-identical to a run that kept it frozen)."""
    model = TinyLM()
    model.blocks[1][1].weight.requires_grad_(False)
    engine = superoffload.initialize(model, {"optimizer": OPT, "bucket_size": 3000, "device": device,
                                             "speculation_policy": {"max_rollback_rate": 1.0}})
    train(engine, 2)
    p = model.blocks[1][1].weight
    p.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"blocks\.1\.1\.weight had requires_grad=False when the engine was built"):
        engine.backward(engine(*batch(2)))
    p.requires_grad_(False)
    p.grad = None
    engine.zero_grad()
    engine.config.grad_clip = CLIP.get(3, 0.0)
    engine.backward(engine(*batch(3)))
    engine.step()
    engine.synchronize()
    ref_model = TinyLM()
    ref_model.blocks[1][1].weight.requires_grad_(False)
    ref = superoffload.initialize(ref_model, {"optimizer": OPT, "bucket_size": 3000, "device": device,
                                              "speculation_policy": {"max_rollback_rate": 1.0}})
    train(ref, 4, skip={2})
    assert_same(engine, ref)


# ----------------------------------------------------------------------------------------------
# 4. weights written behind the engine's back
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["load_state_dict", "nn.init", "no_grad in-place", "data assignment",
                                 "load_model_state_dict"])
def test_weights_changed_outside_the_engine_are_adopted(how):
    """After step 2 the user writes weights; the next steps continue from them, keeping Adam's moments, as
    torch.optim would. Speculation on equals the validate-first run of the same pattern, and the fp32
    masters hold the written values."""
    new = {k: v.clone() for k, v in TinyLM(seed=7).state_dict().items()}

    def write(engine):
        m = engine.model
        if how == "load_state_dict":
            m.load_state_dict(new)
        elif how == "nn.init":
            nn.init.normal_(m.blocks[1][1].weight, generator=torch.Generator().manual_seed(3))
        elif how == "no_grad in-place":
            with torch.no_grad():
                m.head.weight.mul_(0.5)
        elif how == "data assignment":
            m.blocks[2][3].weight.data = torch.ones_like(m.blocks[2][3].weight)
        else:
            engine.load_model_state_dict(new)

    results = []
    for speculate in (True, False):
        engine = engine_for({"precision": "fp32", "device": "host"}, speculate)
        train(engine, 3)
        write(engine)
        expected = {n: p.detach().float().clone() for n, p in engine.model.named_parameters()}
        moments = {n: e["exp_avg"].clone() for n, e in param_state(engine.state_dict()).items()}
        state = param_state(engine.state_dict())
        for n, v in expected.items():
            assert torch.equal(state[n]["master"], v), f"{n}: the master does not hold the written weight"
            assert torch.equal(state[n]["exp_avg"], moments[n])
        train(engine, 3)
        results.append(engine)
    assert_same(*results)


# ----------------------------------------------------------------------------------------------
# 5. state_dict() inside an accumulation window
# ----------------------------------------------------------------------------------------------
def test_state_dict_mid_accumulation_resumes_bit_exactly():
    cfg = {"precision": "bf16", "device": "host"}
    full = engine_for(cfg, grad_accum=3)
    for w in range(3):
        for m in range(3):
            full.backward(full(*batch(10 * w + m)))
        full.step()
    full.synchronize()
    part = engine_for(cfg, grad_accum=3)
    for m in range(3):
        part.backward(part(*batch(m)))
    part.step()
    part.backward(part(*batch(10)))  # one micro-batch into window 2
    sd = part.state_dict()
    assert "partial_grads" in sd and sd["micro"] == 4
    resumed = engine_for(cfg, grad_accum=3)
    resumed.load_state_dict(sd)
    for m in (1, 2):
        resumed.backward(resumed(*batch(10 + m)))
    resumed.step()
    for m in range(3):
        resumed.backward(resumed(*batch(20 + m)))
    resumed.step()
    resumed.synchronize()
    assert_same(resumed, full)


def test_state_dict_between_backward_and_step_is_a_clear_error():
    engine = engine_for({"device": "host"})
    engine.backward(engine(*batch(0)))
    with pytest.raises(RuntimeError, match="call engine.step"):
        engine.state_dict()


# ----------------------------------------------------------------------------------------------
# 6. config values of the wrong type
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,msg", [
    ({"optimizer": {"lr": None}}, r"optimizer\.lr must be a number"),
    ({"optimizer": {"lr": "fast"}}, r"optimizer\.lr must be a number, got the string 'fast'"),
    ({"optimizer": {"lr": math.inf}}, r"optimizer\.lr must be a finite number"),
    ({"grad_clip": math.nan}, r"grad_clip must be a finite number"),
    ({"speculation": "no"}, r"speculation must be true or false, got 'no'"),
    ({"bucket_size": 1.5}, r"bucket_size must be an integer"),
    ({"bucket_size": [4]}, r"bucket_size must be an integer"),
    ({"optimizer": {"betas": [0.9]}}, r"optimizer\.betas must be a list of 2 numbers"),
    ({"precision": 16}, r"precision must be one of fp32, bf16, fp16; got 16"),
    ({"optimizer": 3}, r"optimizer must be a mapping"),
    ({"flow_layers": [1, "two"]}, r"flow_layers\[1\] must be an integer, got the string 'two'"),
])
def test_config_values_of_the_wrong_type_name_their_key(cfg, msg):
    with pytest.raises(ConfigError, match=msg):
        superoffload.initialize(TinyLM(), cfg)


def test_numbers_written_as_strings_are_converted(tmp_path):
    (tmp_path / "c.yaml").write_text("optimizer:\n  lr: 1e-3\n  eps: 1e-8\nbucket_size: 1e4\n")
    engine = superoffload.initialize(TinyLM(), str(tmp_path / "c.yaml"))
    assert engine.config.optimizer.lr == 1e-3 and engine.config.bucket_size == 10_000
    engine.close()
    with pytest.raises(ConfigError, match="is a directory"):
        superoffload.initialize(TinyLM(), str(tmp_path))


# ----------------------------------------------------------------------------------------------
# 7. param_groups as torch accepts them
# ----------------------------------------------------------------------------------------------
def test_param_groups_as_torch_accepts_them():
    model = TinyLM()
    engine = superoffload.initialize(model, {"optimizer": OPT, "weight_decay_split": False}, model.parameters())
    assert len(engine.optimizer.param_groups) == 1
    engine.close()
    model = TinyLM()
    model.norm.weight.requires_grad_(False)  # frozen, yet listed in a group: skipped as torch skips it
    before = model.norm.weight.detach().clone()
    engine = superoffload.initialize(model, {"optimizer": OPT}, [{"params": list(model.parameters())}])
    train(engine, 2)
    assert torch.equal(model.norm.weight, before) and model.norm.weight.grad is None
    engine.close()
    model = TinyLM()
    with pytest.raises(ConfigError, match=r"head\.weight.*in no parameter group"):
        superoffload.initialize(model, {}, [p for n, p in model.named_parameters() if n != "head.weight"])
    with pytest.raises(ConfigError, match="more than one parameter group"):
        superoffload.initialize(model, {}, [{"params": [model.head.weight]}, {"params": list(model.parameters())}])


# ----------------------------------------------------------------------------------------------
# 8. copies of the model, and flowed weights outside forward
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flow", [[], [0, 2]])
def test_deepcopy_save_and_state_dict_after_initialize(flow, tmp_path):
    engine = engine_for({"precision": "bf16", "device": "sim", "flow_layers": flow, "device_tail_buckets": 0})
    train(engine, 3)
    want = {n: p.detach().clone() for n, p in engine.model.named_parameters()}  # flowed: host values
    clone = copy.deepcopy(engine.model)  # a plain module with the current weights, no engine attached
    buf = io.BytesIO()
    torch.save(engine.model, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    torch.save(engine.model.state_dict(), tmp_path / "sd.pt")
    fresh = TinyLM(seed=5).to(torch.bfloat16)
    fresh.load_state_dict(torch.load(tmp_path / "sd.pt"))
    for m in (clone, loaded, fresh):
        for n, p in m.named_parameters():
            assert torch.equal(bits(p), bits(want[n])), n
    with engine.flow.materialized() if engine.flow else _null():
        for n, p in engine.model.named_parameters():
            assert torch.equal(bits(p), bits(want[n])), f"{n}: a read outside forward is not the weight"
    x, y = batch(3)
    with torch.no_grad():
        assert torch.equal(clone(x, y), engine(x, y))  # the copy computes as the engine's model does
    train(engine, 2)  # the engine is unaffected by the copies
    engine.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ----------------------------------------------------------------------------------------------
# 10. device tail buckets honour bias_correction: false; 11. lr and grad norm from the start
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["host", "sim"])
def test_tail_buckets_honour_bias_correction_off(device):
    cfg = {"precision": "fp32", "device": device, "optimizer": {**OPT, "bias_correction": False}}
    a = engine_for(cfg, device_tail_buckets=0)
    b = engine_for(cfg, device_tail_buckets=3)
    train(a, 3)
    train(b, 3)
    assert b.stats["buckets_device"] == 3
    if device == "host":  # the host device steps its tail with GraceAdam, as its host buckets: the same bits
        assert_same(a, b)
        return
    # the simulated device steps its tail with the CUDA kernels (torch's arithmetic: within ulps of GraceAdam,
    # while a bias-corrected step would move the weights by a factor ~3 more at step 1)
    for (n, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-7, msg=n)


def test_lr_and_grad_norm_are_available_from_the_start():
    engine = engine_for({"device": "host"})
    assert engine.get_lr() == [OPT["lr"]] * len(engine.optimizer.param_groups)
    assert math.isnan(engine.get_global_grad_norm()) and math.isnan(engine.last_grad_norm)
    train(engine, 1)
    assert engine.get_global_grad_norm() > 0 and engine.module is engine.model
    assert engine.is_gradient_accumulation_boundary() and engine.global_steps == 1
