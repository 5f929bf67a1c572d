"""TRL's SFTTrainer through superoffload_trainer: one wrapped class name is the change.

    python examples/trl_sft.py [--steps 20]
"""

import argparse

import datasets
from tiny import tiny_llama
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from superoffload.integrations.transformers import superoffload_trainer

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--output-dir", default="/tmp/superoffload-trl")
args = p.parse_args()

words = "the cat sat on a mat and the dog ran to the park while birds sang in the trees".split()  # noqa: SIM905
vocab = {"<pad>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
data = datasets.Dataset.from_dict({"text": [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 4})

config = SFTConfig(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
                   learning_rate=5e-3, logging_steps=5, max_length=24, report_to=[], use_cpu=True, save_strategy="no")
trainer = superoffload_trainer(SFTTrainer)(  # was: SFTTrainer(
    model=tiny_llama(), args=config, train_dataset=data, processing_class=tokenizer)
trainer.train()
