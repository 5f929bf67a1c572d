"""The fine-tuning loop: validate and load everything, plan, train with the engine, checkpoint, record.

``prepare(FinetuneConfig)`` does every check and every load (model, tokenizer, data, plan, engine config,
checkpoint to resume) and raises ``FinetuneInputError`` on bad input, before any training step.
``train(prepared)`` runs the steps and returns the run record. ``run_finetune`` is both.

The loss of a step is the mean cross-entropy over the step's learned tokens (all micro-batches
together): each micro-batch contributes ``sum of its token losses / learned tokens of the step``, so
gradient accumulation gives the same gradient as one large batch, whatever the padding or prompt masking
of each micro-batch (the normalization Hugging Face's Trainer adopted in 2024:
https://huggingface.co/blog/gradient_accumulation). ``engine.backward`` divides by ``grad_accum``
itself, so the loop hands it ``grad_accum`` times that.

Ranks: under torchrun (``RANK`` / ``WORLD_SIZE``) each rank trains its own rows; the engine shards the
optimizer over the ranks and sums their gradients (``gradient_reduction: sum``), and the learned-token
count of a step is summed over the ranks, so W ranks train exactly the global batch one rank would
(up to the summation order). Only rank 0 prints and writes the record and the final model; every rank
writes its engine shard into a checkpoint.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
import uuid
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from superoffload.engine import files
from superoffload.finetune import checkpoint as ckpt
from superoffload.finetune.data import IGNORE, Rows, TrainData, check_data_path, load_rows
from superoffload.finetune.errors import FinetuneInputError
from superoffload.finetune.model import LoadedModel, load_model, restore_buffer_dtypes, snapshot_buffers
from superoffload.finetune.progress import Progress
from superoffload.finetune.runrecord import finish_record
from superoffload.finetune.schedule import WarmupCosine, make_scheduler, warmup_steps
from superoffload.finetune.stop import EXIT_PREEMPTED, StopRequest
from superoffload.harness.peak import resolve_peak
from superoffload.harness.record import new_record
from superoffload.harness.system import RunConfig
from superoffload.options import PRECISIONS, Precision, torch_dtype
from superoffload.shapes import MODELS

DEFAULT_MAX_LENGTH = 2048
# settings a resumed run must share with the checkpoint to continue bit-exactly
# (the global batch, not the per-rank one: the rows of a step depend only on it, so a run may resume on
# another number of ranks)
RESUME_KEYS = ("model", "data_sha256", "max_length", "pad", "global_batch", "grad_accum", "steps", "lr", "warmup",
               "min_lr_ratio", "seed", "dtype", "optimizer", "grad_clip", "activation_checkpointing")


@dataclass
class FinetuneConfig:
    """Everything `superoffload finetune` takes (the CLI's flags, same names)."""

    model: str
    data: str
    steps: int
    out: str
    config: str | dict[str, Any] | None = None  # engine config overrides: a JSON/YAML path or a dict
    max_length: int | None = None  # default: min(2048, the model's max positions)
    pad: bool = False  # one example per row, padded (default: packing)
    batch: int = 4  # micro-batch, rows per rank
    grad_accum: int = 1
    lr: float = 1e-5
    warmup_ratio: float = 0.05
    warmup_steps: int | None = None  # overrides warmup_ratio
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: Precision = "bf16"  # of the device weights (the old name ``dtype`` is still accepted)
    save_dtype: str = "auto"  # auto: the precision the model was stored in, else ``precision``
    activation_checkpointing: bool = True
    seed: int = 42
    save_every: int = 0  # 0: checkpoint only at the end (and at --stop-after)
    keep_checkpoints: int = 2
    resume: bool = False
    stop_after: int | None = None  # stop (checkpointed) after this step, as a pre-emption would
    log_every: int = 10
    timing_warmup: int = 2  # first steps of the process excluded from throughput
    device: str = "auto"
    threads: int | None = None
    hardware: str | None = None  # planner profile: preset name or calibrate JSON (default: from the device)
    plan: bool = True
    peak_flops: float | None = None
    data_dtype: str = "uint16"
    progress: bool = True
    print_plan: bool = True
    dtype: InitVar[str | None] = None  # the old name of ``precision``

    def __post_init__(self, dtype: str | None) -> None:
        if dtype is not None:
            self.precision = dtype


@dataclass
class Prepared:
    cfg: FinetuneConfig
    loaded: LoadedModel
    rows: Rows
    run: RunConfig
    plan: Any
    engine_config: Any  # SuperOffloadConfig
    overrides: dict[str, Any]
    max_length: int
    warmup: int
    settings: dict[str, Any]
    resume_from: Path | None = None
    rank: int = 0
    world: int = 1
    notes: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # a fresh run's; a resumed one keeps its own


def dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


# ================================================================================================ checks
def _check_scalars(c: FinetuneConfig) -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise FinetuneInputError(msg)

    need(isinstance(c.steps, int) and c.steps >= 1, f"--steps must be a positive integer, got {c.steps}")
    need(c.batch >= 1, f"--batch must be >= 1, got {c.batch}")
    need(c.grad_accum >= 1, f"--grad-accum must be >= 1, got {c.grad_accum}")
    need(c.max_length is None or c.max_length >= 2, f"--max-length must be >= 2, got {c.max_length}")
    need(c.lr > 0, f"--lr must be > 0, got {c.lr}")
    need(0 <= c.warmup_ratio < 1, f"--warmup-ratio must be in [0, 1), got {c.warmup_ratio}")
    need(c.warmup_steps is None or 0 <= c.warmup_steps <= c.steps,
         f"--warmup-steps must be in [0, --steps], got {c.warmup_steps}")
    need(0 <= c.min_lr_ratio <= 1, f"--min-lr-ratio must be in [0, 1], got {c.min_lr_ratio}")
    need(c.weight_decay >= 0, f"--weight-decay must be >= 0, got {c.weight_decay}")
    need(c.grad_clip >= 0, f"--grad-clip must be >= 0 (0 disables clipping), got {c.grad_clip}")
    need(c.precision in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)}, got {c.precision!r}")
    need(c.save_dtype in ("auto", *PRECISIONS), f"--save-dtype must be auto or one of {', '.join(PRECISIONS)}, "
         f"got {c.save_dtype!r}")
    need(c.save_every >= 0, f"--save-every must be >= 0 (0: only at the end), got {c.save_every}")
    need(c.keep_checkpoints >= 1, f"--keep-checkpoints must be >= 1, got {c.keep_checkpoints}")
    need(c.stop_after is None or 1 <= c.stop_after <= c.steps,
         f"--stop-after must be in [1, --steps={c.steps}], got {c.stop_after}")
    need(c.log_every >= 1, f"--log-every must be >= 1, got {c.log_every}")
    need(c.timing_warmup >= 0, f"--timing-warmup must be >= 0, got {c.timing_warmup}")
    need(c.threads is None or c.threads >= 1, f"--threads must be >= 1, got {c.threads}")
    need(c.device in ("auto", "cuda", "cpu"), f"--device must be auto, cuda or cpu, got {c.device!r}")
    need(c.device != "cuda" or torch.cuda.is_available(), "--device cuda requested but no CUDA device is available")
    need(c.peak_flops is None or c.peak_flops > 0, f"--peak-flops must be > 0, got {c.peak_flops}")


