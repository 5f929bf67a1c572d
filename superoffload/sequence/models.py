"""Sequence parallelism for the zoo's models (our GPT, Hugging Face Llama-style models) and bare transformers
causal LMs. A zoo model says where to attach (``sequence_parallel_plan()``, superoffload.models.parallel);
nothing here checks a model's class.

``enable_sequence_parallel(model, group)`` changes, at setup, what differs when each rank of ``group``
holds a contiguous chunk of every sequence:

- attention: Ulysses around the model's unchanged local attention (for GPT through
  ``CausalSelfAttention.attention_fn``; for transformers models through transformers' attention
  registry, ``AttentionInterface.register`` + ``set_attn_implementation``, no monkeypatching). The
  causal mask is the global one: the local attention runs causally over the gathered sequence;
- positions: learned position embeddings (GPT) and RoPE position ids (transformers) start at the
  rank's global offset ``rank * local_len`` (a forward pre-hook fills them in when not given);
- loss: the zoo models' loss becomes ``TokenNormalizedLoss`` (sum of this rank's token losses x
  1 / global token count), optionally tiled over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from superoffload.models.parallel import SequenceParallelPlan
from superoffload.sequence.loss import IGNORE_INDEX, TokenNormalizedLoss, global_loss
from superoffload.sequence.ulysses import (
    Group,
    UlyssesAttention,
    group_rank,
    group_size,
    kv_repeat_factor,
    shard_sequence,
    ulysses_attention,
)

HF_ATTENTION = "superoffload_ulysses"   # the name registered in transformers' AttentionInterface


@dataclass
class SequenceParallel:
    """What ``enable_sequence_parallel`` set up; ``disable()`` undoes it."""

    model: nn.Module
    group: Group
    sp: int
    rank: int
    loss: TokenNormalizedLoss
    _undo: list = field(default_factory=list, repr=False)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's contiguous chunk of a global [batch, seq, ...] tensor (inputs, shifted targets)."""
        return shard_sequence(x, self.group, dim)

    def position_offset(self, local_len: int) -> int:
        """Global position of this rank's first token."""
        return self.rank * local_len

    def global_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The global mean loss (sum of the ranks' token-normalized losses), for logging."""
        return global_loss(loss, self.loss.group)

    def disable(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


# ------------------------------------------------------------------------- hook route (our GPT)
def _enable_hooks(model: nn.Module, plan: SequenceParallelPlan, sp: SequenceParallel) -> None:
    attention = UlyssesAttention(sp.group, plan.heads, plan.kv_heads)   # raises on bad head counts
    old_attention = [(attn, attn.attention_fn) for attn in plan.attention]
    for attn in plan.attention:
        attn.attention_fn = attention
    key = plan.position_kwarg

    def positions(module, args, kwargs):
        if key not in kwargs:
            idx = args[0] if args else kwargs["idx"]
            kwargs[key] = sp.position_offset(idx.shape[1])
        return args, kwargs

    handle = model.register_forward_pre_hook(positions, with_kwargs=True)
    owner = plan.loss_owner
    old_loss = owner.loss_fn if owner is not None else None
    if owner is not None:
        owner.loss_fn = sp.loss

    def undo() -> None:
        for attn, fn in old_attention:
            attn.attention_fn = fn
        handle.remove()
        if owner is not None:
            owner.loss_fn = old_loss

    sp._undo.append(undo)


# ----------------------------------------------------------------------------------- transformers
def _hf_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  is_causal: bool | None = None, **kwargs):
    """transformers attention function: q [b, H, s, d], k/v [b, KV, s, d] -> ([b, s, H, d], None)."""
    if not hasattr(module, "sequence_parallel_group"):
        raise RuntimeError(f"{type(module).__name__} runs {HF_ATTENTION!r} attention but was not set up by "
                           "superoffload.sequence.enable_sequence_parallel")
    if attention_mask is not None:
        raise ValueError("Ulysses sequence parallelism runs causal attention over the whole sequence; "
                         "attention masks (padding, packing, custom) are not supported")
    if is_causal is False or not getattr(module, "is_causal", True):
        raise ValueError("Ulysses sequence parallelism here supports causal (decoder) attention only")
    out = ulysses_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                            module.sequence_parallel_group, scale=scaling, dropout_p=dropout)
    return out, None


def _hf_mask(*args, **kwargs):
    """Mask function for ``HF_ATTENTION``: no mask (causal over the gathered sequence); a padding mask is an error."""
    if kwargs.get("attention_mask") is not None:
        raise ValueError("Ulysses sequence parallelism runs causal attention over the whole sequence; "
                         "attention masks (padding, packing, custom) are not supported")
    return None


def _register_hf_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTENTION, _hf_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # pragma: no cover - older transformers: custom names get no mask
        return
    AttentionMaskInterface.register(HF_ATTENTION, _hf_mask)


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def _set_attn_implementation(hf: nn.Module, name: str) -> None:
    if hasattr(hf, "set_attn_implementation"):
        hf.set_attn_implementation(name)
    else:  # pragma: no cover - older transformers
        hf.config._attn_implementation = name


