"""The loss hook takes the LM-head module, not its weight: calling the head on zero tokens runs its forward
pre-hooks, where the engine waits for the weight's asynchronous upload. With the weight read directly, an
untied head raced the upload after every step (the simulated device reported the hazard)."""

from __future__ import annotations

import pytest
import torch

import superoffload
from superoffload.harness.data import SyntheticData
from superoffload.models import build_model, get_shape
from superoffload.sequence import enable_sequence_parallel, head_weight, token_losses


def _losses(device: str, tile: int | None, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    shape = get_shape("llama-tiny")  # untied LM head: its weight is not the embedding's
    model = build_model(shape, seq=32, seed=0)
    enable_sequence_parallel(model, None, loss_tile=tile)  # one rank: the loss hook, no all-to-all
    engine = superoffload.initialize(model, {"device": device, "precision": "bf16", "bucket_size": 65536,
                                             "speculation_policy": {"max_rollback_rate": 1.0}})
    data = SyntheticData(shape.vocab, 32, 2, seed=0)
    out = []
    for i in range(steps):
        b = data.batch_at(i)
        loss = engine(b.inputs[0], b.targets[0])
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    engine.synchronize()
    weights = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    engine.close()
    return out, weights


@pytest.mark.parametrize("tile", [None, 16])
def test_untied_head_waits_for_its_upload_on_sim(tile):
    sim, w_sim = _losses("sim", tile)  # a HazardError here is the race
    host, w_host = _losses("host", tile)
    assert sim == host
    assert all(torch.equal(w_sim[n], w_host[n]) for n in w_host)


def test_head_weight_calls_the_module_on_zero_tokens():
    head = torch.nn.Linear(8, 5, bias=False)
    calls = []
    head.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape))
    hidden = torch.randn(2, 3, 8)
    assert head_weight(head, hidden) is head.weight
    assert calls == [torch.Size([2, 0, 8])]
    w = torch.randn(5, 8)
    assert head_weight(w, hidden) is w  # a tensor is taken as given
    targets = torch.randint(0, 5, (2, 3))
    assert torch.equal(token_losses(hidden, head_weight(head, hidden), targets),
                       token_losses(hidden, head.weight, targets))
