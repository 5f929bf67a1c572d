"""Ways into the engine from the loops people already have: the Hugging Face Trainer and TRL
(`transformers`), DeepSpeed training scripts (`deepspeed`). A plain torch loop and Accelerate use
`superoffload.AdamW` directly."""
