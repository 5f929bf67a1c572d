"""A tiny Llama built from its config (nothing is downloaded) and random token rows, for the examples."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))


class Rows(torch.utils.data.Dataset):
    """`n` rows of `seq` token ids, as a tokenized dataset holds them (labels = input_ids)."""

    def __init__(self, n: int = 64, seq: int = 32) -> None:
        self.ids = torch.randint(0, 256, (n, seq), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}
