"""The `superoffload` system: our engine under the common harness.

By default the engine runs the planner's plan for this model, sequence, batch, hardware and rank count
(``make_plan(..., chips=run.world)``); the plan and its reasons land in the record. On several ranks
the engine shards over torch.distributed's default process group (which the runner initialised).
The engine config is a merge, later wins:

    engine defaults < run settings (precision, clipping, ...) < plan.engine_options() < -o options

The plan speaks the engine's config names (`bucket_size`, `device_tail_buckets`, `speculation`,
`rollback_mode`, `grad_cast`, `param_cast`, `host_optimizer`, `flow_layers`, `flow_prefetch`), so
nothing is translated and nothing is dropped. System options (`-o KEY=VALUE`) are any engine config
key, plus `plan=false` (engine defaults instead of the plan), `hardware=NAME|PATH` (the planner's
HardwareProfile: a preset name or a `superoffload calibrate` JSON; default: the device's preset, by its
record in superoffload/catalog.py; a GPU without a preset of its own plans with the generic one and the
plan's first reason says so) and
`cast_policy=device|host` (the paper's casting choice as one switch: `device` = cast on the device and
move fp32 both ways, `host` = move bf16/fp16 and cast on the host; sets both `grad_cast` and
`param_cast`, which an explicit `-o grad_cast=`/`param_cast=` still overrides).

Long sequences (``--sp K``, ``--loss-tile T``, ``--offload-checkpoints``; superoffload.harness.sequence):
the model gets Ulysses attention over its SP group of K consecutive ranks and the token-normalized loss
(each rank's token-loss sum over the global token count of the micro-batch, every data-parallel group
included; tiled with ``--loss-tile``), the engine sums gradients over all ranks (``gradient_reduction:
sum``, the recipe of the multi-rank engine tests' ``sp`` scenario), each rank feeds its chunk of its SP
group's global batch, and a step reports the global mean loss (the ranks' shares summed). The plan is made
for the same pieces (``make_plan(..., sp=K, offload_checkpoints=, loss_tile=)``).
"""

from __future__ import annotations

from typing import Any

import torch

from superoffload.engine import ConfigError, SuperOffloadConfig, initialize
from superoffload.harness import sequence as seqh
from superoffload.harness.system import Batch, RunConfig
from superoffload.options import CastSide, choices_of
from superoffload.shapes import ModelShape

HARNESS_ONLY_OPTIONS = ("data", "data_dtype", "plan", "hardware", "cast_policy", "api")
APIS = ("engine", "optimizer")  # -o api= / --api: engine.backward/step, or superoffload.AdamW in a plain loop


def hardware_for_device(device: str):
    """(planner profile, warning or None) for the device the run will use: the GPU's preset (by its catalog
    record; a GPU without a preset of its own plans with the generic one, and the warning says so), or this
    machine's CPU (the cpu preset with its cores and memory, `presets.this_cpu`; sim simulates the CUDA code
    path on this CPU: the CPU's numbers are the ones it runs at)."""
    from superoffload.planner.presets import default_profile, gpu_preset_warning, this_cpu

    on_gpu = device not in ("cpu", "host", "sim") and torch.cuda.is_available()
    if on_gpu:
        name = torch.cuda.get_device_name()
        return default_profile(name), gpu_preset_warning(name)
    # the matmul rate this machine's MFU divides by (kept once per machine, else measured now: ~0.5 s), so the
    # plan's compute is this CPU's, not the preset's per-core spec scaled
    from superoffload.harness.peak import cpu_peak

    flops, source = cpu_peak(torch.float32, torch.get_num_threads())
    return this_cpu(flops, source), None


