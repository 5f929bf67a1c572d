"""The Hugging Face Trainer and TRL: `SuperOffloadTrainer`, and `superoffload_trainer(Cls)` for any Trainer
subclass (TRL's `SFTTrainer`, `DPOTrainer`, ...).

A script that trains with `Trainer(..., args=TrainingArguments(optim="adamw_torch", ...))` switches by
changing the class name. The Trainer then builds `superoffload.AdamW` over its usual decay / no-decay
groups, from the arguments it would give torch's AdamW (`learning_rate`, `weight_decay`, `adam_beta1/2`,
`adam_epsilon`), and everything else keeps its meaning:

- `max_grad_norm` is the engine's exact clipping under speculation (upstream SuperOffload turns its
  overlap off whenever clipping is on, and the Trainer's default is 1.0); the logged `grad_norm` is the
  engine's global norm;
- `gradient_accumulation_steps`, the LR scheduler and its warm-up, `bf16` (bf16 weights on the device,
  fp32 masters on the host), `save_steps` / `resume_from_checkpoint` (the optimizer's state holds the
  fp32 masters, so a resume continues bit for bit even when the model's weights are bf16),
  `save_pretrained`, evaluation;
- with several ranks (torchrun) the engine shards its state and averages gradients itself, so the model
  is not wrapped in DistributedDataParallel, and each rank saves its shard of the optimizer state
  (`optimizer_rank{r}.pt`; a checkpoint resumes on another rank count too).

`superoffload_config=`: engine config keys for the optimizer (a dict or a JSON/YAML path, as
`superoffload.initialize` takes; e.g. `{"device_tail_buckets": 2}`); the planner fills the rest at the
first step. It may also be a DeepSpeed config (a dict or a JSON path, e.g. an upstream SuperOffload
config): its "auto" values are filled from the TrainingArguments as the Trainer's DeepSpeed integration
fills them, a value given both ways must agree, and its `scheduler` block (if any) replaces
`lr_scheduler_type`. The Trainer must not also be given `deepspeed=` or `fsdp=`: they are other engines.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

import torch

from superoffload.engine.config import ConfigError
from superoffload.optim import AdamW

log = logging.getLogger(__name__)

ADAMW_NAMES = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused")


def _trainer_class() -> type:
    try:
        from transformers import Trainer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("superoffload.integrations.transformers needs transformers: pip install -e '.[hf]'") from e
    return Trainer


def _optimizer_of(trainer: Any) -> AdamW:
    """The superoffload.AdamW inside whatever wraps it (Accelerate's AcceleratedOptimizer)."""
    opt = trainer.optimizer
    while opt is not None and not isinstance(opt, AdamW):
        opt = getattr(opt, "optimizer", None)
    if opt is None:
        raise RuntimeError("the Trainer has no superoffload.AdamW (was the optimizer replaced?)")
    return opt


class _SuperOffloadTrainerMixin:
    """What a Trainer subclass needs to train with superoffload.AdamW."""

    def __init__(self, *args: Any, superoffload_config: Any = None, **kwargs: Any) -> None:
        self.superoffload_config = superoffload_config
        self._deepspeed: Any = None  # the translated DeepSpeed config, when superoffload_config is one
        super().__init__(*args, **kwargs)
        a = self.args
        if getattr(a, "deepspeed", None) or getattr(a, "fsdp", None):
            raise ValueError(f"{type(self).__name__} trains with SuperOffload: remove deepspeed= / fsdp= from the "
                             f"TrainingArguments (they select another engine)")
        if a.fp16:
            raise ValueError(f"{type(self).__name__}: fp16 needs loss scaling, which the engine cannot get from the "
                             f"Trainer's GradScaler; use bf16=True")
        opt = self.optimizer
        if opt is not None and not isinstance(opt, AdamW):
            raise ValueError(f"{type(self).__name__}: optimizers=({type(opt).__name__}, ...) is not a "
                             f"superoffload.AdamW; pass one, or none and it is built from the TrainingArguments")
        if self.optimizer_cls_and_kwargs is not None and self.optimizer_cls_and_kwargs[0] is not AdamW:
            raise ValueError(f"{type(self).__name__}: optimizer_cls_and_kwargs names "
                             f"{self.optimizer_cls_and_kwargs[0].__name__}; it trains with superoffload.AdamW")
        optim = str(getattr(a.optim, "value", a.optim))
        if opt is None and self.optimizer_cls_and_kwargs is None and optim not in ADAMW_NAMES:
            raise ValueError(f"{type(self).__name__} trains with superoffload.AdamW; optim={optim!r} asks for "
                             f"another optimizer (use one of {', '.join(ADAMW_NAMES)}, the default)")

    # --- the optimizer -------------------------------------------------------------------------------
    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """superoffload.AdamW over the Trainer's decay / no-decay split (`get_decay_parameter_names`), with the
        hyper-parameters the Trainer gives torch's AdamW (or `optimizer_cls_and_kwargs`' keywords)."""
        if self.optimizer is not None:
            return self.optimizer
        a = self.args
        opt_model = self.model if model is None else model
        if self.optimizer_cls_and_kwargs is not None:
            kwargs = dict(self.optimizer_cls_and_kwargs[1])
        else:
            kwargs = {"lr": a.learning_rate, "betas": (a.adam_beta1, a.adam_beta2), "eps": a.adam_epsilon,
                      "weight_decay": a.weight_decay}
        kwargs.setdefault("max_grad_norm", max(0.0, float(a.max_grad_norm or 0.0)))
        kwargs.setdefault("config", self._engine_config(opt_model))
        if a.bf16:
            kwargs.setdefault("precision", "bf16")
        decay = set(self.get_decay_parameter_names(opt_model))
        named = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decay], "weight_decay": kwargs.get("weight_decay", 0.0)},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
        self.optimizer = AdamW([g for g in groups if g["params"]], model=opt_model, **kwargs)
        return self.optimizer

    # --- a DeepSpeed config as superoffload_config -----------------------------------------------
    def _engine_config(self, model: Any) -> Any:
        """superoffload_config as engine keys: as given, or translated from DeepSpeed's format."""
        from superoffload.integrations.deepspeed import batch_sizes, looks_like_deepspeed, report_ignored, translate

        cfg = self.superoffload_config
        if isinstance(cfg, (str, os.PathLike)) and str(cfg).endswith(".json"):
            with open(cfg) as f:
                raw = json.load(f)
            cfg = raw if looks_like_deepspeed(raw) else cfg
        if not looks_like_deepspeed(cfg):
            return cfg
        a = self.args
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        given = {"train_micro_batch_size_per_gpu": a.per_device_train_batch_size,
                 "gradient_accumulation_steps": a.gradient_accumulation_steps,
                 "train_batch_size": a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size,
                 "gradient_clipping": a.max_grad_norm, "optimizer.params.lr": a.learning_rate,
                 "optimizer.params.betas": [a.adam_beta1, a.adam_beta2], "optimizer.params.eps": a.adam_epsilon,
                 "optimizer.params.weight_decay": a.weight_decay, "bf16.enabled": bool(a.bf16),
                 "fp16.enabled": bool(a.fp16),
                 **({"zero_optimization.reduce_bucket_size": hidden * hidden} if hidden else {})}
        st = translate(cfg, fill=given)
        eng = dict(st.engine)
        batch_sizes(st.train_batch_size, st.micro_batch, eng.get("grad_accum"), a.world_size)
        precision = eng.pop("precision", None)
        eng.pop("loss_scale", None)
        said = {"train_micro_batch_size_per_gpu": st.micro_batch,
                "gradient_accumulation_steps": eng.pop("grad_accum", None),
                "gradient_clipping": eng.pop("grad_clip", None),
                "bf16.enabled": None if precision is None else precision == "bf16",
                "fp16.enabled": None if precision is None else precision == "fp16"}
        for k, v in (eng.pop("optimizer", {}) or {}).items():
            if k in ("lr", "betas", "eps", "weight_decay"):
                said[f"optimizer.params.{k}"] = v
        bad = [f"{k}={v!r} (TrainingArguments: {given[k]!r})" for k, v in said.items()
               if v is not None and k in given and v != given[k] and not (isinstance(v, (list, tuple)) and
                                                                           list(v) == list(given[k]))]
        if bad:
            raise ConfigError("the DeepSpeed config disagrees with the TrainingArguments: " + "; ".join(bad))
        line = report_ignored(st.ignored)
        if line and self.args.process_index == 0:
            log.warning(line)
        self._deepspeed = st
        return eng

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The DeepSpeed config's scheduler block, when it has one ("auto" params filled as the Trainer fills
        them); otherwise the Trainer's own (`lr_scheduler_type`)."""
        st = self._deepspeed
        if self.lr_scheduler is None and st is not None and st.scheduler is not None:
            from superoffload.integrations import lr_schedules

            a = self.args
            fill = {"warmup_min_lr": 0.0, "warmup_max_lr": a.learning_rate, "total_num_steps": num_training_steps,
                    "warmup_num_steps": a.get_warmup_steps(num_training_steps)}
            params = {k: fill.get(k, v) if v == "auto" else v for k, v in st.scheduler.get("params", {}).items()}
            self.lr_scheduler = lr_schedules.from_config({**st.scheduler, "params": params},
                                                         optimizer or self.optimizer)
            self._created_lr_scheduler = True
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        # the engine reduces gradients and shards across ranks itself: DistributedDataParallel on top would
        # all-reduce every gradient a second time. Accelerate wraps a model in DDP unless it is prepared in
        # evaluation mode, which changes nothing else (device placement and autocast stay).
        prepare_model = self.accelerator.prepare_model

        def prepare_unwrapped(model: Any, device_placement: bool | None = None, evaluation_mode: bool = False) -> Any:
            return prepare_model(model, device_placement=device_placement, evaluation_mode=True)

        self.accelerator.prepare_model = prepare_unwrapped

    # --- clipping and the logged norm ---------------------------------------------------------------
    def _clip_grad_norm(self, model: Any) -> Any:
        """The Trainer clips before step(): here the engine clips this step exactly, and the pre-clip global
        norm is returned for the log."""
        return _optimizer_of(self).clip_grad_norm_(self.args.max_grad_norm)

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        if grad_norm is None:
            return _optimizer_of(self).grad_norm()
        return grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm

    # --- checkpoints: one file per rank ------------------------------------------------------------
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        opt = _optimizer_of(self)
        world = opt.engine.comm.world
        if world == 1:
            return super()._save_optimizer_and_scheduler(output_dir)
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, f"optimizer_rank{opt.engine.comm.rank}.pt")
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(opt.state_dict(), tmp)
        os.replace(tmp, path)
        if self.args.should_save:
            from transformers.trainer import SCHEDULER_NAME

            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        files = sorted(glob.glob(os.path.join(checkpoint, "optimizer_rank*.pt")))
        if not files:
            return super()._load_optimizer_and_scheduler(checkpoint)  # a one-rank checkpoint
        from transformers.trainer import SCHEDULER_NAME

        opt = _optimizer_of(self)
        own = os.path.join(checkpoint, f"optimizer_rank{opt.engine.comm.rank}.pt")
        if len(files) == opt.engine.comm.world and os.path.exists(own):
            opt.load_state_dict(torch.load(own, map_location="cpu", weights_only=True))
        else:  # another rank count: every rank's shard, re-sharded
            opt.load_state_dict([torch.load(f, map_location="cpu", weights_only=True) for f in files])
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))


def superoffload_trainer(base: type) -> type:
    """`base` (transformers.Trainer or a subclass of it, e.g. TRL's SFTTrainer) training with
    superoffload.AdamW: the same constructor, plus `superoffload_config=`."""
    if not (isinstance(base, type) and issubclass(base, _trainer_class())):
        raise TypeError(f"superoffload_trainer() takes a transformers.Trainer subclass, got {base!r}")
    if issubclass(base, _SuperOffloadTrainerMixin):
        return base
    return type(f"SuperOffload{base.__name__}", (_SuperOffloadTrainerMixin, base),
                {"__module__": __name__, "__doc__": f"{base.__name__} training with superoffload.AdamW."})


def __getattr__(name: str) -> Any:
    if name == "SuperOffloadTrainer":  # built on first use, so importing this module needs no transformers
        cls = superoffload_trainer(_trainer_class())
        cls.__name__ = cls.__qualname__ = "SuperOffloadTrainer"
        globals()[name] = cls
        return cls
    raise AttributeError(name)
