"""One gloo rank of the sequence-parallel tests (started by ``_launch.run_ranks``).

Every rank builds the same global inputs and models from fixed seeds, computes the single-process
(SP=1) reference itself, runs its sequence-parallel part, and writes what it measured to
OUT/rank{R}.json; the tests assert on those numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from superoffload.models import get_shape
from superoffload.models.gpt import GPT
from superoffload.models.hf import build_hf
from superoffload.sequence import (
    TokenNormalizedLoss,
    enable_offloaded_checkpointing,
    enable_sequence_parallel,
    ulysses_attention,
)
from superoffload.shapes import ModelShape

warnings.filterwarnings("ignore", category=FutureWarning)


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref| (0 when both are 0)."""
    a, ref = a.double(), ref.double()
    scale = ref.abs().max().item()
    diff = (a - ref).abs().max().item()
    return diff / scale if scale else diff


# --------------------------------------------------------------------------------------- attention
ATTENTION_CASES = {2: [(4, 4), (4, 2), (4, 1), (8, 2)], 4: [(4, 4), (8, 4), (4, 2), (8, 1)]}
ERROR_CASES = {2: [(3, 3), (6, 3)], 4: [(6, 6), (12, 3)]}


def attention(world: int, rank: int) -> dict:
    b, seq, d = 2, 32, 16
    s = seq // world
    out = {}
    for heads, kv in ATTENTION_CASES[world]:
        g = torch.Generator().manual_seed(100 * heads + kv)
        q, k, v = (torch.randn(b, seq, n, d, generator=g) for n in (heads, kv, kv))
        gout = torch.randn(b, seq, heads, d, generator=g)
        # reference: one process, the whole sequence
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        yr = F.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2),
                                            is_causal=True, enable_gqa=heads != kv).transpose(1, 2)
        yr.backward(gout)
        # this rank: its chunk of the sequence
        chunk = slice(rank * s, (rank + 1) * s)
        ql, kl, vl = (t[:, chunk].clone().requires_grad_() for t in (q, k, v))
        y = ulysses_attention(ql, kl, vl)
        y.backward(gout[:, chunk])
        out[f"h{heads}kv{kv}"] = {
            "forward_equal": bool(torch.equal(y, yr[:, chunk])),
            "forward_rel": rel(y.detach(), yr[:, chunk].detach()),
            "dq_rel": rel(ql.grad, qr.grad[:, chunk]),
            "dk_rel": rel(kl.grad, kr.grad[:, chunk]),
            "dv_rel": rel(vl.grad, vr.grad[:, chunk]),
        }
    errors = {}
    for heads, kv in ERROR_CASES[world]:
        shape = ModelShape(name="bad", layers=1, hidden=heads * 8, heads=heads, kv_heads=kv, vocab=64,
                           ffn_hidden=32, max_seq=64)
        try:
            enable_sequence_parallel(GPT(shape))
            errors[f"h{heads}kv{kv}"] = "no error"
        except ValueError as e:
            errors[f"h{heads}kv{kv}"] = str(e)
    out["errors"] = errors
    return out


# ------------------------------------------------------------------------------------------ models
def _batch(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()   # targets shifted over the whole sequence


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare(loss: torch.Tensor, grads: dict, ref_loss: torch.Tensor, ref_grads: dict) -> dict:
    worst = max(rel(grads[n], ref_grads[n]) for n in ref_grads)
    return {"loss": loss.item(), "ref_loss": ref_loss.item(), "loss_rel": rel(loss, ref_loss),
            "grad_rel": worst, "same_params": sorted(grads) == sorted(ref_grads)}


def _sp_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **sp_kwargs) -> tuple[torch.Tensor, dict]:
    sp = enable_sequence_parallel(model, **sp_kwargs)
    loss = model(sp.shard(x), sp.shard(y))
    loss.backward()
    for p in model.parameters():       # the engine's job: SUM over the SP ranks, no averaging
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
    return sp.global_loss(loss), _grads(model)


def _build(name: str, seed: int = 0, ac: bool | str = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    shape = get_shape(name)
    offload = ac == "offload"   # host-memory checkpoints are switched on after the build
    ac = False if offload else ac
    model = GPT(shape, max_seq=64, activation_checkpointing=ac) if shape.family == "gpt" else \
        build_hf(shape, activation_checkpointing=ac).train()
    if offload:
        enable_offloaded_checkpointing(model)
    return model


def _reference(name: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple]:
    """SP=1 on the global batch: the model's own mean loss, and the token-normalized loss."""
    out = {}
    model = _build(name)
    loss = model(x, y)
    loss.backward()
    out["mean"] = (loss.detach(), _grads(model))
    model = _build(name)
    model.loss_fn = TokenNormalizedLoss(global_tokens=y.numel())
    loss = model(x, y)
    loss.backward()
    out["normalized"] = (loss.detach(), _grads(model))
    return out


def model_case(name: str, world: int, ac: bool | str = False, **sp_kwargs) -> dict:
    x, y = _batch(get_shape(name).vocab, 2, 64)
    refs = _reference(name, x, y)
    loss, grads = _sp_step(_build(name, ac=ac), x, y, **sp_kwargs)
    return {k: _compare(loss, grads, *ref) for k, ref in refs.items()}


def llama_bare(world: int) -> dict:
    """A bare transformers LlamaForCausalLM: the trainer computes the loss from the decoder's hidden state."""
    x, y = _batch(get_shape("llama-tiny").vocab, 2, 64)
    refs = _reference("llama-tiny", x, y)
    hf = _build("llama-tiny").model
    sp = enable_sequence_parallel(hf)
    hidden = hf.model(input_ids=sp.shard(x)).last_hidden_state
    loss = sp.loss(hidden, hf.lm_head, sp.shard(y))
    loss.backward()
    for p in hf.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    grads = {f"model.{n}": g for n, g in _grads(hf).items()}
    try:
        hf(input_ids=sp.shard(x), labels=sp.shard(y))
        labels_refused = False
    except ValueError:
        labels_refused = True
    out = {k: _compare(sp.global_loss(loss), grads, *ref) for k, ref in refs.items()}
    out["labels_refused"] = labels_refused
    return out


SCENARIOS = {
    "attention": attention,
    "gpt": lambda w, r: model_case("gpt-tiny", w),
    "gpt_offload_tiled": lambda w, r: model_case("gpt-tiny", w, ac="offload", loss_tile=48),
    "llama": lambda w, r: model_case("llama-tiny", w),
    "llama_offload_tiled": lambda w, r: model_case("llama-tiny", w, ac="offload", loss_tile=48),
    "llama_bare": lambda w, r: llama_bare(w),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scenarios", required=True)
    a = ap.parse_args()
    assert os.environ.get("OMP_NUM_THREADS") == "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", world_size=a.world, rank=a.rank,
                            timeout=timedelta(seconds=60))
    try:
        results = {name: SCENARIOS[name](a.world, a.rank) for name in a.scenarios.split(",")}
        (a.out / f"rank{a.rank}.json").write_text(json.dumps(results, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