def plan_for(shape: ModelShape, run: RunConfig):
    """The planner's Plan for this run, or None when `-o plan=false`."""
    if not run.system_options.get("plan", True):
        return None
    from superoffload.planner.plan import make_plan
    from superoffload.planner.presets import get_profile

    warning = None
    if run.system_options.get("hardware"):
        hw = get_profile(run.system_options["hardware"])
    else:
        hw, warning = hardware_for_device(run.device)
    # the plan is made for what runs: the run's SP degree, checkpoint offload and loss tile exactly as the
    # run sets them (the planner may not turn on a piece the harness would not apply; a request that needs
    # one is PlanInfeasible, whose message names --sp / --offload-checkpoints / --loss-tile), and the host this
    # rank has: its cores (a --bind-cores slice, or a share of the host), torch's threads, the engine's
    # host_threads (placement.rank_host)
    plan = make_plan(shape, run.seq, run.batch, hw,
                     activation_checkpointing=bool(run.activation_checkpointing or run.offload_checkpoints),
                     grad_accum=run.grad_accum, chips=max(1, run.world), sp=run.sp,
                     offload_checkpoints=bool(run.offload_checkpoints), loss_tile=run.loss_tile or 0,
                     precision=run.precision, **run_host(run).plan_kwargs())
    if warning is not None:  # first: every number below rests on it
        plan.reasons.insert(0, warning)
    return plan


def run_host(run: RunConfig):
    """This rank's host as the planner sees it (placement.rank_host), from the process as the runner set it up:
    bound, its affinity is its slice; unbound, it shares the CPUs with the host's other ranks."""
    import os

    from superoffload.harness import placement
    from superoffload.planner.presets import usable_cpus

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available = usable_cpus() * (local_world if run.bind_cores else 1)  # bound: the slice is the affinity now
    host_threads = run.host_threads if run.host_threads is not None else run.threads
    return placement.rank_host(available, local_world, run.bind_cores, torch.get_num_threads(), host_threads)


def _cast_policy(run: RunConfig) -> dict[str, str]:
    """`-o cast_policy=device|host`: the same side for `grad_cast` and `param_cast`."""
    if "cast_policy" not in run.system_options:
        return {}
    side = run.system_options["cast_policy"]
    if side not in choices_of(CastSide):
        raise ConfigError(f"cast_policy must be one of {', '.join(choices_of(CastSide))}; got {side!r}")
    if run.precision == "fp32":
        raise ConfigError("cast_policy chooses where bf16/fp16 casts happen; use --dtype bf16 or fp16")
    return {"grad_cast": side, "param_cast": side}


def engine_config(run: RunConfig, plan=None) -> SuperOffloadConfig:
    """The engine config a run asks for: defaults < run settings < plan < explicit options. Raises
    ConfigError."""
    explicit = {k: v for k, v in run.system_options.items() if k not in HARNESS_ONLY_OPTIONS}
    planned: dict[str, Any] = plan.engine_options(precision=run.precision) if plan is not None else {}
    # the token-normalized loss is already divided by the global token count: gradients are only summed
    reduction = {"gradient_reduction": "sum"} if seqh.uses_sequence_package(run) else {}
    if reduction and explicit.get("gradient_reduction", "sum") != "sum":
        raise ConfigError("--sp / --loss-tile divide each rank's loss by the global token count: gradients "
                          "must be summed (gradient_reduction sum), not averaged")
    return SuperOffloadConfig.from_any({
        "optimizer": {"lr": run.lr, "betas": list(run.betas), "eps": run.eps, "weight_decay": run.weight_decay},
        "precision": run.precision, "grad_clip": run.grad_clip, "grad_accum": run.grad_accum,
        "device": run.device, "host_threads": run.host_threads if run.host_threads is not None else run.threads,
        **reduction, **planned, **_cast_policy(run), **explicit,
    })


