"""DeepSpeed training scripts, unchanged but for the import: `import superoffload as deepspeed`.

`initialize(args=, model=, optimizer=, model_parameters=, training_data=, lr_scheduler=, collate_fn=,
config=, config_params=, ...)` takes DeepSpeed's arguments as DeepSpeed documents them
(https://deepspeed.readthedocs.io/en/latest/initialize.html) and returns its tuple `(engine, optimizer,
training_dataloader, lr_scheduler)`:

- the config comes from `config=` (a dict or a JSON path), else `config_params=`, else
  `args.deepspeed_config` (or `args.deepscale_config`), and is translated key by key
  (https://www.deepspeed.ai/docs/config-json/); a script without one gets an error, never the defaults.
  Keys that mean nothing here (ZeRO stages, offload devices, logging, the upstream SuperOffload knobs the
  planner chooses) are reported once, in one line; a key the translation does not know is an error;
- an optimizer object (torch `Adam` / `AdamW`, DeepSpeed's `DeepSpeedCPUAdam` / `FusedAdam`) gives the
  param groups and hyper-parameters (`adam_w_mode` honoured); the engine reads those very groups, so a
  scheduler built on that optimizer drives it. Any other optimizer is an error;
- `training_data` becomes a DataLoader over it with `train_micro_batch_size_per_gpu` (derived from
  `train_batch_size` / world / accumulation as DeepSpeed derives it), a DistributedSampler over the ranks
  and the `collate_fn`;
- the `scheduler` block (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) builds the same
  schedule (lr_schedules.py); a scheduler (or a callable of the optimizer) given as `lr_scheduler=`
  takes precedence, as in DeepSpeed; `engine.step()` steps it after each applied optimizer step.

The engine answers DeepSpeed's names (`device`, `train()`, `local_rank`, `train_micro_batch_size_per_gpu()`,
`save_checkpoint` / `load_checkpoint`, ...; docs/engine.md has the table).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from superoffload.engine.config import ConfigError
from superoffload.engine.engine import SuperOffloadEngine
from superoffload.engine.optimizer import OffloadOptimizer
from superoffload.integrations import lr_schedules

log = logging.getLogger(__name__)

# accepted and reported: what SuperOffload does by design, or only logging / tooling
IGNORED = {"steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
           "prescale_gradients", "gradient_predivide_factor", "communication_data_type", "dump_state",
           "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "memory_breakdown",
           "activation_checkpointing", "aio", "data_types", "seq_parallel_communication_data_type", "checkpoint",
           "gradient_accumulation_dtype", "timers", "torch_autocast", "use_data_before_expert_parallel_"}
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
ZERO_IGNORED = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                "allgather_bucket_size", "round_robin_gradients", "offload_param", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                "memory_efficient_linear", "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
                "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
                "mics_shard_size", "mics_hierarchical_params_gather", "stage3_module_granularity_threshold"}
OFFLOAD_IGNORED = {"pin_memory", "buffer_count", "fast_init", "pipeline_read", "pipeline_write", "nvme_path",
                   "super_offload", "ratio"}
WHY = {"zero_optimization.offload_optimizer.ratio": "the planner chooses the device tail (device_tail_buckets)",
       "zero_optimization.offload_param": "weight flow is the planner's (flow_layers)",
       "zero_optimization.stage": "the engine shards ZeRO-2 style across ranks by design"}


@dataclass
class Settings:
    """What a DeepSpeed config says beyond the engine config."""

    engine: dict[str, Any]
    train_batch_size: int | None = None
    micro_batch: int | None = None
    scheduler: dict[str, Any] | None = None
    drop_last: bool = False
    ignored: list[str] = field(default_factory=list)


def looks_like_deepspeed(cfg: Any) -> bool:
    """A dict in DeepSpeed's format (its optimizer block, precision blocks, batch keys or ZeRO section)."""
    if not isinstance(cfg, dict):
        return False
    opt = cfg.get("optimizer")
    return (isinstance(opt, dict) and ("params" in opt or "type" in opt)) or any(
        k in cfg for k in ("zero_optimization", "gradient_clipping", "bf16", "fp16", "scheduler", *BATCH_KEYS))