def _check_model_spec(spec: str) -> None:
    """Cheap: before anything is loaded."""
    p = Path(spec)
    if p.is_dir() or spec in MODELS:
        return
    raise FinetuneInputError(f"--model {spec!r} is neither a local model directory nor a zoo model; nothing is "
                             f"downloaded (save the model with save_pretrained into a local directory first, or "
                             f"use a zoo name such as gpt-tiny, gpt-small, llama-tiny)")


def _load_overrides(config: str | dict[str, Any] | None) -> dict[str, Any]:
    """Engine config keys from a JSON or YAML file (or a dict), to merge over the planned config."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return copy.deepcopy(config)
    path = Path(config)
    if not path.is_file():
        raise FinetuneInputError(f"--config {config!r} does not exist")
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text())
        else:
            data = json.loads(path.read_text())
    except Exception as e:  # noqa: BLE001 - any parse error is bad input
        raise FinetuneInputError(f"--config {config}: cannot parse ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:200]})") from None
    if not isinstance(data, dict):
        raise FinetuneInputError(f"--config {config}: expected a mapping of engine config keys at the top level")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve_save_dtype(c: FinetuneConfig, loaded: LoadedModel, precision: str) -> str:
    if c.save_dtype != "auto":
        return c.save_dtype
    return loaded.source_dtype if loaded.source_dtype in PRECISIONS else precision


# ================================================================================================ prepare
def prepare(c: FinetuneConfig) -> Prepared:
    """Check and load everything; FinetuneInputError (one line) on bad input. Nothing trains here."""
    from superoffload.engine import ConfigError, SuperOffloadConfig
    from superoffload.harness.systems.superoffload_system import engine_config, plan_for

    rank, world = dist_env()
    _check_scalars(c)
    check_data_path(c.data)
    _check_model_spec(c.model)
    resume_from, passed_over = _check_out(c)
    overrides = _load_overrides(c.config)
    if c.threads:
        torch.set_num_threads(c.threads)

    loaded = load_model(c.model, seed=c.seed, activation_checkpointing=c.activation_checkpointing)
    _check_finite_model(loaded.module, c.model)
    shape = loaded.shape
    if c.max_length is not None and c.max_length > loaded.max_positions:
        raise FinetuneInputError(f"--max-length {c.max_length} exceeds the model's max positions "
                                 f"{loaded.max_positions}")
    max_length = c.max_length or min(DEFAULT_MAX_LENGTH, loaded.max_positions)
    if loaded.tokenizer.vocab_size > shape.vocab:
        raise FinetuneInputError(f"the tokenizer ({loaded.tokenizer.name}) has {loaded.tokenizer.vocab_size} ids, "
                                 f"more than the model's vocabulary of {shape.vocab}")

    options: dict[str, Any] = {}
    if c.hardware:
        options["hardware"] = c.hardware
    if not c.plan:
        options["plan"] = False
    run = RunConfig(system="superoffload", model=shape.name, seq=max_length, batch=c.batch,
                    grad_accum=c.grad_accum, steps=c.steps, warmup=0, precision=c.precision, seed=c.seed, lr=c.lr,
                    betas=tuple(c.betas), eps=c.eps, weight_decay=c.weight_decay, grad_clip=c.grad_clip,
                    activation_checkpointing=c.activation_checkpointing, threads=c.threads, device=c.device,
                    world=world, system_options=options, peak_flops=c.peak_flops)
    try:
        plan = plan_for(shape, run)
        # the loss is already divided by the step's learned tokens over every rank: gradients are summed
        merged = deep_merge({**engine_config(run, plan).to_dict(), "gradient_reduction": "sum"}, overrides)
        eng_cfg = SuperOffloadConfig.from_any(merged)
    except (ConfigError, ValueError) as e:
        raise FinetuneInputError(f"engine config: {' '.join(str(e).split())}") from None
    # the engine config is the truth for what the file may override
    run.grad_accum, run.precision, run.grad_clip = eng_cfg.grad_accum, eng_cfg.precision, eng_cfg.grad_clip
    run.lr, run.weight_decay = eng_cfg.optimizer.lr, eng_cfg.optimizer.weight_decay
    run.betas, run.eps = tuple(eng_cfg.optimizer.betas), eng_cfg.optimizer.eps
    if overrides:
        run.system_options = {**options, "config": overrides}

    rows = load_rows(c.data, loaded.tokenizer, max_length=max_length, pad=c.pad, seed=c.seed, vocab=shape.vocab,
                     data_dtype=c.data_dtype)
    warm = warmup_steps(c.steps, c.warmup_ratio, c.warmup_steps)
    settings = {"world": world, "global_batch": c.batch * world, "model": c.model,
                "data_sha256": rows.info["sha256"], "max_length": max_length, "pad": c.pad,
                "batch": c.batch, "grad_accum": eng_cfg.grad_accum, "steps": c.steps, "lr": eng_cfg.optimizer.lr,
                "warmup": warm, "min_lr_ratio": c.min_lr_ratio, "seed": c.seed, "dtype": eng_cfg.precision,
                "optimizer": {k: (list(v) if isinstance(v, tuple) else v)
                              for k, v in asdict(eng_cfg.optimizer).items()},
                "grad_clip": eng_cfg.grad_clip, "activation_checkpointing": c.activation_checkpointing,
                "engine_config": eng_cfg.to_dict()}
    prep = Prepared(cfg=c, loaded=loaded, rows=rows, run=run, plan=plan, engine_config=eng_cfg,
                    overrides=overrides, max_length=max_length, warmup=warm, settings=settings,
                    resume_from=resume_from if c.resume else None, rank=rank, world=world)
    if prep.resume_from is not None:
        prep.notes += [f"note: skipped checkpoint {why}" for why in passed_over]
        _check_resume(prep)
    return prep


def _check_out(c: FinetuneConfig) -> tuple[Path | None, list[str]]:
    """--out is a directory this process can write, and its checkpoints agree with --resume: (the latest intact
    checkpoint or None, why newer ones were passed over)."""
    out = Path(c.out)
    if out.exists() and not out.is_dir():
        raise FinetuneInputError(f"--out {c.out!r} exists and is not a directory")
    try:  # found now, not at the first save after the work
        files.check_writable(out / ckpt.CHECKPOINTS)
    except files.CheckpointError as e:
        raise FinetuneInputError(f"--out: {e}") from None
    resume_from, passed_over = ckpt.latest_checkpoint(out)
    if c.resume and resume_from is None:
        why = "; ".join(passed_over) or f"{ckpt.CHECKPOINTS}/{ckpt.LATEST} is missing and no step-* directory"
        raise FinetuneInputError(f"--resume: {c.out} holds no intact checkpoint ({why})")
    if not c.resume and (resume_from is not None or passed_over):
        raise FinetuneInputError(f"{c.out} already holds checkpoints of a run"
                                 f"{f' (latest intact: {resume_from.name})' if resume_from else ''}; pass --resume "
                                 f"to continue it, or choose another --out")
    return resume_from, passed_over


def _check_finite_model(module: torch.nn.Module, source: str) -> None:
    """NaN/Inf weights would make every step skip (a no-op fine-tune): an input error before training."""
    bad = [f"{n} ({int((~torch.isfinite(p)).sum())} values)" for n, p in module.named_parameters()
           if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    if bad:
        raise FinetuneInputError(f"--model {source}: non-finite weights (NaN/Inf) in {', '.join(bad[:3])}"
                                 f"{' and more' if len(bad) > 3 else ''}; a fine-tune cannot start from them")


def _check_resume(prep: Prepared) -> None:
    try:
        trainer = files.load_file(prep.resume_from / ckpt.TRAINER_FILE)
    except files.CheckpointError as e:
        raise FinetuneInputError(f"--resume: {e}") from None
    prep.run_id = str(trainer.get("run_id", ""))
    saved = dict(trainer.get("settings", {}))
    saved.setdefault("global_batch", saved.get("batch"))  # written by one rank before "global_batch" existed
    for key in RESUME_KEYS:
        if saved.get(key) != prep.settings.get(key):
            what = "global_batch (--batch x ranks)" if key == "global_batch" else key
            raise FinetuneInputError(f"--resume: {what} is {prep.settings.get(key)!r} but the checkpoint "
                                     f"{prep.resume_from.name} was written with {saved.get(key)!r}; resume with "
                                     f"the same settings")
    if prep.cfg.stop_after is not None and prep.cfg.stop_after <= trainer["step"]:
        raise FinetuneInputError(f"--stop-after {prep.cfg.stop_after}: the checkpoint is already at step "
                                 f"{trainer['step']}")
    if trainer["step"] >= prep.cfg.steps:
        out = Path(prep.cfg.out)
        if (out / ckpt.FINAL).is_dir() and (out / "record.json").is_file():
            raise FinetuneInputError(f"--resume: the checkpoint is at step {trainer['step']}, the run has "
                                     f"--steps {prep.cfg.steps}, and {ckpt.FINAL}/ and record.json exist: nothing "
                                     f"left to train")
        # the run ended after its last checkpoint but before final/ or the record: write them now
        prep.notes.append(f"note: the checkpoint is at step {trainer['step']} = --steps; writing the missing "
                          f"{ckpt.FINAL}/ and record.json")
    if saved.get("world", 1) != prep.world:
        prep.notes.append(f"note: the checkpoint was written by {saved.get('world', 1)} rank(s), this run has "
                          f"{prep.world}: the engine re-shards its state; gradients are summed in another order, "
                          f"so training continues correctly but not bit-identically")
    elif saved.get("engine_config") != prep.settings["engine_config"]:
        prep.notes.append("note: the engine config differs from the checkpoint's (another plan or --config); "
                          "training continues correctly but not bit-identically to an uninterrupted run")


# ================================================================================================ train
def step_loss_parts(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the next-token cross-entropies (fp32) over the learned positions of a micro-batch."""
    pred = logits[:, :-1].float()
    target = labels[:, 1:].to(pred.device)
    return F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def learned_tokens(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(int((y[:, 1:] != IGNORE).sum()) for _, y in batches)


def _trainer_state(prep: Prepared, step: int, sched: Any, losses: list[float | None], skipped: list[bool],
                   module: torch.nn.Module) -> dict[str, Any]:
    return {"version": 2, "step": step, "run_id": prep.run_id, "scheduler": sched.state_dict(),
            "rng": ckpt.rng_state(),
            "losses": list(losses), "skipped": list(skipped), "settings": prep.settings, "data": {"next_step": step,
                                                                        "sha256": prep.rows.info["sha256"]},
            "buffers": ckpt.model_buffers(module)}


@dataclass
class _Training:
    """What the parts of one ``train`` share: the engine and its schedule, the record being written, and the
    state of the steps (losses, clocks, where they began and stopped)."""

    engine: Any
    sched: Any  # the LR scheduler over the engine's optimizer
    schedule: WarmupCosine
    rec: dict[str, Any]
    data: TrainData
    main: bool  # rank 0: prints, writes the record and the final model
    stdout: TextIO
    stderr: TextIO
    losses: list[float | None] = field(default_factory=list)  # None: no learned token in the step; NaN: not finite
    skipped: list[bool] = field(default_factory=list)  # the optimizer skipped the step (non-finite gradients)
    start: int = 0  # the first step this process trains (a resumed run's checkpoint step)
    end: int = 0  # the step it stops after: --stop-after or --steps, a pre-emption's step once it stopped
    warm: int = 0  # first steps left out of throughput
    peak: tuple[float, str] | None = None  # (FLOP/s, source) for MFU; None: not known
    progress: Any = None  # Progress
    telemetry: Any = None  # Telemetry
    stop: StopRequest = field(default_factory=StopRequest)
    times: list[float] = field(default_factory=list)
    step: int = 0  # the step being trained (a failure's message names it)
    stopped_at: int | None = None  # the step a signal stopped the run after
    final_dir: Path | None = None

    @property
    def device(self) -> Any:
        return self.engine.backend


def train(prep: Prepared, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> dict[str, Any]:
    """Run the steps; return the run record (written to ``DIR/record.json`` by rank 0). A failure during
    training becomes a record with status "error" / "oom", as in the runner; an engine config the engine
    rejects for this model raises FinetuneInputError before the first step.

    In parts, each short enough to read whole: ``_start`` (the engine and the record), ``_resume``
    (a checkpoint's state), ``_clocks`` (what is timed and reported), ``_loop`` (``_train_step`` per step,
    checkpoints, a stop request), ``_end_of_steps`` (the last checkpoint and the final model) and ``_finish``
    (the record)."""
    t = _start(prep, stdout or sys.stdout, stderr or sys.stderr)
    _resume(prep, t)
    _clocks(prep, t)
    try:
        t.stop.__enter__()
        t.device.reset_peak_memory()
        t.telemetry.start()
        _loop(prep, t)
        _end_of_steps(prep, t)
        t.rec["system_stats"] = t.engine.stats
    except Exception as e:  # noqa: BLE001 - a failure during training is a record, as in the runner
        t.rec["status"] = "oom" if t.device.is_oom(e) else "error"
        t.rec["error"] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=8))[-4000:]
        t.final_dir = None
        if t.main:
            print(f"superoffload finetune: training failed at step {t.step + 1}: {type(e).__name__}: {e}",
                  file=t.stderr)
    finally:
        t.stop.__exit__()
        t.telemetry.stop()
        t.progress.close()
        t.engine.close()
    return _finish(prep, t)


