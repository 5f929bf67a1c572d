"""Framework overhead outside the modelled ops: counts read off the model structure, times measured.

Small models on a CPU spend a large share of a step in Python and per-call machinery that the FLOP and
byte terms of the cost model never see: nn.Module calls, view ops, the optimizer's per-tensor loop,
gradient clipping, and each training system's own per-step work (hooks, flattening, communication
layer). Every term here is (count from the model or system structure) x (a constant that
``calibrate`` measures with a microbenchmark of its own). A profile without a constant (the presets)
gets 0 for that term, so predictions on it are unchanged.
"""

from __future__ import annotations

from superoffload.planner.hardware import HardwareProfile
from superoffload.shapes import ModelShape

# nn.Module calls per forward, read off superoffload/models/gpt.py (GPT: Block, ln1, attn, qkv,
# proj, ln2, mlp, fc, fc2; top level: GPT, wte, wpe, ln_f, lm_head) and off transformers'
# LlamaDecoderLayer for the "hf" family (layer, 2 norms, self_attn, q/k/v/o, mlp, gate/up/down, act;
# top level: CausalLM, model, embed_tokens, rotary_emb, norm, lm_head).
BLOCK_MODULES = {"gpt": 9, "hf": 13}
TOP_MODULES = {"gpt": 5, "hf": 6}
# View-like ops of GPT attention not among costmodel.BLOCK_OPS' two reshapes: split, 3 views,
# 3 transposes, the output transpose and reshape (9) minus the 2 counted there.
BLOCK_VIEW_OPS = {"gpt": 7, "hf": 7}
CLIP_BYTES_PER_PARAM = 12  # fp32 grads: read for the norm, read + write for the scale
# What the SuperOffload engine's launch (engine/launch.py) issues per bucket on the training thread, counted
# on the simulated device with the CUDA backend's kernels (superoffload/harness/launch_counts.py; the test
# tests/planner/test_launch_pricing.py recounts it and fails when these drift): "kernels" are ops that
# launch a kernel or a copy across the link, "calls" event records and waits and stream switches. A host
# bucket: the foreach copy into the flat buffer, the norm, the D2H; four event records, the side stream's
# wait, one stream switch, and about one forward wait (one per module, on its buckets' upload). A tail
# bucket: the copy into the tail arena's gradient and the norm, and a forward wait for some.
ENGINE_LAUNCH_OPS = {"host": {"kernels": 3, "calls": 7}, "tail": {"kernels": 2, "calls": 1}}


def param_tensors(shape: ModelShape) -> int:
    """Parameter tensors the optimizer loops over (a tied head shares the embedding's tensor)."""
    if shape.family == "gpt":
        block = 12  # qkv, proj, fc, fc2 (weight + bias each) + 2 LayerNorms (weight + bias each)
        top = 1 + (1 if shape.learned_positions else 0) + 2  # wte, wpe, ln_f weight + bias
    else:
        block = 4 + (3 if shape.gated_mlp else 2) + 2  # q, k, v, o; MLP matrices; 2 RMSNorms (no biases)
        top = 1 + 1  # embed_tokens, final norm
    return shape.layers * block + top + (0 if shape.tied_embeddings else 1)


def block_forward_overhead_s(shape: ModelShape, hw: HardwareProfile) -> float:
    """Forward-only Python cost of one block: module calls (no backward work without hooks) plus the
    view ops' dispatch, charged in full here because their backward nodes are as cheap as the call."""
    fam = shape.family if shape.family in BLOCK_MODULES else "hf"
    mods = BLOCK_MODULES[fam] * (hw.module_call_s or 0.0)
    views = BLOCK_VIEW_OPS[fam] * (hw.op_overhead_s or 0.0) if hw.module_call_s is not None else 0.0
    return mods + views


def top_forward_overhead_s(shape: ModelShape, hw: HardwareProfile) -> float:
    fam = shape.family if shape.family in TOP_MODULES else "hf"
    return TOP_MODULES[fam] * (hw.module_call_s or 0.0)


