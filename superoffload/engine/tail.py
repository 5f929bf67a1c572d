"""The device tail buckets' step: their gradient shards, fp32 masters and Adam state stay on the device and
step there after validation, on the compute stream.

The whole tail steps in one fused Adam(W) call per (param group, step count) over its buckets' slices (the
state lives in one flat allocation per kind, `build.py`), then one foreach copy casts every master into
the weights: a handful of kernels whatever the number of tail buckets, no more than torch's own
`clip_grad_norm_` + AdamW step. The slices of the usual case (every parameter stepped, one step count
per group) are made once; a step where some parameters had no gradient, or step counts differ inside a
group, takes them per run of equal (group, step count) instead.
"""

from __future__ import annotations

import time

import torch

from superoffload.engine.bucket import Bucket, HyperParams
from superoffload.engine.context import EngineContext
from superoffload.engine.layout import runs

STATE = ("master", "grad", "exp_avg", "exp_avg_sq")


class TailStep:
    def __init__(self, ctx: EngineContext, buckets: list[Bucket]) -> None:
        self.ctx = ctx
        self.tails = [b for b in buckets if b.tail is not None]
        self.amsgrad = bool(self.tails) and "max_exp_avg_sq" in self.tails[0].tail
        keys = (*STATE, "max_exp_avg_sq") if self.amsgrad else STATE
        # per param group, its slices of every tail bucket's state (kind -> list), and its parameters
        self.by_group: dict[int, dict[str, list[torch.Tensor]]] = {}
        self.members: dict[int, list[int]] = {}
        for b in self.tails:
            for start, end, pieces in runs(b.slots, lambda s: s.group, b.lo, b.hi):
                views = self.by_group.setdefault(pieces[0].group, {k: [] for k in keys})
                for k in keys:
                    views[k].append(b.tail[k][start - b.lo: end - b.lo])
                self.members.setdefault(pieces[0].group, []).extend(pc.index for pc in pieces)
        self.homes = [b.home[b.lo: b.hi] for b in self.tails]
        self.masters = [b.tail["master"] for b in self.tails]
        self.present = sorted({pc.index for b in self.tails for pc in b.slots})

    def step(self, scale: float, hps: dict[int, HyperParams], steps: list[int], every_param: bool) -> None:
        """Adam on every tail shard with gradient factor `scale`, then the new weights cast into place and
        all-gathered across ranks. `every_param`: every parameter got a gradient this step."""
        if not self.tails:
            return
        t0 = time.perf_counter()
        dev, o = self.ctx.device, self.ctx.optimizer
        for group, step, parts in self._calls(steps, every_param):
            hp = hps[group]
            dev.kernels.adam_steps(
                parts["master"], parts["grad"], parts["exp_avg"], parts["exp_avg_sq"],
                parts.get("max_exp_avg_sq") if hp.amsgrad else None,
                step=step + 1, lr=hp.lr, beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps, weight_decay=hp.weight_decay,
                adamw=o.adamw, bias_correction=o.bias_correction, grad_scale=scale)
        with torch.no_grad():
            torch._foreach_copy_(self.homes, self.masters)
        comm = self.ctx.comm
        if comm.sharded:
            for b in self.tails:
                b.gather = comm.all_gather(b.home, b.home[b.lo: b.hi], worker=False)
        self.ctx.counters.add(device_step_s=time.perf_counter() - t0)

    def _calls(self, steps: list[int], every_param: bool) -> list[tuple[int, int, dict[str, list[torch.Tensor]]]]:
        """(group, step count, its slices by kind) per fused call."""
        calls = []
        uniform = every_param
        if uniform:
            for group, idx in self.members.items():
                counts = set(map(steps.__getitem__, idx))  # C calls only: this runs every step
                if len(counts) != 1:
                    uniform = False
                    break
                calls.append((group, counts.pop(), self.by_group[group]))
        if uniform:
            return calls
        calls, at = [], {}
        keys = (*STATE, "max_exp_avg_sq") if self.amsgrad else STATE
        for b in self.tails:
            present = b.present_indices
            for start, end, pieces in runs(b.slots, lambda s, present=present: (
                    (s.group, steps[s.index]) if s.index in present else None), b.lo, b.hi):
                key = (pieces[0].group, steps[pieces[0].index])
                if key not in at:
                    at[key] = len(calls)
                    calls.append((*key, {k: [] for k in keys}))
                for k in keys:
                    calls[at[key]][2][k].append(b.tail[k][start - b.lo: end - b.lo])
        return calls
