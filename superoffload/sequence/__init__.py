"""Model-side building blocks for long-sequence training (docs/sequence_parallel.md).

- ``ulysses``: Ulysses sequence parallelism (all-to-all around an unchanged local attention);
- ``models``: ``enable_sequence_parallel`` for the zoo's models (superoffload.models) and transformers causal LMs;
- ``loss``: the token-normalized loss (explicit 1 / global-token-count scaling) and the tiled
  cross-entropy that never holds the [tokens, vocab] logits;
- ``checkpoint``: activation checkpointing with the checkpoints in host memory (``enable_offloaded_checkpointing``
  switches a model to it).
"""

from superoffload.sequence.checkpoint import (
    ActivationOffloader,
    OffloadStats,
    enable_offloaded_checkpointing,
    offloaded_checkpoint,
)
from superoffload.sequence.loss import (
    IGNORE_INDEX,
    TiledTokenLosses,
    TokenNormalizedLoss,
    count_tokens,
    global_loss,
    head_weight,
    tiled_token_losses,
    token_losses,
)
from superoffload.sequence.models import (
    HF_ATTENTION,
    SequenceParallel,
    enable_sequence_parallel,
)
from superoffload.sequence.ulysses import (
    HeadsToSeq,
    SeqToHeads,
    UlyssesAttention,
    causal_sdpa,
    heads_to_seq,
    kv_repeat_factor,
    seq_to_heads,
    shard_sequence,
    ulysses_attention,
)

__all__ = [
    "IGNORE_INDEX", "HF_ATTENTION",
    "ActivationOffloader", "OffloadStats", "offloaded_checkpoint", "enable_offloaded_checkpointing",
    "TiledTokenLosses", "TokenNormalizedLoss", "count_tokens", "global_loss", "head_weight",
    "tiled_token_losses", "token_losses",
    "SequenceParallel", "enable_sequence_parallel",
    "HeadsToSeq", "SeqToHeads", "UlyssesAttention", "causal_sdpa", "heads_to_seq", "kv_repeat_factor",
    "seq_to_heads", "shard_sequence", "ulysses_attention",
]