class SuperOffloadSystem:
    name = "superoffload"

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        api = run.system_options.get("api", "engine")
        if api not in APIS:
            raise ValueError(f"superoffload: api must be one of {', '.join(APIS)}, got {api!r}")
        try:
            return engine_config(run).to_dict()
        except ConfigError as e:
            raise ValueError(f"superoffload: {e}") from None

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None:
        self.plan = plan_for(shape, run)
        self.seq = None
        self.sp_ranks: list[int] = []
        if seqh.uses_sequence_package(run):
            from superoffload.sequence import enable_sequence_parallel

            group, self.sp_ranks = seqh.sp_groups(run.sp)
            self.seq = enable_sequence_parallel(model, group, loss_tile=run.loss_tile,
                                                global_tokens=seqh.tokens_per_micro_batch(run))
        cfg = engine_config(run, self.plan)
        self.optimizer = None
        if run.system_options.get("api", "engine") == "optimizer":
            self.optimizer = _plain_optimizer(model, cfg)
            self.engine = self.optimizer.engine
        else:
            self.engine = initialize(model, cfg)
        self.device = self.engine.device
        self.offloader = getattr(model, "activation_offloader", None)

    def step(self, batch: Batch) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        n = len(batch.inputs)
        opt = self.optimizer
        for x, y in zip(batch.inputs, batch.targets, strict=True):
            if self.seq is not None:  # this rank's chunk of every sequence of its SP group's global batch
                x, y = self.seq.shard(x), self.seq.shard(y)
            loss = self.engine(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
            if opt is None:
                self.engine.backward(loss)
            else:  # a plain loop: the loss divided as engine.backward divides it (times 1/n)
                (loss * (1.0 / n) if n > 1 else loss).backward()
            total += loss.detach() / n
        # no synchronize here: host commits and uploads overlap the next step's forward, exactly as in
        # training; the runner's per-step clock sees the steady-state period
        if opt is None:
            self.engine.step()
        else:
            opt.step()
            opt.zero_grad()
        self.last_step_skipped = self.engine.last_step_applied is False
        if self.seq is not None:  # each rank's loss is its share of the global mean: sum the shares
            return seqh.global_loss(total)
        return total

    def stats(self) -> dict[str, Any]:
        self.engine.synchronize()
        st = self.engine.stats
        st["plan"] = self.plan.to_dict() if self.plan is not None else None
        if self.seq is not None or self.offloader is not None:
            st["sequence"] = {
                "sp": self.seq.sp if self.seq is not None else 1, "sp_group_ranks": self.sp_ranks,
                "attention": "superoffload.sequence.UlyssesAttention" if self.seq is not None and self.seq.sp > 1
                else "local", "loss": "TokenNormalizedLoss" if self.seq is not None else "model default",
                "loss_tile": self.seq.loss.tile if self.seq is not None else None,
                "loss_divisor_tokens": self.seq.loss.global_tokens if self.seq is not None else None,
                "offloaded_checkpoints": offload_stats(self.offloader),
            }
        return st

    def teardown(self) -> None:
        self.engine.close()


def _plain_optimizer(model: torch.nn.Module, cfg: SuperOffloadConfig) -> Any:
    """superoffload.AdamW with the engine config a native run gets (its groups: the engine's default split)."""
    from superoffload.engine.params import decay_split
    from superoffload.optim import AdamW

    d = cfg.to_dict()
    o = d.pop("optimizer")
    clip = d.pop("grad_clip")
    d.pop("grad_accum")
    split = d.pop("weight_decay_split")
    if split:
        decay, no_decay = decay_split(model.parameters())
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]}]
    return AdamW([g for g in groups if g["params"]], lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                 weight_decay=o["weight_decay"], amsgrad=o["amsgrad"], max_grad_norm=clip, model=model, plan=False,
                 config=d)


def offload_stats(offloader: Any) -> dict[str, Any] | None:
    """The ActivationOffloader's counters (host bytes of the checkpoints, prefetches), or None."""
    if offloader is None:
        return None
    st = offloader.stats()
    return {"host_bytes": st.host_bytes, "peak_host_bytes": st.peak_host_bytes, "offloaded": st.offloaded,
            "prefetched": st.prefetched, "fetched_on_demand": st.fetched_on_demand}