def _auto(key: str, value: Any, fill: dict[str, Any]) -> Any:
    """`value`, or what `fill` gives for an "auto" one (the Hugging Face Trainer's values)."""
    if value != "auto":
        return value
    if key in fill:
        return fill[key]
    raise ConfigError(f"DeepSpeed config {key}: 'auto' is filled by the Hugging Face Trainer; give a value")


def translate(ds: dict[str, Any], fill: dict[str, Any] | None = None) -> Settings:
    """A DeepSpeed config as engine config keys plus the rest it says (batch sizes, scheduler). `fill`:
    values for "auto" entries, by dotted key (what the Hugging Face Trainer would fill in)."""
    fill = fill or {}
    out: dict[str, Any] = {}
    st = Settings(engine=out)
    for key, value in ds.items():
        if key in IGNORED:
            st.ignored.append(key)
        elif key == "optimizer":
            out["optimizer"] = _optimizer(value, fill)
        elif key == "gradient_clipping":
            out["grad_clip"] = float(_auto(key, value, fill))
        elif key == "gradient_accumulation_steps":
            out["grad_accum"] = int(_auto(key, value, fill))
        elif key == "train_batch_size":
            st.train_batch_size = int(_auto(key, value, fill))
        elif key == "train_micro_batch_size_per_gpu":
            st.micro_batch = int(_auto(key, value, fill))
        elif key in ("bf16", "bfloat16"):
            if _enabled(key, value, fill):
                out["precision"] = "bf16"
        elif key == "fp16":
            if _enabled(key, value, fill):
                out["precision"] = "fp16"
                out["loss_scale"] = _loss_scale(value)
        elif key == "amp":
            if _enabled(key, value, fill):
                raise ConfigError("DeepSpeed 'amp' (NVIDIA Apex) is not supported: use bf16 (or fp16)")
        elif key == "zero_optimization":
            out.update(_zero(value, st.ignored, fill))
        elif key == "scheduler":
            st.scheduler = value
        elif key == "dataloader_drop_last":
            st.drop_last = bool(value)
        else:
            raise ConfigError(f"DeepSpeed config key {key!r} has no SuperOffload equivalent; remove it (keys "
                              f"accepted and ignored: {', '.join(sorted(IGNORED))})")
    return st


def report_ignored(ignored: list[str]) -> str:
    """The one line that says what was ignored and why (empty when nothing was)."""
    if not ignored:
        return ""
    parts = [f"{k} ({WHY[k]})" if k in WHY else k for k in sorted(set(ignored))]
    return "DeepSpeed config keys with no meaning for SuperOffload, ignored: " + ", ".join(parts)


def _enabled(key: str, block: Any, fill: dict[str, Any]) -> bool:
    value = block.get("enabled", False) if isinstance(block, dict) else block
    return bool(_auto(f"{key}.enabled", value, fill))


