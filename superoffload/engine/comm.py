"""The engine's collectives, on torch.distributed (no communication layer of its own).

With one rank (no process group, or a group of one) every collective is the identity and the engine
runs the same code path. With several: gradients are reduced with SUM (never a backend AVG, whose
rounding differs between backends; the engine applies the 1/world factor itself), the step's
[Σ norm², non-finite count] pair is all-reduced in fp64, and updated weights are all-gathered.

`replicate` (engine config `replicate`): every rank keeps the whole optimizer state. A bucket's
gradient is then all-reduced instead of reduce-scattered, every rank steps all of it and nothing is
all-gathered (torch DDP's exchange); the shard geometry (`shards`, `shard_rank`) is that of one rank
while `world` and `rank` stay the group's (the 1/world mean, samplers, checkpoint names).

Two process groups: `group` for what the training thread issues (reduce-scatters in bucket order, the
per-step all-reduce, tail-bucket all-gathers) and `gather_group` for the all-gathers the host worker
issues after each bucket's final step. Each group's sequence is fixed by the engine's bucket order and
by globally reduced decisions, so it is the same on every rank; `log` records it per group for tests.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch built without distributed
    dist = None  # type: ignore[assignment]


def _shim(new: str, old: str):
    # torch 2.13 deprecates the *_tensor names in favour of *_single; the project supports torch >= 2.4
    return getattr(dist, new, None) or getattr(dist, old)


@dataclass
class _SliceOnWait:
    """An all-reduce standing in for a reduce-scatter: waiting copies this rank's slice of the sum out."""

    work: Any
    out: torch.Tensor
    part: torch.Tensor
    copied: bool = False

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self) -> None:
        self.work.wait()
        if not self.copied:
            self.out.copy_(self.part)
            self.copied = True


@dataclass
class Comm:
    group: Any = None
    gather_group: Any = None
    rank: int = 0
    world: int = 1
    replicate: bool = False
    log: dict[str, list[str]] = field(default_factory=lambda: {"main": [], "gather": []})

    @classmethod
    def create(cls, group: Any = None, replicate: bool = False) -> Comm:
        """The default process group (or `group`) when torch.distributed is initialized, else one rank.
        `replicate`: every rank holds the whole optimizer state (no sharding)."""
        if dist is None or not dist.is_available() or not dist.is_initialized():
            if group is not None:
                raise ValueError("a process group was passed but torch.distributed is not initialized")
            return cls()
        group = group or dist.group.WORLD
        world = dist.get_world_size(group)
        if world == 1:
            return cls(group=group, rank=0, world=1, replicate=replicate)
        # a second group for the worker thread's all-gathers: two threads must not interleave their
        # collectives on one group (the order would differ between ranks)
        ranks = dist.get_process_group_ranks(group)
        gather = dist.new_group(ranks=ranks)
        return cls(group=group, gather_group=gather, rank=dist.get_rank(group), world=world, replicate=replicate)

    @property
    def active(self) -> bool:
        """Several ranks: collectives are real (gradients are reduced, decisions agreed)."""
        return self.world > 1

    @property
    def shards(self) -> int:
        """How many parts each bucket's optimizer state is split into: the world, or 1 when replicated."""
        return 1 if self.replicate else self.world

    @property
    def shard_rank(self) -> int:
        """Which part of each bucket this rank owns (0 when replicated: the whole)."""
        return 0 if self.replicate else self.rank

    @property
    def sharded(self) -> bool:
        """Each rank owns only part of a bucket (so weights are all-gathered after its step)."""
        return self.shards > 1

    # --- collectives -------------------------------------------------------------------------------
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> Any:
        """Async SUM reduce-scatter of `inp` (shards * out.numel() elements) into `out`.

        Replicated: the whole `inp` is all-reduced in place (`out`, when another tensor, receives it
        when the work is waited for), logged as an all-reduce.

        Host tensors (gloo) on two ranks are all-reduced in place and this rank's slice copied out when
        the work is waited for: there gloo's reduce-scatter is slower than its all-reduce of the same
        buffer at every size measured (docs/cost_model.md, "Collectives": 0.25-64 MiB, 1.09-1.53x); on
        four it was not (0.55-1.45x), so more ranks keep the reduce-scatter. `inp` is then overwritten
        with the sum (the engine's staging slot, scratch). The log keeps the engine's operation, a
        reduce-scatter."""
        if not self.active:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return None
        dtype = str(inp.dtype).removeprefix("torch.")
        if self.replicate:
            self.log["main"].append(f"all_reduce {inp.numel()} {dtype}")
            work = dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            return work if out.data_ptr() == inp.data_ptr() else _SliceOnWait(work, out, inp[: out.numel()])
        self.log["main"].append(f"reduce_scatter {inp.numel()} {dtype}")
        if inp.device.type == "cpu" and self.world == 2:
            work = dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            n = out.numel()
            return _SliceOnWait(work, out, inp[self.rank * n: (self.rank + 1) * n])
        fn = _shim("reduce_scatter_single", "reduce_scatter_tensor")
        return fn(out, inp, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        if self.active:
            self.log["main"].append(f"all_reduce {t.numel()}")
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)

    def all_reduce_max(self, t: torch.Tensor) -> None:
        if self.active:
            self.log["main"].append(f"all_reduce_max {t.numel()}")
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, worker: bool) -> Any:
        """Async all-gather of every rank's `inp` (a shard) into `out`; `worker`: issued by the host
        worker thread (its own group). Nothing to gather unless sharded (`inp` is all of `out`)."""
        if not self.sharded:
            return None
        name, group = ("gather", self.gather_group) if worker else ("main", self.group)
        self.log[name].append(f"all_gather {out.numel()}")
        fn = _shim("all_gather_single", "all_gather_into_tensor")
        return fn(out, inp, group=group, async_op=True)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            self.log["main"].append("barrier")
            dist.barrier(group=self.group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def check_same(self, what: str, obj: Any) -> None:
        """Raise unless `obj` pickles to the same bytes on every rank (layouts, plans, configs)."""
        if not self.active:
            return
        digest = hashlib.sha256(pickle.dumps(obj)).hexdigest()
        digests: list[Any] = [None] * self.world
        dist.all_gather_object(digests, digest, group=self.group)
        if len(set(digests)) != 1:
            bad = [r for r, d in enumerate(digests) if d != digests[0]]
            raise RuntimeError(f"{what} differs between ranks (rank 0 vs ranks {bad}); every rank must build "
                               f"the same model and config")

    @staticmethod
    def wait(work: Any) -> None:
        if work is not None:
            work.wait()
