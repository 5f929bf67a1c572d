"""The `superoffload` system: our engine under the common harness.

By default the engine runs the planner's plan for this model, sequence, batch and hardware (bucket
size, device tail buckets, speculation, casting policy, weight-flow layers); the plan and its reasons land in the
record. System options (`-o KEY=VALUE`) override: any engine config key (`bucket_size`,
`device_tail_buckets`, `speculation`, `rollback_mode`, `grad_cast`, `param_cast`, `host_threads`, ...),
plus `plan=false` (engine defaults instead of the plan), `hardware=NAME|PATH` (the planner's
HardwareProfile: a preset name or a `superoffload calibrate` JSON; default: chosen from the device) and
`cast_policy=device|host` (the paper's casting choice as one switch: `device` = cast on the device and
move fp32 both ways, `host` = move bf16/fp16 and cast on the host; sets `grad_cast` and `param_cast`).
"""

from __future__ import annotations

from typing import Any

import torch

from superoffload.engine import ConfigError, SuperOffloadConfig, initialize
from superoffload.harness.system import Batch, RunConfig
from superoffload.shapes import ModelShape

HARNESS_ONLY_OPTIONS = ("data", "data_dtype", "plan", "hardware", "cast_policy")
CAST_POLICIES = {"device": {"grad_cast": "device", "param_cast": "device"},
                 "host": {"grad_cast": "host", "param_cast": "host"}}


def hardware_for_device(device: str) -> str:
    """Planner preset for the device the run will use."""
    if device == "cpu" or not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().upper()
    if "GH200" in name:
        return "gh200"
    if "H200" in name:
        return "h200-pcie"
    return "h100-pcie"


def plan_for(shape: ModelShape, run: RunConfig):
    """The planner's Plan for this run, or None when `-o plan=false`."""
    if not run.system_options.get("plan", True):
        return None
    from superoffload.planner.plan import make_plan
    from superoffload.planner.presets import get_profile

    hw = get_profile(run.system_options.get("hardware") or hardware_for_device(run.device))
    return make_plan(shape, run.seq, run.batch, hw, activation_checkpointing=run.activation_checkpointing,
                     grad_accum=run.grad_accum)


def engine_config(run: RunConfig, plan=None) -> SuperOffloadConfig:
    """The engine config a run asks for: defaults < plan < explicit options. Raises ConfigError."""
    opts = {k: v for k, v in run.system_options.items() if k not in HARNESS_ONLY_OPTIONS}
    planned: dict[str, Any] = {}
    if plan is not None:
        planned = {"bucket_size": plan.bucket_size_params, "device_tail_buckets": plan.device_tail_buckets,
                   "speculation": plan.speculation,
                   "rollback_mode": plan.exact_mode if plan.exact_mode != "none" else "deferred"}
        if run.dtype != "fp32":
            planned.update(grad_cast=plan.cast_policy, param_cast="host" if plan.cast_policy == "host" else "device")
        if plan.flow_layers:
            planned["flow_layers"] = list(plan.flow_layers)
    if "cast_policy" in run.system_options:
        policy = run.system_options["cast_policy"]
        if policy not in CAST_POLICIES:
            raise ConfigError(f"cast_policy must be one of {', '.join(CAST_POLICIES)}; got {policy!r}")
        if run.dtype == "fp32":
            raise ConfigError("cast_policy chooses where bf16/fp16 casts happen; use --dtype bf16 or fp16")
        planned.update(CAST_POLICIES[policy])
    return SuperOffloadConfig.from_any({
        "optimizer": {"lr": run.lr, "betas": list(run.betas), "eps": run.eps, "weight_decay": run.weight_decay},
        "precision": run.dtype, "grad_clip": run.grad_clip, "grad_accum": run.grad_accum,
        "device": run.device, "host_threads": run.threads, **planned, **opts,
    })


class SuperOffloadSystem:
    name = "superoffload"

    @classmethod
    def validate(cls, run: RunConfig) -> dict[str, Any]:
        try:
            return engine_config(run).to_dict()
        except ConfigError as e:
            raise ValueError(f"superoffload: {e}") from None

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None:
        self.plan = plan_for(shape, run)
        self.engine = initialize(model, engine_config(run, self.plan))
        self.device = self.engine.device.torch_device

    def step(self, batch: Batch) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        n = len(batch.inputs)
        for x, y in zip(batch.inputs, batch.targets, strict=True):
            loss = self.engine(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
            self.engine.backward(loss)
            total += loss.detach() / n
        # no synchronize here: host commits and uploads overlap the next step's forward, exactly as in
        # training; the runner's per-step clock sees the steady-state period
        self.engine.step()
        return total

    def stats(self) -> dict[str, Any]:
        self.engine.synchronize()
        st = self.engine.stats
        st["plan"] = self.plan.to_dict() if self.plan is not None else None
        return st

    def teardown(self) -> None:
        self.engine.close()
