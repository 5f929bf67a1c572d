"""The `superoffload` system: our engine under the common harness.

System options (`-o KEY=VALUE` on the CLI) are engine config keys, e.g. `bucket_size`,
`device_tail_buckets`, `speculation`, `rollback_mode`, `grad_cast`, `param_cast`, `host_threads`.
"""

from __future__ import annotations

from typing import Any

import torch

from superoffload.engine import SuperOffloadConfig, initialize
from superoffload.harness.system import Batch, RunConfig
from superoffload.shapes import ModelShape

HARNESS_ONLY_OPTIONS = ("data", "data_dtype")


def engine_config(run: RunConfig) -> SuperOffloadConfig:
    """The engine config a run asks for; raises ConfigError on a bad option (before any work)."""
    opts = {k: v for k, v in run.system_options.items() if k not in HARNESS_ONLY_OPTIONS}
    opts.setdefault("host_threads", run.threads)
    return SuperOffloadConfig.from_any({
        "optimizer": {"lr": run.lr, "betas": list(run.betas), "eps": run.eps, "weight_decay": run.weight_decay},
        "precision": run.dtype, "grad_clip": run.grad_clip, "grad_accum": run.grad_accum,
        "device": run.device, **opts,
    })


class SuperOffloadSystem:
    name = "superoffload"

    @staticmethod
    def validate(run: RunConfig) -> None:
        engine_config(run)

    def setup(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> None:
        self.engine = initialize(model, engine_config(run))
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
        return self.engine.stats

    def teardown(self) -> None:
        self.engine.close()
