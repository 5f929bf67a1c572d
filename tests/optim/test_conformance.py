"""superoffload.AdamW where any torch optimizer is used: what torch.optim.AdamW takes and does, checked
against torch.optim.AdamW on the same tensors (the host kernel differs from torch's by a few ulps per step,
docs/grace_adam.md, hence the tolerances).

The gradients here come from backward(), from assignment to `.grad` (as torch's own optimizer tests and
gradient-surgery code give them), or both in one step."""

from __future__ import annotations

import copy

import pytest
import torch

import superoffload

TOL = {"rtol": 1e-5, "atol": 1e-6}


def tensors(seed: int = 0) -> list[torch.Tensor]:
    """Plain tensors that require grad (not nn.Parameter), one of them non-contiguous."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 5, generator=g).requires_grad_(), torch.randn(6, 2, generator=g)[:, 0].requires_grad_(),
            torch.randn(3, generator=g).requires_grad_()]


def loss_of(ps: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    w, b, c = ps
    return ((w @ x + b).tanh().sum() + c.square().sum()) ** 2


def clone(ps: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_() for p in ps]


def run(make, ps: list[torch.Tensor], steps: int = 4, assign: bool = False, seed: int = 1):
    """`steps` steps over `ps`: gradients from backward(), or (assign) computed apart and assigned."""
    opt = make(ps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, generator=g)
        opt.zero_grad()
        if assign:
            grads = torch.autograd.grad(loss_of(ps, x), ps)
            for p, gr in zip(ps, grads, strict=True):
                p.grad = gr.clone()
        else:
            loss_of(ps, x).backward()
        opt.step()
    return opt


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), **TOL)


@pytest.mark.parametrize("assign", [False, True], ids=["backward", "assigned"])
def test_plain_tensors_and_named_parameters_train_as_torch(assign):
    ref, mine, named = tensors(), tensors(), tensors()
    run(lambda ps: torch.optim.AdamW(ps, lr=0.05), ref, assign=assign)
    run(lambda ps: superoffload.AdamW(ps, lr=0.05), mine, assign=assign)
    opt = run(lambda ps: superoffload.AdamW([(f"t{i}", p) for i, p in enumerate(ps)], lr=0.05), named, assign=assign)
    assert_close(mine, ref)
    assert_close(named, ref)
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["t0", "t1", "t2"]


def test_an_assigned_gradient_is_stepped_again_without_zero_grad_as_in_torch():
    """torch's step leaves `.grad` as it was, so a second step() steps the same gradient again."""
    ref, mine = tensors(), tensors()
    opts = torch.optim.AdamW(ref, lr=0.1), superoffload.AdamW(mine, lr=0.1)
    for ps, opt in zip((ref, mine), opts, strict=True):
        for p in ps:
            p.grad = torch.full_like(p, 0.5)
        opt.step()
        opt.step()
        assert all(p.grad is not None and bool((p.grad == 0.5).all()) for p in ps)
        opt.zero_grad()
        opt.step()  # no gradient: nothing moves
    assert_close(mine, ref)


def test_backward_and_an_assigned_gradient_in_one_step_with_speculation():
    """An assigned gradient after backward: on the first steps (the handed-over pass is the step's last,
    speculated), then none for five steps, then again (once the engine predicts one pass per step: it comes
    after its bucket left, and the engine adds it to what the bucket carried). The steps use both
    gradients, as torch's."""
    def loop(make):
        ps, extra = tensors(), torch.zeros(4, requires_grad=True)
        opt = make([{"params": ps}, {"params": [extra], "lr": 0.2}])
        g = torch.Generator().manual_seed(3)
        for i in range(10):
            opt.zero_grad()
            loss_of(ps, torch.randn(5, generator=g)).backward()
            if i < 3 or i >= 8:
                extra.grad = torch.full((4,), float(i))
            opt.step()
        return ps + [extra], opt

    spec = {"speculation": True, "speculation_policy": {"max_rollback_rate": 1.0}, "bucket_size": 16}
    mine, opt = loop(lambda gs: superoffload.AdamW(gs, lr=0.05, **spec))
    assert_close(mine, loop(lambda gs: torch.optim.AdamW(gs, lr=0.05))[0])
    assert opt.stats["speculation"]["committed"] >= 3 and opt.stats["plain_loop"]["overruns"] >= 2


