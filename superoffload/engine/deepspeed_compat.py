"""DeepSpeed's way in: `deepspeed.initialize(...)`'s call and config, mapped onto the engine's.

A DeepSpeed training script ports by changing `deepspeed.initialize` to `superoffload.initialize`: called
with DeepSpeed's keywords (`model=`, `model_parameters=`, `config=`, ...) it returns DeepSpeed's tuple
`(engine, optimizer, training_dataloader, lr_scheduler)`, and a DeepSpeed JSON config is translated key
by key (the keys follow DeepSpeed's configuration documentation,
https://www.deepspeed.ai/docs/config-json/). Keys that have no meaning here (ZeRO stages, offload
devices, logging) are reported once and ignored; a key the translation does not know raises.
"""

from __future__ import annotations

import logging
from typing import Any

from superoffload.engine.config import ConfigError

log = logging.getLogger(__name__)

# DeepSpeed keys that describe what SuperOffload does by design, or only logging: accepted, ignored
IGNORED = {"train_batch_size", "train_micro_batch_size_per_gpu", "steps_per_print", "wall_clock_breakdown",
           "zero_allow_untested_optimizer", "prescale_gradients", "gradient_predivide_factor",
           "communication_data_type", "dump_state", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
           "comms_logger", "memory_breakdown", "activation_checkpointing", "aio", "data_types",
           "seq_parallel_communication_data_type"}
ZERO_IGNORED = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                "allgather_bucket_size", "round_robin_gradients", "offload_param", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                "stage3_gather_16bit_weights_on_model_save", "memory_efficient_linear", "load_from_fp32_weights"}
DEEPSPEED_KWARGS = {"args", "optimizer", "training_data", "lr_scheduler", "collate_fn", "dist_init_required",
                    "config_params", "mpu", "mesh_param"}


def looks_like_deepspeed(cfg: Any) -> bool:
    """A dict in DeepSpeed's format (its optimizer block, precision blocks or ZeRO section)."""
    if not isinstance(cfg, dict):
        return False
    opt = cfg.get("optimizer")
    return (isinstance(opt, dict) and ("params" in opt or "type" in opt)) or any(
        k in cfg for k in ("zero_optimization", "gradient_clipping", "gradient_accumulation_steps", "bf16", "fp16",
                           "train_micro_batch_size_per_gpu", "train_batch_size"))


