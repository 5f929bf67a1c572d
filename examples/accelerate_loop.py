"""Accelerate: superoffload.AdamW goes through accelerator.prepare like any torch optimizer.

    python examples/accelerate_loop.py [--steps 20]
"""

import argparse

import torch
from accelerate import Accelerator
from tiny import Rows, tiny_llama

import superoffload

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

accelerator = Accelerator(cpu=not torch.cuda.is_available(), gradient_accumulation_steps=2)
model = tiny_llama()
opt = superoffload.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, model=model)  # was: torch.optim.AdamW(...)
loader = torch.utils.data.DataLoader(Rows(), batch_size=4, shuffle=True)
model, opt, loader = accelerator.prepare(model, opt, loader)
step = 0
while step < args.steps:
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            print(f"step {step}: loss {loss.item():.4f}")
            if step == args.steps:
                break
