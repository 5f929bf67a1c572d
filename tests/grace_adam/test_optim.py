"""GraceAdam optimizer: parity with torch.optim.AdamW / Adam and state_dict compatibility."""

from __future__ import annotations

import copy

import pytest
import torch

import grace_adam
from grace_adam.testing import ulp_units


def model_params(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(17, 5, generator=gen), torch.randn(33, generator=gen), torch.randn(1, generator=gen)]


def set_grads(params, seed, skip_last=False):
    gen = torch.Generator().manual_seed(seed)
    for i, p in enumerate(params):
        p.grad = None if (skip_last and i == len(params) - 1) else torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_matches_torch_optimizer(adamw, amsgrad):
    a = [p.clone().requires_grad_() for p in model_params()]
    b = [p.clone() for p in model_params()]
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = cls(a, lr=1e-2, weight_decay=0.05, amsgrad=amsgrad, foreach=False)
    opt = grace_adam.GraceAdam(b, lr=1e-2, weight_decay=0.05, adamw=adamw, amsgrad=amsgrad)
    for k in range(20):
        set_grads(a, k, skip_last=k % 3 == 0)
        set_grads(b, k, skip_last=k % 3 == 0)
        ref.step()
        opt.step()
    for x, y in zip(a, b, strict=False):
        assert ulp_units(x.detach(), y, 1e-2) <= 8 * 20**0.5
    # the skipped (grad None) param has fewer steps, exactly like torch
    assert opt.state[b[2]]["step"].item() == ref.state[a[2]]["step"].item() == 13


def test_state_dict_round_trip_with_adamw():
    a = [p.clone().requires_grad_() for p in model_params()]
    b = [p.clone() for p in model_params()]
    ref = torch.optim.AdamW(a, lr=1e-2, weight_decay=0.1, foreach=False)
    for k in range(3):
        set_grads(a, k)
        ref.step()
    # AdamW -> GraceAdam: continue from torch's state
    for x, y in zip(a, b, strict=False):
        y.copy_(x.detach())
    opt = grace_adam.GraceAdam(b, lr=1.0)  # hyper-parameters come from the loaded state dict
    # deep copies: load_state_dict shares tensors with a live optimizer (torch.save/load would not)
    opt.load_state_dict(copy.deepcopy(ref.state_dict()))
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["decoupled_weight_decay"] is True
    for k in range(3, 6):
        set_grads(a, k)
        set_grads(b, k)
        ref.step()
        opt.step()
    for x, y in zip(a, b, strict=False):
        assert ulp_units(x.detach(), y, 1e-2) <= 8 * 6**0.5
    sd = copy.deepcopy(opt.state_dict())
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][0]["step"].dtype == torch.float32 and sd["state"][0]["step"].item() == 6.0
    # GraceAdam -> AdamW
    c = [y.clone().requires_grad_() for y in b]
    back = torch.optim.AdamW(c, lr=5.0)
    back.load_state_dict(sd)
    assert back.param_groups[0]["lr"] == 1e-2 and back.param_groups[0]["weight_decay"] == 0.1
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(back.state[c[0]][key], opt.state[b[0]][key])
    assert back.state[c[0]]["step"].item() == 6.0
    set_grads(c, 9)
    back.step()  # loads and runs


def test_adam_state_dict_keeps_coupled_weight_decay():
    a = [p.clone().requires_grad_() for p in model_params()]
    ref = torch.optim.Adam(a, lr=1e-2, weight_decay=0.1, foreach=False)
    set_grads(a, 0)
    ref.step()
    opt = grace_adam.GraceAdam([p.detach().clone() for p in a])
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["decoupled_weight_decay"] is False


def test_rejects_non_contiguous_and_wrong_dtype():
    p = torch.randn(8, 8).t()
    p.grad = torch.randn(8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        grace_adam.GraceAdam([p]).step()
    q = torch.randn(8, dtype=torch.float64)
    q.grad = torch.randn(8, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32"):
        grace_adam.GraceAdam([q]).step()


def test_closure_and_noncontiguous_grad():
    p = torch.randn(4, 4)
    p.grad = torch.randn(4, 4).t()
    opt = grace_adam.GraceAdam([p], lr=0.1)
    assert opt.step(lambda: 3.0) == 3.0