def _start(prep: Prepared, stdout: TextIO, stderr: TextIO) -> _Training:
    """Print the plan, join the ranks, build the engine over the loaded model and open the record."""
    from superoffload.engine import ConfigError, initialize
    from superoffload.planner.explain import format_plan

    c, loaded, eng_cfg = prep.cfg, prep.loaded, prep.engine_config
    main = prep.rank == 0
    if main:
        if c.print_plan:
            text = format_plan(prep.plan, loaded.shape) if prep.plan is not None else "Plan: off (--no-plan)"
            print(text, file=stdout)
            print(f"engine config: bucket_size {eng_cfg.bucket_size}, device_tail_buckets "
                  f"{eng_cfg.device_tail_buckets}, speculation {str(eng_cfg.speculation).lower()}, rollback_mode "
                  f"{eng_cfg.rollback_mode}, precision {eng_cfg.precision}, grad_accum {eng_cfg.grad_accum}, "
                  f"grad_clip {eng_cfg.grad_clip}" + (f" (--config overrides: {', '.join(sorted(prep.overrides))})"
                                                      if prep.overrides else ""), file=stdout, flush=True)
        for note in prep.notes:
            print(note, file=stderr)
    if prep.world > 1:
        _init_distributed(eng_cfg.device)
    buffers = snapshot_buffers(loaded.module)
    try:  # the engine's model-dependent checks (flow_layers, tail buckets vs the HBM budget) are input errors
        engine = initialize(loaded.module, eng_cfg)
    except ConfigError as e:
        raise FinetuneInputError(f"engine config: {' '.join(str(e).split())}") from None
    restore_buffer_dtypes(engine.model, buffers)  # e.g. RoPE inv_freq stays fp32, as from_pretrained keeps it
    rec = new_record(prep.run, loaded.shape, params=loaded.params, rank=prep.rank, device_name=engine.backend.name())
    schedule = WarmupCosine(total=c.steps, warmup=prep.warmup, floor=c.min_lr_ratio)
    return _Training(engine=engine, sched=make_scheduler(engine.optimizer, schedule), schedule=schedule, rec=rec,
                     data=TrainData(prep.rows, c.batch, eng_cfg.grad_accum, c.seed, prep.rank, prep.world),
                     main=main, stdout=stdout, stderr=stderr)