def gelu_seconds(shape: ModelShape, tokens: int, hw: HardwareProfile) -> float | None:
    """Forward + backward seconds of the MLP activation of one block (None: not measured, or a gated MLP
    whose activation is SiLU, for which the elementwise traffic term stays)."""
    if hw.gelu_elems_per_s is None or shape.gated_mlp:
        return None
    return tokens * shape.ffn_hidden / hw.gelu_elems_per_s


def torch_adam_gbps(hw: HardwareProfile) -> float:
    """Rate of the device-side step of the ``torch`` system: on a CPU-only machine the device is the
    host, so it is the measured torch AdamW rate; on a GPU a fused AdamW streams like a cast."""
    if hw.device_is_host and hw.optimizer_tensor_s is not None and "torch" in hw.host_adam_gbps:
        return hw.host_adam_gbps["torch"]
    return hw.device_cast_gbps


def optimizer_overhead_s(shape: ModelShape, hw: HardwareProfile, clipping: bool) -> float:
    """torch.optim per step beyond the Adam bytes: the per-tensor loop of clip + fused AdamW + zero_grad,
    and the clipping traffic (torch's clip_grad_norm_ reads the grads twice and writes them once)."""
    if hw.optimizer_tensor_s is None:
        return 0.0
    t = param_tensors(shape) * hw.optimizer_tensor_s
    if clipping and hw.clip_gbps:
        t += shape.total_params() * CLIP_BYTES_PER_PARAM / (hw.clip_gbps * 1e9)
    return t


def system_step_overhead_s(system: str, shape: ModelShape, hw: HardwareProfile, buckets: int = 0,
                           per_bucket_and_param: bool = True) -> float:
    """A system's per-step machinery outside the modelled ops (ZeRO-3 / FSDP hooks and flattening per
    layer and tensor, the engine's per-bucket work, size-dependent copies the graph does not have), as
    calibrate measured it on a degenerate model. ``per_bucket_and_param=False`` leaves out the per-bucket and
    per-parameter terms, which the cost model charges at each bucket's launch instead for the SuperOffload
    engine (``engine_launch_overhead_s``)."""
    c = (hw.system_step_s or {}).get(system)
    if not c:
        return 0.0
    t = (c.get("fixed_s", 0.0) + c.get("per_layer_s", 0.0) * shape.layers
         + c.get("per_tensor_s", 0.0) * param_tensors(shape))
    if per_bucket_and_param:
        t += c.get("per_bucket_s", 0.0) * buckets + c.get("per_param_s", 0.0) * shape.total_params()
    return t


def engine_launch_overhead_s(hw: HardwareProfile, params: float, buckets: int, on_device: bool = False) -> float:
    """The SuperOffload engine's machinery of `buckets` buckets holding `params` parameters at their launch, in
    backward (`on_device`: tail buckets). The launch (engine/launch.py `Launcher.launch`, from a gradient hook
    on the training thread) flattens the bucket's gradients, computes its norm and hands it on; the step after
    validation does not touch every parameter again on that thread. Charging it after validation let it
    overlap the host step, which it does not.

    A profile with the device's call costs (`launch_op_s`, `device_call_s`: calibrate on a GPU, the GPU
    presets) is charged what the launch issues, ENGINE_LAUNCH_OPS per bucket at those costs: what a bucket
    costs follows the engine's op counts, not a fit to an older engine. The per-parameter hook is a few Python
    calls (~1 us), left out. Otherwise (CPU profiles, where the device is the host) calibrate's per-bucket
    and per-parameter terms, measured by timing the engine's whole step (calibrate/systems.py)."""
    if hw.launch_op_s is not None:
        ops = ENGINE_LAUNCH_OPS["tail" if on_device else "host"]
        return buckets * (ops["kernels"] * hw.launch_op_s + ops["calls"] * (hw.device_call_s or 0.0))
    c = (hw.system_step_s or {}).get("superoffload")
    if not c:
        return 0.0
    return c.get("per_bucket_s", 0.0) * buckets + c.get("per_param_s", 0.0) * params


def engine_buckets(shape: ModelShape, bucket_size: int) -> int:
    """Buckets as the SuperOffload engine packs them (``superoffload.packing``, via buckets.pack_buckets)."""
    from superoffload.planner.buckets import pack_buckets

    return len(pack_buckets(shape, bucket_size))
