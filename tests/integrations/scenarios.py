"""Training runs shared by the one-process drop-in tests and their two-rank versions (ranks_worker.py):
the same global batches, split over the ranks."""

from __future__ import annotations

import torch

import superoffload
from tests.integrations.tiny import decay_groups, tiny_llama, token_batches

__all__ = ["GLOBAL_BATCH", "Rows", "adamw_loop", "decay_groups", "recording", "trainer_arguments", "trainer_run"]

GLOBAL_BATCH = 4


class Rows(torch.utils.data.Dataset):
    """Token rows as a Trainer's dataset holds them."""

    def __init__(self, n: int = 24, seq: int = 16) -> None:
        self.ids = torch.cat(token_batches(n, batch=1, seq=seq, seed=7))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}


def recording(cls: type) -> type:
    """`cls` that keeps each micro-batch's loss (the value training_step returns)."""

    class Recording(cls):
        def training_step(self, *a, **kw):
            loss = super().training_step(*a, **kw)
            self.recorded = [*getattr(self, "recorded", []), loss.item()]
            return loss

    return Recording


def trainer_arguments(out, world: int = 1, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(out), per_device_train_batch_size=GLOBAL_BATCH // 2 // world,
                gradient_accumulation_steps=2, max_steps=6, learning_rate=3e-3, weight_decay=0.1, adam_beta2=0.95,
                max_grad_norm=2.0, lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1, save_strategy="no",
                report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=3, optim="adamw_torch")
    return TrainingArguments(**{**base, **kw})


def trainer_run(out, cls=None, resume=None, callbacks=(), config=None, world: int = 1, **kw):
    """A Trainer (SuperOffloadTrainer by default) on the tiny Llama; its per-micro-batch losses in `.recorded`."""
    from superoffload.integrations.transformers import SuperOffloadTrainer

    cls = cls or SuperOffloadTrainer
    extra = {"superoffload_config": {"bucket_size": 20_000, **(config or {})}} if cls is SuperOffloadTrainer else {}
    trainer = recording(cls)(model=tiny_llama(), args=trainer_arguments(out, world, **kw), train_dataset=Rows(),
                             callbacks=list(callbacks), **extra)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def adamw_loop(rank: int, world: int, make=None, steps: int = 6, accum: int = 2):
    """A plain loop: each rank takes its rows of every global micro-batch; `clip_grad_norm_`, a cosine
    schedule. `make(model)` builds the optimizer (default: superoffload.AdamW, speculating). Returns (this
    rank's losses and the global gradient norms, the optimizer)."""
    model = tiny_llama()
    opt = make(model) if make else superoffload.AdamW(
        decay_groups(model, 0.1, extra_lr=1e-3), lr=3e-3, betas=(0.9, 0.95), model=model, bucket_size=20_000,
        speculation=True, speculation_policy={"max_rollback_rate": 1.0})
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=1e-4)
    data = token_batches(steps * accum, batch=GLOBAL_BATCH, seed=13)
    share = GLOBAL_BATCH // world
    losses, norms = [], []
    for i in range(steps):
        for k in range(accum):
            ids = data[i * accum + k][rank * share:(rank + 1) * share]
            loss = model(input_ids=ids, labels=ids).loss
            (loss / accum).backward()
            losses.append(loss.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.8)))
        opt.step()
        sched.step()
        opt.zero_grad()
    return (losses, norms), opt
