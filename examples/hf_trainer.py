"""The Hugging Face Trainer: SuperOffloadTrainer is the only change from Trainer(optim="adamw_torch").

    python examples/hf_trainer.py [--steps 20] [--output-dir /tmp/so-trainer]
"""

import argparse

from tiny import Rows, tiny_llama
from transformers import TrainingArguments

from superoffload.integrations.transformers import SuperOffloadTrainer  # was: from transformers import Trainer

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--output-dir", default="/tmp/superoffload-hf-trainer")
args = p.parse_args()

training_args = TrainingArguments(
    output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
    learning_rate=3e-3, weight_decay=0.1, max_grad_norm=1.0, lr_scheduler_type="cosine", warmup_steps=2,
    logging_steps=5, save_steps=10, report_to=[], use_cpu=True)
trainer = SuperOffloadTrainer(model=tiny_llama(), args=training_args, train_dataset=Rows())  # was: Trainer(...)
trainer.train()
trainer.save_model(f"{args.output_dir}/final")
print(trainer.optimizer.optimizer.stats["speculation"])