def translate(ds: dict[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config as an engine config dict."""
    out: dict[str, Any] = {}
    ignored = sorted(k for k in ds if k in IGNORED)
    for key, value in ds.items():
        if key in IGNORED:
            continue
        if key == "optimizer":
            out["optimizer"] = _optimizer(value)
        elif key == "gradient_clipping":
            out["grad_clip"] = value
        elif key == "gradient_accumulation_steps":
            out["grad_accum"] = value
        elif key in ("bf16", "bfloat16"):
            if _enabled(value):
                out["precision"] = "bf16"
        elif key == "fp16":
            if _enabled(value):
                out["precision"] = "fp16"
                out["loss_scale"] = _loss_scale(value)
        elif key == "zero_optimization":
            out.update(_zero(value, ignored))
        elif key == "scheduler":
            raise ConfigError("the DeepSpeed config has a 'scheduler': pass a torch LR scheduler instead (any "
                              "torch.optim.lr_scheduler on engine.optimizer, or lr_scheduler=callable(optimizer))")
        else:
            raise ConfigError(f"DeepSpeed config key {key!r} has no SuperOffload equivalent; remove it (keys "
                              f"accepted and ignored: {', '.join(sorted(IGNORED))})")
    if ignored:
        log.info("DeepSpeed config keys ignored (no meaning for SuperOffload): %s", ", ".join(ignored))
    return out


def _enabled(block: Any) -> bool:
    return bool(block.get("enabled", False)) if isinstance(block, dict) else bool(block)


def _optimizer(block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise ConfigError(f"DeepSpeed 'optimizer' must be a mapping, got {block!r}")
    kind = str(block.get("type", "AdamW")).lower()
    if kind not in ("adam", "adamw", "cpuadam", "fusedadam"):
        raise ConfigError(f"DeepSpeed optimizer type {block.get('type')!r}: SuperOffload trains with Adam(W) only")
    params = dict(block.get("params", {}))
    out: dict[str, Any] = {}
    for k in ("lr", "betas", "eps", "weight_decay"):
        if k in params:
            out[k] = params.pop(k)
    # DeepSpeed's Adam defaults to decoupled weight decay (adam_w_mode: true) like AdamW
    out["adamw"] = bool(params.pop("adam_w_mode", True)) if kind != "adamw" else True
    if "amsgrad" in params:
        out["amsgrad"] = params.pop("amsgrad")
    if "bias_correction" in params:
        out["bias_correction"] = params.pop("bias_correction")
    params.pop("torch_adam", None)
    if params:
        raise ConfigError(f"DeepSpeed optimizer params {sorted(params)} have no SuperOffload equivalent")
    return out


def _loss_scale(fp16: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(fp16, dict):
        return {}
    if fp16.get("loss_scale", 0):
        raise ConfigError("a static fp16 loss_scale is not supported: SuperOffload scales dynamically")
    out: dict[str, Any] = {}
    if "initial_scale_power" in fp16:
        out["init_scale"] = float(2 ** int(fp16["initial_scale_power"]))
    if "loss_scale_window" in fp16:
        out["growth_interval"] = fp16["loss_scale_window"]
    if "min_loss_scale" in fp16:
        out["min_scale"] = fp16["min_loss_scale"]
    return out


def _zero(zero: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in zero.items():
        if k in ("sub_group_size", "reduce_bucket_size"):
            out["bucket_size"] = int(v)
        elif k == "offload_optimizer" and isinstance(v, dict):
            if "ratio" in v:  # DeepSpeed super_offload: the share of sub-groups stepped on the CPU
                log.info("zero_optimization.offload_optimizer.ratio: SuperOffload's planner chooses the device "
                         "tail (device_tail_buckets) instead")
            ignored.append("zero_optimization.offload_optimizer")
        elif k in ZERO_IGNORED:
            ignored.append(f"zero_optimization.{k}")
        else:
            raise ConfigError(f"DeepSpeed config key zero_optimization.{k} has no SuperOffload equivalent")
    return out


def deepspeed_initialize(engine_cls: type, model: Any, config: Any, model_parameters: Any, process_group: Any,
                         kwargs: dict[str, Any]) -> tuple:
    """`deepspeed.initialize`'s signature and return value on the SuperOffload engine."""
    unknown = set(kwargs) - DEEPSPEED_KWARGS
    if unknown:
        raise TypeError(f"initialize() got unexpected keyword(s) {sorted(unknown)}")
    if kwargs.get("optimizer") is not None:
        raise ConfigError("optimizer=: SuperOffload runs its own Adam(W) on the host; give its settings in the "
                          "config's 'optimizer' block instead of an optimizer object")
    if kwargs.get("mpu") is not None or kwargs.get("mesh_param") is not None:
        raise ConfigError("mpu= / mesh_param=: pass process_group= (the data-parallel ranks) instead")
    config = config if config is not None else kwargs.get("config_params")
    if looks_like_deepspeed(config):
        config = translate(config)
    engine = engine_cls(model, config, model_parameters, process_group)
    sched = kwargs.get("lr_scheduler")
    if callable(sched) and not hasattr(sched, "step"):
        sched = sched(engine.optimizer)
    loader = None
    if kwargs.get("training_data") is not None:
        raise ConfigError("training_data=: build the DataLoader yourself (each rank its own shard); SuperOffload "
                          "does not know the micro-batch size")
    return engine, engine.optimizer, loader, sched