def _enable_hf(hf: nn.Module, sp: SequenceParallel, wrapper: nn.Module | None) -> None:
    config = hf.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    kv_repeat_factor(heads, kv_heads, sp.sp)                       # raises on bad head counts
    if "dynamic" in _rope_type(config):
        raise ValueError(f"RoPE type {_rope_type(config)!r} depends on the sequence length each rank sees; "
                         "it is not supported under sequence parallelism")
    if wrapper is not None:
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(config, attr, None):
                raise ValueError(f"config.{attr} is set: the token-normalized loss takes logits = lm_head(hidden)")

    _register_hf_attention()
    attention_modules = [m for m in hf.modules() if hasattr(m, "num_key_value_groups") and hasattr(m, "head_dim")]
    if not attention_modules:
        raise ValueError(f"found no attention modules in {type(hf).__name__}")
    for m in attention_modules:
        m.sequence_parallel_group = sp.group
    old_impl = config._attn_implementation
    _set_attn_implementation(hf, HF_ATTENTION)

    decoder = hf.get_decoder()

    def positions(module, args, kwargs):
        if kwargs.get("position_ids") is None:
            ref = kwargs.get("input_ids", args[0] if args else None)
            if ref is None:
                ref = kwargs["inputs_embeds"]
            s = ref.shape[1]
            kwargs["position_ids"] = (torch.arange(s, device=ref.device) + sp.position_offset(s)).unsqueeze(0)
        return args, kwargs

    handles = [decoder.register_forward_pre_hook(positions, with_kwargs=True)]

    def no_labels(module, args, kwargs):
        if kwargs.get("labels") is not None:
            raise ValueError("under sequence parallelism transformers' labels loss would shift the labels inside each "
                             "rank's chunk: shift the targets over the whole sequence, shard them, and compute the "
                             "loss with SequenceParallel.loss(hidden, lm_head, targets)")
        return None

    if decoder is not hf:
        handles.append(hf.register_forward_pre_hook(no_labels, with_kwargs=True))
    old_loss = wrapper.loss_fn if wrapper is not None else None
    if wrapper is not None:
        wrapper.loss_fn = sp.loss

    def undo() -> None:
        for h in handles:
            h.remove()
        for m in attention_modules:
            del m.sequence_parallel_group
        _set_attn_implementation(hf, old_impl)
        if wrapper is not None:
            wrapper.loss_fn = old_loss

    sp._undo.append(undo)


# ------------------------------------------------------------------------------------------ entry
def enable_sequence_parallel(model: nn.Module, group: Group = None, *, loss_tile: int | None = None,
                             loss_group: Group = None, global_tokens: int | None = None,
                             ignore_index: int = IGNORE_INDEX) -> SequenceParallel:
    """Set ``model`` up for Ulysses sequence parallelism over ``group`` (default: the whole world).

    ``model``: our GPT, the zoo's ``CausalLM`` around a transformers model, or a bare transformers
    causal LM (``LlamaForCausalLM``; then compute the loss yourself with ``SequenceParallel.loss`` on the
    decoder's last hidden state -- its ``labels`` loss is refused). Raises ValueError when the heads cannot
    be split over the group (attention heads must divide by SP; KV heads divide by SP or SP by them).

    Loss (GPT and CausalLM): ``TokenNormalizedLoss(loss_group or group, tile=loss_tile,
    global_tokens=global_tokens)`` -- the sum of this rank's token losses over the global token count;
    pass as ``loss_group`` every rank whose gradients are summed (SP x DP), or the count itself.

    Inputs: every rank feeds its chunk ``SequenceParallel.shard(x)`` of the same global batch; targets are
    shifted over the whole sequence *before* sharding. Gradients: sum (all-reduce SUM) over the ranks.
    """
    if getattr(model, "_sequence_parallel", None) is not None:
        raise RuntimeError("sequence parallelism is already enabled on this model; call disable() first")
    sp = SequenceParallel(model=model, group=group, sp=group_size(group), rank=group_rank(group),
                          loss=TokenNormalizedLoss(loss_group if loss_group is not None else group, tile=loss_tile,
                                                   global_tokens=global_tokens, ignore_index=ignore_index))
    plan = _plan_of(model)
    if plan.transformers_model is not None:
        _enable_hf(plan.transformers_model, sp, plan.loss_owner)
    else:
        _enable_hooks(model, plan, sp)
    model._sequence_parallel = sp
    sp._undo.insert(0, lambda: setattr(model, "_sequence_parallel", None))
    return sp



def _plan_of(model: nn.Module) -> SequenceParallelPlan:
    """The model's own plan (a zoo model's ``sequence_parallel_plan()``), else the transformers route for a
    bare transformers causal LM (no loss to replace)."""
    ask = getattr(model, "sequence_parallel_plan", None)
    if callable(ask):
        return ask()
    if hasattr(model, "config") and hasattr(model, "get_decoder"):
        return SequenceParallelPlan(loss_owner=None, transformers_model=model)
    raise TypeError(f"enable_sequence_parallel supports superoffload's GPT, CausalLM and transformers causal "
                    f"LMs, not {type(model).__name__}")