def _optimizer(block: Any, fill: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise ConfigError(f"DeepSpeed 'optimizer' must be a mapping, got {block!r}")
    kind = str(block.get("type", "AdamW")).lower()
    if kind not in ("adam", "adamw", "cpuadam", "fusedadam"):
        raise ConfigError(f"DeepSpeed optimizer type {block.get('type')!r}: SuperOffload trains with Adam(W) only")
    params = dict(block.get("params", {}))
    out: dict[str, Any] = {}
    for k in ("lr", "betas", "eps", "weight_decay"):
        if k in params:
            out[k] = _auto(f"optimizer.params.{k}", params.pop(k), fill)
    # DeepSpeed's Adam defaults to decoupled weight decay (adam_w_mode: true) like AdamW
    out["adamw"] = bool(params.pop("adam_w_mode", True)) if kind != "adamw" else True
    for k in ("amsgrad", "bias_correction"):
        if k in params:
            out[k] = params.pop(k)
    params.pop("torch_adam", None)
    if params:
        raise ConfigError(f"DeepSpeed optimizer params {sorted(params)} have no SuperOffload equivalent")
    return out


def _loss_scale(fp16: Any) -> dict[str, Any]:
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


def _zero(zero: Any, ignored: list[str], fill: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(zero, dict):
        raise ConfigError(f"DeepSpeed 'zero_optimization' must be a mapping, got {zero!r}")
    out: dict[str, Any] = {}
    # the engine's bucket is the unit the host steps (DeepSpeed's sub-group) and reduces: sub_group_size
    # first, reduce_bucket_size when it is the only one given
    for k in ("reduce_bucket_size", "sub_group_size"):
        if k in zero:
            out["bucket_size"] = int(float(_auto(f"zero_optimization.{k}", zero[k], fill)))
    for k, v in zero.items():
        if k in ("sub_group_size", "reduce_bucket_size"):
            continue
        if k == "offload_optimizer":
            out.update(_offload(v, ignored))
        elif k in ZERO_IGNORED:
            ignored.append(f"zero_optimization.{k}")
        else:
            raise ConfigError(f"DeepSpeed config key zero_optimization.{k} has no SuperOffload equivalent")
    return out


def _offload(v: Any, ignored: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(v, dict):
        return out
    if v.get("device", "cpu") not in ("cpu", "none"):
        raise ConfigError(f"zero_optimization.offload_optimizer.device {v['device']!r}: SuperOffload keeps the "
                          f"optimizer state in host memory (cpu)")
    for k, x in v.items():
        if k == "device":
            continue
        if k == "cpuadam_cores_perc":  # the share of this rank's cores the host Adam may use
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            out["host_threads"] = max(1, int(float(x) * cores))
        elif k in OFFLOAD_IGNORED:
            ignored.append(f"zero_optimization.offload_optimizer.{k}")
        else:
            raise ConfigError(f"DeepSpeed config key zero_optimization.offload_optimizer.{k} has no SuperOffload "
                              f"equivalent")
    return out


def batch_sizes(train: int | None, micro: int | None, accum: int | None, world: int) -> tuple[int, int, int]:
    """(train_batch_size, micro batch per rank, accumulation), derived from the ones given as DeepSpeed
    derives them (train = micro x accumulation x world)."""
    if train is not None and micro is not None and accum is not None:
        pass
    elif train is not None and micro is not None:
        accum = train // micro // world
    elif train is not None and accum is not None:
        micro = train // world // accum
    elif micro is not None and accum is not None:
        train = micro * accum * world
    elif train is not None:
        accum, micro = 1, train // world
    elif micro is not None:
        accum, train = 1, micro * world
    else:
        raise ConfigError("the DeepSpeed config gives neither train_batch_size nor train_micro_batch_size_per_gpu")
    if not (train > 0 and micro > 0 and accum > 0) or train != micro * accum * world:
        raise ConfigError(f"DeepSpeed batch sizes do not agree: train_batch_size {train} != "
                          f"train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum} x "
                          f"world size {world}")
    return train, micro, accum


# --- the script's optimizer ---------------------------------------------------------------------------
def settings_of(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer block a client optimizer stands for (its groups carry lr, betas, eps, weight decay)."""
    name = type(optimizer).__name__
    d = optimizer.defaults
    if isinstance(optimizer, torch.optim.AdamW):
        adamw = True
    elif isinstance(optimizer, torch.optim.Adam):
        adamw = bool(d.get("decoupled_weight_decay", False))
    elif name in ("DeepSpeedCPUAdam", "FusedAdam"):
        adamw = bool(getattr(optimizer, "adam_w_mode", True))
    else:
        raise ConfigError(f"optimizer={name}: SuperOffload trains with Adam(W); pass torch.optim.Adam / AdamW, "
                          f"DeepSpeedCPUAdam or FusedAdam (their settings are taken), or none and give them in the "
                          f"config's optimizer block")
    # amsgrad is per group (the engine holds max_exp_avg_sq when any group has it); bias correction is not
    amsgrad = any(g.get("amsgrad", False) for g in optimizer.param_groups)
    bias = {bool(g.get("bias_correction", True)) for g in optimizer.param_groups}
    if len(bias) > 1:
        raise ConfigError(f"optimizer={name}: bias_correction must be the same in every param group")
    g0 = optimizer.param_groups[0]
    return {"lr": float(g0["lr"]), "betas": [float(b) for b in g0["betas"]], "eps": float(g0["eps"]),
            "weight_decay": float(g0.get("weight_decay", 0.0)), "adamw": adamw, "amsgrad": amsgrad,
            "bias_correction": bias.pop()}


def _check_covered(model: nn.Module, groups: list[dict[str, Any]], name: str) -> None:
    given = {id(p) for g in groups for p in g["params"]}
    left = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in given]
    if left:
        raise ConfigError(f"trainable parameter(s) {', '.join(left[:5])} are not in {name}'s param groups: add them, "
                          f"or freeze them with requires_grad_(False)")


# --- the engine with DeepSpeed's batch sizes, scheduler and checkpoint ---------------------------------
class DeepSpeedEngine(SuperOffloadEngine):
    """The engine as `deepspeed.initialize` returns it: it knows the batch sizes and steps the scheduler."""

    def __init__(self, model: nn.Module, config: dict[str, Any], optimizer: torch.optim.Optimizer, process_group: Any,
                 train_batch: int | None, micro_batch: int | None) -> None:
        super().__init__(model, config, process_group=process_group, optimizer=optimizer)
        optimizer._engine = self
        self._train_batch, self._micro_batch = train_batch, micro_batch
        self.lr_scheduler: Any = None
        self.training_dataloader: Any = None

    def train_batch_size(self) -> int:
        if self._train_batch is None:
            raise RuntimeError("the DeepSpeed config gave no batch size")
        return self._train_batch

    def train_micro_batch_size_per_gpu(self) -> int:
        if self._micro_batch is None:
            raise RuntimeError("the DeepSpeed config gave no batch size")
        return self._micro_batch

    def step(self) -> bool:
        """DeepSpeed's step(): at an accumulation boundary the optimizer step, then the LR scheduler's step
        when the optimizer step was applied (not after a skipped one); a no-op between boundaries."""
        before = self.global_step
        applied = super().step()
        if self.global_step != before and applied and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return applied

    def save_checkpoint(self, save_dir: str, tag: str | None = None, client_state: dict | None = None,
                        save_latest: bool = True, exclude_frozen_parameters: bool = False) -> str:
        """This rank's state (and the scheduler's, and `client_state`) into `save_dir/tag/`; `latest` names the
        tag unless `save_latest=False`. Call it on every rank."""
        state = dict(client_state or {})
        if self.lr_scheduler is not None:
            state["_superoffload_lr_scheduler"] = self.lr_scheduler.state_dict()
        return super().save_checkpoint(save_dir, tag, state, save_latest=save_latest)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn: Any = None) -> tuple[str | None, dict | None]:
        """DeepSpeed's load_checkpoint: `(path, client_state)`, or `(None, None)` with a warning when `load_dir`
        has no `latest` and no tag is given. `load_module_only` / `load_optimizer_states=False` take the
        weights (the fp32 masters) and keep the optimizer's moments and steps."""
        if custom_load_fn is not None:
            raise ConfigError("load_checkpoint(custom_load_fn=) is not supported")
        if tag is None and not os.path.isfile(os.path.join(load_dir, "latest")):
            log.warning("no 'latest' file in %s: no checkpoint loaded (pass tag= to load one)", load_dir)
            return None, None
        weights_only = load_module_only or not load_optimizer_states
        path, client = super().load_checkpoint(load_dir, tag, weights_only=weights_only, strict=load_module_strict)
        sched = client.pop("_superoffload_lr_scheduler", None)
        if sched is not None and self.lr_scheduler is not None and load_lr_scheduler_states and not load_module_only:
            self.lr_scheduler.load_state_dict(sched)
        return path, client


# --- DeepSpeed's initialize ------------------------------------------------------------------------------
def _config_of(args: Any, config: Any, config_params: Any) -> dict[str, Any]:
    cfg = config if config is not None else config_params
    if cfg is None and args is not None:
        cfg = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if cfg is None:
        raise ConfigError("no DeepSpeed config: pass config= (a dict or a JSON path) or --deepspeed_config (read from "
                          "args.deepspeed_config)")
    if isinstance(cfg, (str, os.PathLike)):
        try:
            with open(cfg) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"DeepSpeed config {cfg}: {e}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"the DeepSpeed config must be a dict or a JSON path, got {type(cfg).__name__}")
    return cfg


def init_distributed(dist_backend: str | None = None, distributed_port: int = 29500, dist_init_required: Any = None,
                     **_: Any) -> None:
    """Join torch.distributed's default group when launched with several ranks (torchrun, the deepspeed
    launcher set RANK / WORLD_SIZE / MASTER_ADDR), as deepspeed.init_distributed does: NCCL with CUDA,
    gloo otherwise."""
    import torch.distributed as dist

    if dist_init_required is False or dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    os.environ.setdefault("MASTER_PORT", str(distributed_port))
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def initialize(args: Any = None, model: nn.Module | None = None, optimizer: Any = None, model_parameters: Any = None,
               training_data: Any = None, lr_scheduler: Any = None, distributed_port: int = 29500, mpu: Any = None,
               dist_init_required: bool | None = None, collate_fn: Any = None, config: Any = None,
               mesh_param: Any = None, config_params: Any = None) -> tuple:
    """deepspeed.initialize on the SuperOffload engine: `(engine, optimizer, training_dataloader, lr_scheduler)`."""
    if model is None:
        raise ConfigError("initialize() needs model=")
    if mpu is not None or mesh_param is not None:
        raise ConfigError("mpu= / mesh_param=: model or pipeline parallelism is not supported; the engine is data "
                          "parallel over every rank (superoffload.initialize(model, config, process_group=...))")
    ds = _config_of(args, config, config_params)
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    fill: dict[str, Any] = {}
    if optimizer is not None:
        client = settings_of(optimizer)
        fill = {f"optimizer.params.{k}": client[k] for k in ("lr", "betas", "eps", "weight_decay")}
    st = translate(ds, fill)
    train, micro, accum = batch_sizes(st.train_batch_size, st.micro_batch, st.engine.get("grad_accum"), world)
    st.engine["grad_accum"] = accum
    if optimizer is not None:
        if "optimizer" in st.engine:
            log.warning("both optimizer= and the config's optimizer block were given: the optimizer object's "
                        "settings are used, as in DeepSpeed")
        st.engine["optimizer"] = client
        groups = optimizer.param_groups
        _check_covered(model, groups, type(optimizer).__name__)
    else:
        from superoffload.engine.config import SuperOffloadConfig
        from superoffload.engine.params import build_param_groups

        if "optimizer" not in st.engine:  # DeepSpeed would build no optimizer at all: never train on defaults
            raise ConfigError("no optimizer: pass optimizer= (torch Adam/AdamW, DeepSpeedCPUAdam, FusedAdam) or give "
                              "the DeepSpeed config an 'optimizer' block")
        groups = build_param_groups(model, SuperOffloadConfig.from_any(st.engine), model_parameters)
    line = report_ignored(st.ignored)
    if line and (not dist.is_initialized() or dist.get_rank() == 0):
        log.warning(line)
    view = OffloadOptimizer(None, list(groups))
    engine = DeepSpeedEngine(model, st.engine, view, None, train, micro)
    if lr_scheduler is not None:
        engine.lr_scheduler = lr_scheduler(engine.optimizer) if callable(lr_scheduler) and not hasattr(
            lr_scheduler, "step") else lr_scheduler
    elif st.scheduler is not None:
        engine.lr_scheduler = lr_schedules.from_config(st.scheduler, engine.optimizer)
    if training_data is not None:
        engine.training_dataloader = _loader(training_data, micro, collate_fn, st.drop_last, engine)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _loader(data: Any, micro: int, collate_fn: Any, drop_last: bool, engine: SuperOffloadEngine) -> Any:
    """DeepSpeed's training loader: `micro` samples per rank and step, a DistributedSampler over the ranks (it
    shuffles, seed 0: call `loader.sampler.set_epoch(e)` each epoch, as with DeepSpeed's) and `collate_fn`."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(data, num_replicas=engine.comm.world, rank=engine.comm.rank)
    return DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate_fn, drop_last=drop_last)


def add_config_arguments(parser: Any) -> Any:
    """DeepSpeed's command-line flags (`--deepspeed`, `--deepspeed_config`, and the old `--deepscale*`)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (SuperOffload)")
    group.add_argument("--deepspeed", default=False, action="store_true", help="train with the engine")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    group.add_argument("--deepscale", default=False, action="store_true", help="deprecated alias of --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str, help="deprecated alias of --deepspeed_config")
    return parser