def _resume(prep: Prepared, t: _Training) -> None:
    """Clear what a killed save left, and continue from the checkpoint ``prepare`` chose: the engine's state,
    the scheduler, the model's buffers, the RNG and the losses so far. A checkpoint that does not load is an
    input error, before any step."""
    if t.main:
        for p in ckpt.remove_stale_temporaries(Path(prep.cfg.out)):
            print(f"note: removed {p} (left by a save that was killed or failed)", file=t.stderr)
    if prep.resume_from is None:
        return
    try:
        engine_state, trainer = ckpt.load_checkpoint(prep.resume_from, prep.rank, prep.world)
        t.engine.load_state_dict(engine_state)
    except (files.CheckpointError, ValueError) as e:  # before any step: an input error, in one line
        t.engine.close()
        raise FinetuneInputError(f"--resume from {prep.resume_from}: {' '.join(str(e).split())}") from None
    del engine_state
    t.sched.load_state_dict(trainer["scheduler"])
    ckpt.load_model_buffers(t.engine.model, trainer["buffers"])
    ckpt.set_rng_state(trainer["rng"])
    t.losses, t.start = list(trainer["losses"]), int(trainer["step"])
    t.skipped = list(trainer.get("skipped", [False] * t.start))


def _clocks(prep: Prepared, t: _Training) -> None:
    """The steps this process trains and which of them are timed, the MFU peak, progress and telemetry."""
    from superoffload.harness.flops import model_flops_per_token
    from superoffload.harness.telemetry import Telemetry

    c, run = prep.cfg, prep.run
    t.end = c.stop_after or c.steps
    t.warm = min(c.timing_warmup, max(0, t.end - t.start - 1))
    run.warmup, run.steps = t.warm, c.steps - t.warm
    t.rec["run"].update(warmup=t.warm, steps=c.steps - t.warm)
    try:
        t.peak = resolve_peak(t.device.torch_device, torch_dtype(prep.engine_config.precision), c.peak_flops)
    except ValueError as e:  # a GPU without a table entry: no MFU, say so once
        if t.main:
            print(f"note: {e}; MFU is not reported", file=t.stderr)
    t.progress = Progress(total=c.steps, start=t.start,
                          tokens_per_step=c.batch * prep.engine_config.grad_accum * prep.max_length,
                          flops_per_token=model_flops_per_token(prep.loaded.shape, prep.max_length),
                          peak_flops=t.peak[0] if t.peak else float("inf"), warmup=t.warm, log_every=c.log_every,
                          enabled=t.main and c.progress, stream=t.stderr)
    if t.start and t.main:
        t.progress.message(f"resumed from {prep.resume_from} at step {t.start}")
    t.telemetry = Telemetry(0.1, want_gpu=t.device.is_cuda)
    t.step = t.start


