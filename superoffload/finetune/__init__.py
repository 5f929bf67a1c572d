"""Fine-tune a Hugging Face causal LM (or a zoo model) with the SuperOffload engine, end to end.

    superoffload finetune --model ./Llama-3.1-8B --data alpaca.json --steps 1000 --out runs/llama

Modules, one concern each: ``tokenizer`` (the model's tokenizer or the byte-level fallback), ``data``
(JSON/JSONL/.bin reading, prompt masking, packing or padding, batches by step), ``model`` (loading,
activation checkpointing, the shape for the planner and FLOPs), ``schedule`` (warm-up + cosine LR),
``checkpoint`` (atomic checkpoints, bit-exact resume, the final save_pretrained), ``progress`` (bar or log
lines with tokens/s, TFLOPS, MFU), ``runrecord`` (finishing the run record, built by ``bench run``'s own
superoffload.harness.record), ``train``
(the loop), ``convergence`` (engine vs plain torch on real text). docs/finetune.md has the details.
"""

from superoffload.finetune.errors import FinetuneInputError
from superoffload.finetune.train import FinetuneConfig, prepare, run_finetune, train

__all__ = ["FinetuneConfig", "FinetuneInputError", "prepare", "run_finetune", "train"]
