"""Accelerate: prepare(model, superoffload.AdamW, loader), accelerator.backward, accumulate and
clip_grad_norm_, against the same loop with torch.optim.AdamW."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")
import superoffload  # noqa: E402
from tests.integrations.tiny import decay_groups, max_rel, tiny_llama, token_batches  # noqa: E402


def train(make_opt, steps: int = 6, accum: int = 2) -> tuple[list[float], torch.optim.Optimizer]:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # one Accelerator per loop (its state is global)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accum)
    model = tiny_llama()
    opt = make_opt(model)
    data = torch.cat(token_batches(steps * accum, batch=1, seq=16, seed=5))
    loader = torch.utils.data.DataLoader(data, batch_size=1, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=steps)
    losses = []
    for ids in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            losses.append(loss.item())
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 2.0)
            opt.step()
            if accelerator.sync_gradients:
                sched.step()
            opt.zero_grad()
    return losses, opt


def test_accelerate_trains_as_with_torch_adamw():
    ref, _ = train(lambda m: torch.optim.AdamW(decay_groups(m), lr=3e-3))
    losses, opt = train(lambda m: superoffload.AdamW(decay_groups(m), lr=3e-3, model=m, speculation=True,
                                                     speculation_policy={"max_rollback_rate": 1.0}))
    assert max_rel(ref, losses) < 1e-5
    inner = opt.optimizer  # AcceleratedOptimizer around superoffload.AdamW
    spec = inner.stats["speculation"]
    assert spec["steps"] == 6 and spec["speculated"] == 5 and spec["clipped"] > 0