def _loop(prep: Prepared, t: _Training) -> None:
    """Train the steps from ``t.start`` to ``t.end``, checkpointing every --save-every; a signal to any rank
    stops every rank at the same step boundary, checkpointed (``t.stopped_at``)."""
    c, dev = prep.cfg, t.device.torch_device
    for step in range(t.start, t.end):
        t.step = step
        _train_step(prep, t, step)
        done = step + 1
        if done != t.end and c.save_every and done % c.save_every == 0:
            _checkpoint(prep, t.engine, t.sched, t.losses, t.skipped, done, t.main)
        if done != t.end and _sum_over_ranks(int(t.stop.requested), prep.world, dev):
            if not (c.save_every and done % c.save_every == 0):
                _checkpoint(prep, t.engine, t.sched, t.losses, t.skipped, done, t.main)
            t.stopped_at = done
            return


def _train_step(prep: Prepared, t: _Training, step: int) -> None:
    """One optimizer step: every micro-batch's token-loss sum over the step's learned tokens (all ranks), the
    engine's step and the scheduler's; its loss, time and whether it was skipped go to ``t``."""
    engine, device, dev = t.engine, t.device, t.device.torch_device
    ga = prep.engine_config.grad_accum
    batches = t.data.step_batches(step)
    learned = _sum_over_ranks(learned_tokens(batches), prep.world, dev)
    total = max(1, learned)
    lr = engine.optimizer.param_groups[0]["lr"]
    device.synchronize()
    t0 = time.perf_counter()
    acc = torch.zeros((), dtype=torch.float64, device=dev)
    for x, y in batches:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        s = step_loss_parts(prep.loaded.logits(engine, x), y)
        engine.backward(s * (ga / total))
        acc += s.detach().double()
    try:
        engine.step()
    finally:  # a NonFiniteError still ends a complete (skipped) step: record it
        t.skipped.append(engine.last_step_applied is False)
    t.sched.step()
    acc = _sum_over_ranks(acc, prep.world, dev)
    loss = float(acc) / learned if learned else None  # no learned token: null in the record
    device.synchronize()
    t.times.append(time.perf_counter() - t0)
    t.telemetry.mark_step(step)
    t.losses.append(loss)
    t.progress.update(step + 1, loss, lr, t.times[-1], skipped=t.skipped[-1])


