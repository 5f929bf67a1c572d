"""A plain torch loop with superoffload.AdamW: only the optimizer line differs from torch.optim.AdamW.

    python examples/torch_loop.py [--steps 20]
"""

import argparse

import torch
from tiny import Rows, tiny_llama

import superoffload

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

model = tiny_llama()
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
# was: opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95))
opt = superoffload.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), model=model)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
loader = torch.utils.data.DataLoader(Rows(), batch_size=4, shuffle=True)
accum, step = 2, 0
while step < args.steps:
    for i, batch in enumerate(loader):
        loss = model(**batch).loss
        (loss / accum).backward()          # buckets leave for the host as their gradients arrive
        if (i + 1) % accum:
            continue
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clipped by the engine, exactly
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        print(f"step {step}: loss {loss.item():.4f}, grad norm {float(norm):.3f}, lr {sched.get_last_lr()[0]:.2e}")
        if step == args.steps:
            break
print(opt.stats["speculation"])
