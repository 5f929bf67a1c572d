"""What a zoo model tells sequence parallelism about itself.

``superoffload.sequence`` sits above the zoo, so it must not check the zoo's classes (that made the two
packages import each other). Instead each zoo model answers ``sequence_parallel_plan()`` with the hook
points it offers, and ``enable_sequence_parallel`` attaches to those: the model owns its parallel plan
(torchtitan's ``parallelize_fn`` in the same spirit). A model without the method is taken to be a bare
transformers causal LM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn


@dataclass(frozen=True)
class SequenceParallelPlan:
    """Where sequence parallelism attaches to a model: one of two routes.

    - transformers route (``transformers_model`` set): attention through transformers' attention
      registry, positions through the decoder's ``position_ids``;
    - hook route (our GPT): ``attention`` modules each with an ``attention_fn`` slot
      (``fn(q, k, v) -> y``, all [batch, seq, heads, head_dim]) and the model's forward keyword
      ``position_kwarg`` that takes the global position of a chunk's first token.
    """

    loss_owner: nn.Module | None  # has a ``loss_fn`` slot, ``fn(hidden, lm_head, targets) -> loss``; None: none
    transformers_model: nn.Module | None = None
    attention: tuple[nn.Module, ...] = ()
    heads: int = 0     # attention heads of each ``attention`` module (the hook route)
    kv_heads: int = 0  # their key/value heads
    position_kwarg: str | None = None