def _end_of_steps(prep: Prepared, t: _Training) -> None:
    """After the last step: its checkpoint (a resume at --steps has none to write), then either the record of
    a pre-emption or, at --steps, the final model (rank 0 writes it from every rank's state)."""
    c = prep.cfg
    t.step = t.end if t.stopped_at is None else t.stopped_at
    if t.end > t.start and t.stopped_at is None:
        _checkpoint(prep, t.engine, t.sched, t.losses, t.skipped, t.end, t.main)
    if t.stopped_at is not None:
        t.end = t.stopped_at
        t.rec["status"] = "preempted"
        t.rec["error"] = (f"stopped by {t.stop.name or 'a signal to another rank'} after step {t.stopped_at}: "
                          f"checkpoint {ckpt.step_dir_name(t.stopped_at)} written; continue with --resume")
        if t.main:
            t.progress.message(t.rec["error"])
    elif t.end == c.steps:
        states = _gather_on_rank0(t.engine.state_dict(), prep.world)
        if t.main:
            save_dtype = _resolve_save_dtype(c, prep.loaded, prep.engine_config.precision)
            t.final_dir = ckpt.save_final(prep.loaded, states, Path(c.out), torch_dtype(save_dtype), save_dtype)
            t.progress.message(f"saved {t.final_dir} ({save_dtype} weights and the tokenizer)")


