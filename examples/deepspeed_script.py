"""A DeepSpeed fine-tuning script in the shape of DeepSpeed's own SuperOffload example; two import lines are
the change (`import deepspeed` -> `import superoffload as deepspeed`, and `from deepspeed import comm as dist`
-> `from superoffload import comm as dist`: a `from deepspeed import` statement finds the installed DeepSpeed
package by name, not the alias). The config is DeepSpeed's
SuperOffload one (ds_config.json), passed the way the example passes it:

    python examples/deepspeed_script.py --deepspeed_config examples/ds_config.json [--steps 10]
    torchrun --nproc-per-node 2 examples/deepspeed_script.py --deepspeed_config examples/ds_config.json
"""

import argparse

from deepspeed.ops.adam import DeepSpeedCPUAdam
from tiny import Rows, tiny_llama
from transformers import default_data_collator

import superoffload as deepspeed  # was: import deepspeed
from superoffload import comm as dist  # was: from deepspeed import comm as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--save-dir", default="/tmp/superoffload-deepspeed")
p = deepspeed.add_config_arguments(p)
args = p.parse_args()

model = tiny_llama()
optimizer = DeepSpeedCPUAdam(model.parameters(), lr=args.lr, betas=(0.9, 0.999))
model_engine, optimizer, train_dataloader, _ = deepspeed.initialize(
    args=args, model=model, optimizer=optimizer, training_data=Rows(), collate_fn=default_data_collator)
model_engine.train()
for step, batch in enumerate(train_dataloader):
    if step == args.steps:
        break
    batch = {k: v.to(model_engine.device) for k, v in batch.items()}
    loss = model_engine(**batch).loss
    model_engine.backward(loss)
    model_engine.step()
    if dist.get_rank() == 0:
        print(f"step {step + 1}: loss {loss.item():.4f}")
model_engine.save_checkpoint(args.save_dir)