def test_per_group_hyperparameters_and_maximize_as_torch():
    def groups(ps):
        w, b, c = ps
        return [{"params": [w], "lr": 0.03, "betas": (0.8, 0.99), "weight_decay": 0.2},
                {"params": [b], "eps": 1e-3, "maximize": True},
                {"params": [c], "lr": torch.tensor(0.02), "weight_decay": 0.0}]

    ref, mine = tensors(), tensors()
    run(lambda ps: torch.optim.AdamW(groups(ps), lr=0.05), ref)
    opt = run(lambda ps: superoffload.AdamW(groups(ps), lr=0.05), mine)
    assert_close(mine, ref)
    opt.param_groups[1]["maximize"] = False  # changed mid-run: read at the next backward, as torch reads it
    ref_opt = torch.optim.AdamW(groups(ref), lr=0.05)
    # torch's AdamW takes superoffload's dict (extra keys ignored); a copy, as torch's state_dict() shares its
    # tensors with the live state, and so does this one's
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for ps, o in ((ref, ref_opt), (mine, opt)):
        o.zero_grad()
        loss_of(ps, torch.ones(5)).backward()
        o.step()
    assert_close(mine, ref)


def test_amsgrad_in_every_group_with_the_constructor_default():
    def groups(ps):
        return [{"params": ps[:2], "amsgrad": True}, {"params": ps[2:], "amsgrad": True, "lr": 0.01}]

    ref, mine = tensors(), tensors()
    run(lambda ps: torch.optim.AdamW(groups(ps), lr=0.05), ref, steps=5)
    opt = run(lambda ps: superoffload.AdamW(groups(ps), lr=0.05), mine, steps=5)
    assert_close(mine, ref)
    assert set(opt.state_dict()["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}


@pytest.mark.parametrize("options", [{}, {"device_tail_buckets": 3, "bucket_size": 16}], ids=["host", "tail"])
def test_amsgrad_per_group_as_torch(options):
    """amsgrad in one group and not the other (torch's test_param_groups_lr does this): each group steps as
    torch's does, only the amsgrad group's state has max_exp_avg_sq, and the state dicts cross both ways.
    `tail`: every bucket's state on the device, stepped by the device's fused AdamW per group."""
    def groups(ps):
        # beta2 0.3: exp_avg_sq follows the squared gradients down as well as up, so a max kept where it
        # does not belong changes the step
        return [{"params": ps[:2], "amsgrad": True, "betas": (0.9, 0.3)}, {"params": ps[2:], "lr": 0.01,
                                                                          "betas": (0.9, 0.3)}]

    ref, mine = tensors(), tensors()
    ref_opt = run(lambda ps: torch.optim.AdamW(groups(ps), lr=0.05), ref, steps=5)
    opt = run(lambda ps: superoffload.AdamW(groups(ps), lr=0.05, **options), mine, steps=5)
    assert_close(mine, ref)
    sd = opt.state_dict()
    assert [g["amsgrad"] for g in sd["param_groups"]] == [True, False]
    assert {i: set(st) for i, st in sd["state"].items()} == {
        i: set(st) for i, st in ref_opt.state_dict()["state"].items()}
    assert "max_exp_avg_sq" not in sd["state"][2] and "max_exp_avg_sq" in sd["state"][0]
    torch.testing.assert_close(sd["state"][0]["max_exp_avg_sq"], ref_opt.state_dict()["state"][0]["max_exp_avg_sq"],
                               **TOL)
    # torch's dict into this optimizer, and this one's into torch's: both keep stepping alike
    back, again = tensors(), tensors()
    for ps, src in ((back, mine), (again, mine)):
        with torch.no_grad():
            for p, q in zip(ps, src, strict=True):
                p.copy_(q)
    mine_again = superoffload.AdamW(groups(again), lr=0.05, **options)
    mine_again.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    torch_back = torch.optim.AdamW(groups(back), lr=0.05)
    torch_back.load_state_dict(copy.deepcopy(sd))
    for ps, o in ((back, torch_back), (again, mine_again), (ref, ref_opt), (mine, opt)):
        o.zero_grad()
        loss_of(ps, torch.ones(5)).backward()
        o.step()
    assert_close(again, ref)
    assert_close(back, ref)
    assert_close(mine, ref)


def test_amsgrad_turned_on_later_needs_it_at_construction():
    ps = tensors()
    opt = superoffload.AdamW(ps, lr=0.05)
    loss_of(ps, torch.ones(5)).backward()
    opt.step()
    opt.param_groups[0]["amsgrad"] = True
    loss_of(ps, torch.ones(5)).backward()
    with pytest.raises(ValueError, match="param group 0 now says amsgrad=True, but no group had it"):
        opt.step()


@pytest.mark.parametrize("flags", [{"foreach": True}, {"foreach": False}, {"fused": True}, {"fused": False}])
def test_foreach_and_fused_are_accepted_and_change_nothing(flags):
    base, flagged = tensors(), tensors()
    run(lambda ps: superoffload.AdamW(ps, lr=0.05), base)
    opt = run(lambda ps: superoffload.AdamW(ps, lr=0.05, **flags), flagged)
    assert all(torch.equal(a, b) for a, b in zip(base, flagged, strict=True))
    assert all(opt.param_groups[0][k] == v for k, v in flags.items())


@pytest.mark.parametrize("kw,err,msg", [
    ({"capturable": True}, ValueError, "capturable=True .* the step runs on the host"),
    ({"differentiable": True}, ValueError, "differentiable=True .* outside autograd"),
    ({"fused": True, "foreach": True}, RuntimeError, "`fused` and `foreach` cannot be `True` together"),
    ({"fused": True, "differentiable": True}, RuntimeError, "`fused` does not support `differentiable`"),
    ({"lr": torch.tensor(0.01), "foreach": True}, ValueError, "lr as a Tensor is not supported"),
    ({"lr": torch.tensor([0.01, 0.01])}, ValueError, "Tensor lr must be 1-element"),
    ({"betas": (0.9, torch.tensor(0.99))}, ValueError, "betas must be either both floats or both Tensors"),
    ({"betas": (1.0, 0.9)}, ValueError, "Invalid beta parameter at index 0"),
])
def test_flags_and_values_refused_as_torch_refuses_them_or_with_the_reason(kw, err, msg):
    with pytest.raises(err, match=msg):
        superoffload.AdamW(tensors(), **kw)


def test_parameters_the_engine_cannot_train_are_refused_clearly():
    with pytest.raises(ValueError, match="trains fp32 or bf16 parameters.*float64"):
        superoffload.AdamW([torch.zeros(3, dtype=torch.float64, requires_grad=True)])
    with pytest.raises(ValueError, match="trains fp32 or bf16 parameters.*complex64"):
        superoffload.AdamW([torch.zeros(3, dtype=torch.complex64, requires_grad=True)])
    p = torch.zeros(3, requires_grad=True)
    with pytest.warns(UserWarning, match="duplicate parameters"), \
            pytest.raises(ValueError, match="holds the same parameter twice"):  # torch only warns (docs say why)
        superoffload.AdamW([p, p])
    with pytest.raises(ValueError, match="more than one parameter group"):  # torch's own error
        superoffload.AdamW([{"params": [p]}, {"params": [p]}])
    q = tensors()[0]
    opt = superoffload.AdamW([q])
    q.grad = torch.ones_like(q).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        opt.step()


def test_without_trainable_parameters_step_changes_nothing_and_a_late_gradient_is_an_error():
    frozen = torch.ones(2, 3)
    opt = superoffload.AdamW([frozen])
    assert opt.step(lambda: 7) == 7 and torch.equal(frozen, torch.ones(2, 3))
    assert opt.state_dict() == {"state": {}, "param_groups": [{**opt.param_groups[0], "params": [0]}]}
    frozen.grad = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="requires_grad=False when superoffload.AdamW was built"):
        opt.step()


def test_a_later_optimizer_over_the_same_parameters_takes_them_over():
    ps = tensors()
    first = superoffload.AdamW(ps, lr=0.1)
    second = superoffload.AdamW(ps, lr=0.1)
    loss_of(ps, torch.ones(5)).backward()
    second.step()
    assert second.state[ps[0]]["step"] == 1
    with pytest.raises(RuntimeError, match="took them over"):
        first.step()