def _finish(prep: Prepared, t: _Training) -> dict[str, Any]:
    """Complete the record (telemetry, the plan, the fine-tune block, losses and throughput) and write it
    (rank 0); a record that cannot be written turns into an error record, said in one line."""
    from superoffload.harness.record import write_record

    rec, out = t.rec, Path(prep.cfg.out)
    rec["telemetry"] = t.telemetry.summary(timed_from_step=t.start + t.warm)
    stats = rec["system_stats"] or {}
    stats["plan"] = prep.plan.to_dict() if prep.plan is not None else None
    stats["finetune"] = _finetune_block(prep, t.schedule, t.start, t.end, t.final_dir)
    if t.stopped_at is not None:  # the CLI's exit code: EXIT_PREEMPTED, or EXIT_INTERRUPTED for SIGINT
        stats["finetune"]["stopped_by"] = t.stop.name or "a signal to another rank"
        stats["finetune"]["exit_code"] = t.stop.exit_code if t.stop.requested else EXIT_PREEMPTED
    rec["system_stats"] = stats
    rec["rollbacks"] = stats.get("speculation")
    rec["plan"] = stats["plan"]
    finish_record(rec, run=prep.run, shape=prep.loaded.shape, losses=t.losses, times=t.times, warmup=t.warm,
                  peak_flops=t.peak, peak_device_bytes=t.device.peak_memory_bytes(), skipped=t.skipped)
    if t.main:
        try:
            write_record(out / "record.json", rec)
        except OSError as e:  # a full disk or read-only directory here: one line, not a traceback
            print(f"superoffload finetune: error: {out / 'record.json'} not written: "
                  f"{files.why_write_failed(e, out)}", file=t.stderr)
            rec["status"] = "error"
            rec["error"] = f"record.json not written: {files.why_write_failed(e, out)}"
    return rec


