"""superoffload.AdamW's `state`, `state_dict()` and `load_state_dict()` in torch's schema, torch's hooks
around them, dicts exchanged with torch.optim.AdamW both ways, copies (deepcopy, pickle)."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn

import superoffload
from tests.optim.test_conformance import assert_close, clone, loss_of, tensors

GROUP_KEYS = set(torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).state_dict()["param_groups"][0])


def steps(opt, ps, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        opt.zero_grad()
        loss_of(ps, torch.randn(5, generator=g)).backward()
        opt.step()


def check_schema(sd: dict, stepped: set[int], shapes: list[torch.Size]) -> None:
    assert set(sd["param_groups"][0]) == GROUP_KEYS  # every hyper-parameter torch's AdamW keeps
    assert [i for g in sd["param_groups"] for i in g["params"]] == list(range(len(shapes)))
    assert set(sd["state"]) == stepped
    for i in stepped:
        st = sd["state"][i]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"} and st["step"].dtype == torch.float32
        assert st["step"].dim() == 0 and st["exp_avg"].shape == st["exp_avg_sq"].shape == shapes[i]


def test_the_schema_is_torchs_at_every_moment():
    ps = tensors()
    shapes = [p.shape for p in ps]
    opt = superoffload.AdamW([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.01}])
    check_schema(opt.state_dict(), set(), shapes)  # before the first step: no state
    assert len(opt.state) == 0 and opt.state[ps[0]] == {}
    loss_of(ps[:2] + [ps[2].detach()], torch.ones(5)).backward()  # no gradient for the third
    check_schema(opt.state_dict(), set(), shapes)  # between backward and step
    opt.step()
    check_schema(opt.state_dict(), {0, 1}, shapes)  # a parameter without a gradient has no state, as in torch
    steps(opt, ps, 2)
    entry = opt.state[ps[2]]
    sd = opt.state_dict()
    check_schema(sd, {0, 1, 2}, shapes)
    assert [float(sd["state"][i]["step"]) for i in range(3)] == [3.0, 3.0, 2.0]
    assert sd["state"][2] is entry and set(opt.state) == set(ps)  # one snapshot, shared, as torch shares


def test_torch_dicts_load_into_it_and_its_dicts_load_into_torch():
    ref, mine = tensors(), tensors()
    torch_opt = torch.optim.AdamW(ref, lr=0.05, weight_decay=0.1)
    steps(torch_opt, ref, 3)
    with torch.no_grad():
        for a, b in zip(mine, ref, strict=True):
            a.copy_(b)
    opt = superoffload.AdamW(mine, lr=0.9)  # the loaded groups' hyper-parameters replace these
    opt.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    assert opt.param_groups[0]["lr"] == 0.05
    steps(torch_opt, ref, 3, seed=2)
    steps(opt, mine, 3, seed=2)
    assert_close(mine, ref)
    back = torch.optim.AdamW(clone(mine), lr=0.9)
    back.load_state_dict(copy.deepcopy(opt.state_dict()))
    for i, p in enumerate(back.param_groups[0]["params"]):
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(back.state[p][k], torch_opt.state[ref[i]][k], rtol=1e-5, atol=1e-7)


def test_a_resume_is_exact_and_the_current_weights_win_over_saved_masters():
    ps = tensors()
    opt = superoffload.AdamW(ps, lr=0.05)
    steps(opt, ps, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    saved = [p.detach().clone() for p in ps]
    steps(opt, ps, 2, seed=5)
    resumed = [p.detach().clone().requires_grad_() for p in saved]
    again = superoffload.AdamW(resumed, lr=0.05)
    buf.seek(0)
    again.load_state_dict(torch.load(buf, weights_only=True))
    steps(again, resumed, 2, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(ps, resumed, strict=True))  # bit for bit
    other = [torch.full_like(p, 0.25).requires_grad_() for p in ps]  # weights that are not the saved masters
    third = superoffload.AdamW(other, lr=0.05)
    buf.seek(0)
    third.load_state_dict(torch.load(buf, weights_only=True))
    assert all(bool((p == 0.25).all()) for p in other)  # loading an optimizer does not change the weights
    torch_opt = torch.optim.AdamW(clone(other), lr=0.05)
    buf.seek(0)
    torch_opt.load_state_dict(torch.load(buf, weights_only=True))
    steps(third, other, 1)
    steps(torch_opt, torch_opt.param_groups[0]["params"], 1)
    assert_close(other, torch_opt.param_groups[0]["params"])


def test_state_tensors_edited_in_place_are_used_by_the_next_step_as_in_torch():
    def two_passes(opt, ps):
        opt.zero_grad()
        loss_of(ps, torch.ones(5)).backward()
        loss_of(ps, torch.full((5,), 0.5)).backward()
        opt.step()

    ref, mine = tensors(), tensors()
    opts = torch.optim.AdamW(ref, lr=0.05), superoffload.AdamW(mine, lr=0.05)
    for ps, opt in zip((ref, mine), opts, strict=True):
        for _ in range(3):
            two_passes(opt, ps)
        opt.state[ps[0]]["exp_avg"].mul_(-3.0)  # after step(): taken at zero_grad()
        opt.state[ps[1]]["step"].fill_(10)
        two_passes(opt, ps)
        opt.zero_grad()
        loss_of(ps, torch.ones(5)).backward()  # the first of two passes: no bucket has left yet
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # a load between them keeps the gradients
        loss_of(ps, torch.full((5,), 0.5)).backward()
        opt.step()
    assert_close(mine, ref)
    assert float(opts[1].state[mine[1]]["step"]) == 12.0
    with pytest.raises(TypeError, match="keeps the state of the parameters it trains in its engine"):
        opts[1].state[mine[0]] = {}


def test_an_edit_after_the_window_began_is_refused():
    """Once the engine predicts the window (one pass here), the last pass's buckets leave and are stepped
    speculatively from the state as it was: an edit then would be silently half-applied."""
    ps = tensors()
    opt = superoffload.AdamW(ps, lr=0.05)
    steps(opt, ps, 2)
    opt.state[ps[0]]["exp_avg"].zero_()
    opt.zero_grad()
    loss_of(ps, torch.ones(5)).backward()
    opt.state[ps[0]]["exp_avg"].zero_()
    with pytest.raises(RuntimeError, match="after this step's backward passes began"):
        opt.step()
    with pytest.raises(RuntimeError, match="after this step's backward passes began"):
        opt.load_state_dict(opt.state_dict())
    opt.zero_grad()  # the window is dropped; the edit is taken now
    assert not opt.state[ps[0]]["exp_avg"].any()


def test_state_dict_and_step_hooks_run_as_torchs():
    ps = tensors()
    opt = superoffload.AdamW(ps)
    calls = []
    opt.register_state_dict_pre_hook(lambda o: o.state.__setitem__("note", 1))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "post": sd["state"].pop("note")})
    opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("pre"))
    opt.register_load_state_dict_pre_hook(lambda o, sd: {**sd, "param_groups": [{**sd["param_groups"][0], "lr": 0.5}]},
                                          prepend=True)
    opt.register_load_state_dict_post_hook(lambda o: calls.append(("post", o.param_groups[0]["lr"])))
    opt.register_step_pre_hook(lambda o, a, k: calls.append("step pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("step post"))
    steps(opt, ps, 1)
    sd = opt.state_dict()
    assert sd["post"] == 1 and "note" not in sd["state"] and opt.state["note"] == 1
    opt.load_state_dict(sd)
    assert calls == ["step pre", "step post", "pre", ("post", 0.5)] and opt.param_groups[0]["lr"] == 0.5
    assert "note" not in opt.state  # the state is the loaded one, wholly, as in torch (the post hook popped it)
    opt.load_state_dict({**sd, "state": {**sd["state"], "kept": 2}})
    assert opt.state["kept"] == 2 and float(opt.state[ps[0]]["step"]) == 1.0


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_is_a_working_optimizer_over_copied_parameters(how):
    model = nn.Linear(5, 3)
    opt = superoffload.AdamW(model.parameters(), lr=0.05, model=model)
    x = torch.randn(4, 5)
    for _ in range(2):
        model(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
    opt.synchronize()  # the weights a step returns land asynchronously with model=; a copy reads them raw
    model2, opt2 = copy.deepcopy((model, opt)) if how == "deepcopy" else pickle.loads(pickle.dumps((model, opt)))
    assert opt2.model is model2 and opt2.param_groups[0]["params"][0] is model2.weight
    assert {k for k in vars(opt) if not k.startswith("_")} == {k for k in vars(opt2) if not k.startswith("_")}
    for m, o in ((model, opt), (model2, opt2)):
        m(x).square().sum().backward()
        o.step()
        o.zero_grad()
    opt.synchronize()
    opt2.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True))
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt2.state_dict()["state"][0]["exp_avg"])


def test_bf16_weights_save_as_bf16_and_the_fp32_masters_are_in_the_state_dict():
    """What docs/integrations.md says of bf16 saves (TRL's default): the model's weights are the bf16
    device copy; the fp32 masters are in the optimizer's state dict, and final_state_dict writes them."""
    from superoffload.finetune.checkpoint import final_state_dict

    model = nn.Linear(8, 4).to(torch.bfloat16)
    opt = superoffload.AdamW(model.parameters(), lr=1e-2, model=model)
    for _ in range(3):
        model(torch.randn(2, 8, dtype=torch.bfloat16)).float().square().sum().backward()
        opt.step()
        opt.zero_grad()
    assert {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}
    fp32 = final_state_dict(model, opt.state_dict()["engine"], torch.float32)
    assert {t.dtype for t in fp32.values()} == {torch.float32}
    assert torch.equal(fp32["weight"].to(torch.bfloat16), model.weight.detach())
    assert not torch.equal(fp32["weight"], model.weight.detach().float())  # more than the bf16 copy holds