def _checkpoint(prep: Prepared, engine: Any, sched: Any, losses: list[float | None], skipped: list[bool], step: int,
                main: bool) -> None:
    state = engine.state_dict()  # synchronizes the engine's host tasks first
    trainer = _trainer_state(prep, step, sched, losses, skipped, engine.model) if main else {}
    barrier = gather = None
    if prep.world > 1:
        import torch.distributed as dist

        barrier = dist.barrier

        def gather(obj: Any) -> list[Any]:
            out: list[Any] = [None] * prep.world
            dist.all_gather_object(out, obj)
            return out

    ckpt.save_checkpoint(prep.cfg.out, step, state, trainer, keep=prep.cfg.keep_checkpoints, rank=prep.rank,
                         world=prep.world, barrier=barrier, gather=gather, run_id=prep.run_id)


def _init_distributed(device: str) -> None:
    """The process group torchrun's environment describes: NCCL when the engine trains on CUDA, gloo on the
    host. Every collective times out (``SUPEROFFLOAD_DIST_TIMEOUT_S``, as ``bench run``) so a rank that dies
    ends the job instead of leaving the others waiting."""
    import torch.distributed as dist

    from superoffload.harness.runner import dist_timeout

    if dist.is_initialized():
        return
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=dist_timeout())


def _sum_over_ranks(value: Any, world: int, device: torch.device) -> Any:
    """An int or a tensor summed over every rank (the step's learned tokens, its loss sum); the reduction
    runs on the engine's device (NCCL reduces only device tensors)."""
    if world == 1:
        return value
    import torch.distributed as dist

    t = value.clone() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return t if isinstance(value, torch.Tensor) else int(t)


def _gather_on_rank0(state: dict[str, Any], world: int) -> Any:
    """Every rank's engine state on rank 0 (the final model's fp32 masters), this rank's alone otherwise."""
    if world == 1:
        return state
    import torch.distributed as dist

    box: list[Any] | None = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(state, box, dst=0)
    return box


def _finetune_block(prep: Prepared, schedule: WarmupCosine, start: int, end: int,
                    final_dir: Path | None) -> dict[str, Any]:
    c, loaded = prep.cfg, prep.loaded
    return {
        "model_source": loaded.source, "model_kind": loaded.kind, "source_dtype": loaded.source_dtype,
        "shape_params": loaded.shape.total_params(), "tokenizer": loaded.tokenizer.name,
        "tokenizer_vocab": loaded.tokenizer.vocab_size, "data": dict(prep.rows.info),
        "max_length": prep.max_length, "total_steps": c.steps, "resumed_from_step": start, "stopped_at_step": end,
        "epochs": end * c.batch * prep.engine_config.grad_accum * prep.world / len(prep.rows),
        "schedule": {"kind": "linear warm-up + cosine", "warmup_steps": schedule.warmup,
                     "min_lr_ratio": schedule.floor, "base_lr": prep.engine_config.optimizer.lr},
        "config_overrides": prep.overrides, "save_every": c.save_every,
        "checkpoint": str(Path(c.out) / ckpt.CHECKPOINTS / ckpt.step_dir_name(end)),
        "final_dir": str(final_dir) if final_dir else None,
        "save_dtype": _resolve_save_dtype(c, loaded, prep.engine_config.precision) if final_dir else None,
    }


def run_finetune(cfg: FinetuneConfig, **kw: Any) -> dict[str, Any]:
    """prepare + train. FinetuneInputError before any training on bad input."""
    return train(prepare(cfg), **kw)
