"""A bucket at run time: its buffers, its speculation record, and the host tasks that act on it.

Buffers (allocated once; host ones carved from the engine's arenas, `buffers.py`), for this rank's
shard [lo, hi) of the bucket's padded flat layout:
- `home`: where the model's weights live. A resident bucket's parameters are views of one flat device
  buffer (so a return is one copy, and with several ranks one all-gather); a flowed bucket's home is
  its host store (weight flow fetches from it).
- host buckets: fp32 `master`, `exp_avg`, `exp_avg_sq` (pageable); `landing`, the gradient shard the
  host kernel reads (pinned; with a device that shares host memory it is the flatten/reduce target
  itself); `upload`, the kernel's low-precision (or fp32) output (pinned), or with `upload_slots` > 0
  none: the bucket borrows a slot of the engine's upload ring (`UploadRing`) when it publishes;
  rollback_mode full_copy: `spare`, a second master/m/v set the
  speculative step writes.
- tail buckets: fp32 master, moments and gradient shard on the device.

The speculative step never writes what the model reads: it writes `upload` (deferred mode) or `spare`
and `upload` (full_copy). With an upload ring only the first `upload_slots` buckets in forward order
have a slot to speculate into; the others speculate nothing (deferred: their step runs when finalize
publishes them, one pass writing state and weights) or only their state (full_copy: the weights are
cast from the new master at publish). The weights change only when `finalize` publishes them after validation, so a
forward or a read between backward() and step() sees the pre-step weights, and a step that is
discarded leaves nothing to restore.

Host tasks run on the worker in submission order: `speculate` (during backward) and `finalize` (after
validation), which executes the decision the engine made (`Finalize`) without re-deriving it.
"""

from __future__ import annotations

import enum
import operator
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from superoffload.engine import host_adam
from superoffload.engine.context import EngineContext
from superoffload.engine.layout import BucketLayout, ParamSlot, runs


@dataclass(frozen=True)
class HyperParams:
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    amsgrad: bool = False  # the group steps with max_exp_avg_sq (the engine holds those buffers)


class Finalize(enum.Enum):
    """What a bucket's finalize task does after validation (decided once, by the engine)."""

    COMMIT = "commit"  # the speculative step stands: publish its weights; deferred: commit pass; full_copy: swap
    REDO = "redo"  # step now from the untouched state (validate-first, or the speculation's inputs changed)
    NOTHING = "nothing"  # the step is skipped: speculative outputs are discarded, nothing was published


@dataclass
class Speculation:
    """What the training thread queued for this bucket this step (owned by the training thread)."""

    queued: bool = False
    scale: float = 1.0
    hps: dict[int, HyperParams] = field(default_factory=dict)


@dataclass
class HostBuffers:
    master: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    max_exp_avg_sq: torch.Tensor | None
    spare: list[torch.Tensor] | None
    landing: torch.Tensor
    upload: torch.Tensor | None  # None: the bucket publishes through a slot of the engine's upload ring


class Bucket:
    def __init__(self, layout: BucketLayout, ctx: EngineContext, home: torch.Tensor,
                 host: HostBuffers | None, tail: dict[str, torch.Tensor] | None) -> None:
        self.layout = layout
        self.ctx = ctx
        dev = ctx.device
        self.lo, self.hi = layout.shard(ctx.comm.shard_rank, ctx.comm.shards)
        self.home = home  # flat padded: the device weights, or a flowed bucket's host store (shard)
        self.host = host
        self.tail = tail
        self.on_device = layout.on_device
        self.flowed = layout.flow_block is not None
        self.d2h_event = dev.new_event()  # landing holds this step's gradient shard (and the norm is written)
        self.upload_event = dev.new_event()  # the weights were written to home (and gathered)
        self.gather: Any = None  # pending all-gather of home (several ranks)
        # set when no queued task will still write this bucket's weights: the next forward waits on it.
        # A count, not a bare event, so that several weight-changing tasks may be queued at once.
        self.uploaded = dev.host_event(f"bucket {layout.index} uploaded")
        self.uploaded.set()
        self._uploads_pending = 0
        self._settle_on_publish = False  # worker thread: this finalize still owes the upload count
        self._commit_pending: tuple | None = None  # worker thread: a deferred commit pass to run
        self.idle = dev.host_event(f"bucket {layout.index} idle")  # no queued task reads landing/upload
        self.idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        self.spec = Speculation()
        self.present: list[bool] = [False] * len(layout.slots)
        self.present_idx: set[int] = set()
        # per slot, what every launch reads (read once here: through the pieces' properties they were a
        # measurable part of a launch, which runs on the training thread)
        self.slot_params = [pc.param for pc in layout.slots]
        self.slot_index = [pc.index for pc in layout.slots]
        self.slot_whole = [pc.whole for pc in layout.slots]
        self.slot_last = [pc.last for pc in layout.slots]
        self.pieces = len(layout.slots)
        self.all_whole = all(self.slot_whole)  # no parameter split across buckets: the launch's fast path
        self.all_indices = list(range(self.pieces))
        self.all_true = [True] * self.pieces
        self.all_present = set(self.slot_index)
        # the step counts of this bucket's parameters, read with C calls only (once per launch); one index
        # is asked twice so the getter returns a tuple (zip stops at the one index)
        self._steps_of = operator.itemgetter(*self.slot_index * (2 if len(self.slot_index) == 1 else 1))
        self.launched = False
        self.ready = 0
        # parameters whose gradient this bucket's last launch read and kept (a split parameter's later
        # pieces had not launched yet): parameter index -> its gradient generation then (launch.py `Launcher.launch`)
        self.kept: dict[int, int] = {}
        # upload ring (config upload_slots > 0): the slot this bucket publishes through, and whether the
        # speculative step may fill it during backward (the first buckets in forward order)
        self.ring: Any = None
        self.ring_slot = 0
        self.speculates_weights = host is not None and host.upload is not None
        self._spec_weights = False  # worker thread: this step's speculation wrote the weights to publish

    def use_upload_ring(self, ring: Any, slot: int, speculate: bool) -> None:
        """Publish through `ring`'s slot `slot`; `speculate`: the speculative step writes it."""
        self.ring, self.ring_slot, self.speculates_weights = ring, slot, speculate

    # --- identity and sizes ------------------------------------------------------------------------
    @property
    def index(self) -> int:
        """The bucket's position in the layout (a flowed bucket, built before the layout, gets it then)."""
        return self.layout.index

    @property
    def slots(self) -> list[ParamSlot]:
        return self.layout.slots

    @property
    def shard_numel(self) -> int:
        return self.hi - self.lo

    def home_shard(self) -> torch.Tensor:
        return self.home if self.flowed else self.home[self.lo: self.hi]

    @property
    def master(self) -> torch.Tensor:
        """This rank's fp32 master shard, on the host or (a tail bucket) on the device."""
        return self.tail["master"] if self.tail is not None else self.host.master

    def state(self) -> dict[str, torch.Tensor]:
        """This rank's optimizer state shards by name (master, exp_avg, exp_avg_sq[, max_exp_avg_sq])."""
        if self.tail is not None:
            return {k: t for k, t in self.tail.items() if k != "grad"}
        h = self.host
        return {k: t for k, t in (("master", h.master), ("exp_avg", h.exp_avg), ("exp_avg_sq", h.exp_avg_sq),
                                  ("max_exp_avg_sq", h.max_exp_avg_sq)) if t is not None}

    # --- task bookkeeping (training thread) --------------------------------------------------------
    def expect_upload(self) -> None:
        """A task about to be queued will rewrite this bucket's weights; the next forward waits for it."""
        with self._lock:
            self._uploads_pending += 1
            self.uploaded.clear()

    def _upload_settled(self) -> None:
        with self._lock:
            self._uploads_pending -= 1
            if self._uploads_pending == 0:
                self.uploaded.set()

    def hold(self) -> None:
        """A task about to be queued reads this bucket's buffers: the next launch waits for `release`."""
        with self._lock:
            self._pending += 1
            self.idle.clear()

    def release(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self.idle.set()

    def submit(self, fn: Callable[[], None], label: str) -> None:
        self.hold()

        def run() -> None:
            try:
                fn()
            finally:
                self.release()

        self.ctx.worker.submit(run, f"bucket {self.layout.index}: {label}")

    def mark_present(self, keep: bool = False) -> list[int]:
        """The slots whose parameter holds a gradient now (returned, slot positions); `keep`: those that
        had one at an earlier launch in this step stay present (their part is already in the reduced
        shard). Loops, not comprehensions: this runs once per bucket on the training thread, where each
        comprehension is one more Python call."""
        held = []
        for i, p in enumerate(self.slot_params):
            if p.grad is not None:
                held.append(i)
        if len(held) == self.pieces:
            self.present, self.present_idx = self.all_true, self.all_present
            return self.all_indices if not keep else held
        present = [False] * self.pieces
        for i in held:
            present[i] = True
        if keep:
            for i, was in enumerate(self.present):
                present[i] = present[i] or was
        self.present = present
        self.present_idx = {i for i, p in zip(self.slot_index, present, strict=True) if p}
        return held

    def keep(self, held: list[int], gen: list[int]) -> None:
        """The gradients of split parameters whose later pieces have not launched stay in `.grad`: noted
        with their generation, so a carried launch knows they still hold what landed then."""
        self.kept = {self.slot_index[i]: gen[self.slot_index[i]] for i in held if not self.slot_last[i]}

    def resent(self, gen: list[int]) -> list[ParamSlot]:
        """Carried pieces of a split parameter whose gradient was kept: it still holds what landed at the
        earlier launch plus the new passes', so it replaces the carried part (which is zeroed)."""
        out = [pc for pc in self.slots if self.kept.get(pc.index) == gen[pc.index]]
        self.kept = {}
        return out

    @property
    def present_indices(self) -> set[int]:
        """The parameters (indices) present in this step's launches (`all_present` when every one is)."""
        return self.present_idx

    def steps_snapshot(self, steps: list[int]) -> dict[int, int]:
        """Step counts of this bucket's parameters when a task is queued (the worker runs later)."""
        return dict(zip(self.slot_index, self._steps_of(steps), strict=False))

    # --- the host kernel over this rank's shard of the present parameters --------------------------
    def _state(self) -> list[torch.Tensor]:
        h = self.host
        assert h is not None
        return [t for t in (h.master, h.exp_avg, h.exp_avg_sq, h.max_exp_avg_sq) if t is not None]

    def _swap_state(self) -> None:
        """full_copy commit: the spare set, which the speculative step wrote, becomes the state."""
        h = self.host
        assert h is not None and h.spare is not None
        new, h.spare = h.spare, self._state()
        h.master, h.exp_avg, h.exp_avg_sq = new[:3]
        h.max_exp_avg_sq = new[3] if len(new) > 3 else None

    def _run_kernel(self, scale: float, hps: dict[int, HyperParams], steps: dict[int, int], *, commit: bool,
                    out: torch.Tensor | None, out_of_place: bool = False) -> None:
        """One host Adam pass over the shard. `out`: where the new weights go (shard-sized, fp32 or the
        low-precision dtype), or None. `out_of_place` (full_copy speculation): the new state goes to
        `spare` and the state is not written."""
        ctx, h = self.ctx, self.host
        assert h is not None
        lo, hi = self.lo, self.hi
        state = self._state()
        absent = not all(self.present)
        if out_of_place:
            assert h.spare is not None and not commit
            # parameters without a gradient are not stepped; the spare set must still hold their state
            for s in self.slots if absent else ():
                a, b = max(s.offset, lo) - lo, min(s.offset + s.numel, hi) - lo
                if s.index not in self.present_idx and a < b:
                    for dst, src in zip(h.spare, state, strict=True):
                        dst[a:b].copy_(src[a:b])
        if out is not None:
            # a shard's return is one copy of the whole shard: parameters not stepped now must hold
            # their current weights there too (which the master always casts to exactly)
            for s in self.slots if absent else ():
                a, b = max(s.offset, lo) - lo, min(s.offset + s.numel, hi) - lo
                if s.index not in self.present_idx and a < b:
                    out[a:b].copy_(h.master[a:b])
        lowp = out is not None and out.dtype != torch.float32
        o = ctx.optimizer

        def key(s: ParamSlot) -> tuple[int, int] | None:
            # one kernel call per run of parameters sharing a param group and a step count; parameters
            # without a gradient this step are not stepped at all (as torch.optim does)
            return (s.group, steps[s.index]) if s.index in self.present_idx else None

        writes = [*(h.spare if out_of_place else state if commit else []), *([out] if out is not None else [])]
        with ctx.device.access(reads=[h.landing, *state], writes=writes):
            for start, end, members in runs(self.slots, key, lo, hi):
                hp = hps[members[0].group]
                sl = slice(start - lo, end - lo)
                # a group without amsgrad leaves its part of max_exp_avg_sq (held for every parameter
                # when any group has amsgrad) untouched, as torch's AdamW never creates it there
                vmax = h.max_exp_avg_sq[sl] if hp.amsgrad and h.max_exp_avg_sq is not None else None
                host_adam.adam_step(
                    ctx.host_optimizer, h.master[sl], h.landing[sl], h.exp_avg[sl], h.exp_avg_sq[sl],
                    step=steps[members[0].index] + 1, lr=hp.lr, beta1=hp.beta1, beta2=hp.beta2, eps=hp.eps,
                    weight_decay=hp.weight_decay, adamw=o.adamw, bias_correction=o.bias_correction,
                    grad_scale=scale, max_exp_avg_sq=vmax,
                    commit=commit, param_out=out[sl] if out is not None and not lowp else None,
                    lowp_out=out[sl] if lowp else None,
                    state_out=[t[sl] for t in h.spare[:3 if vmax is None else 4]] if out_of_place else None,
                    threads=ctx.host_threads)

    # --- host tasks (run on the worker thread) -----------------------------------------------------
    def _direct_target(self) -> torch.Tensor | None:
        """The home shard when the kernel can write it in place: host-addressable and the kernel's
        output dtype (so no transfer or cast is needed)."""
        h = self.host
        assert h is not None
        home = self.home_shard()
        host_addressable = self.flowed or self.ctx.device.shares_host_memory
        return home if host_addressable and home.dtype == self._out_dtype() else None

    def _out_dtype(self) -> torch.dtype:
        h = self.host
        assert h is not None
        return h.upload.dtype if h.upload is not None else self.ring.dtype

    def _out(self) -> torch.Tensor:
        """Where the host kernel writes this shard's new weights before they are published: the bucket's
        upload buffer, or its slot of the upload ring."""
        h = self.host
        assert h is not None
        return h.upload if h.upload is not None else self.ring.slots[self.ring_slot][: self.shard_numel]

    def _step_in_place(self, scale: float, hps: dict[int, HyperParams], steps: dict[int, int]) -> bool:
        """Run the committing kernel straight into the home shard when it can be written in place
        (``_direct_target``) and publish; False, with nothing done, when it cannot."""
        direct = self._direct_target()
        if direct is None:
            return False
        self.before_home_write()
        self._run_kernel(scale, hps, steps, commit=True, out=direct)
        self._publish(None)
        return True

    def _wait_upload_buffer_free(self) -> None:
        # a previous non-blocking H2D may still be reading `upload` (or the ring slot, which another bucket
        # published through); don't overwrite it under the DMA
        if self.ring is not None:
            # a slot whose last H2D is still running: the ring is too shallow for the link (counted, so a
            # starved ring shows in the record: stats["upload_ring"])
            event = self.ring.free_event[self.ring_slot]
            busy = not event.query()
            t0 = time.perf_counter()
            self.ctx.device.sync_event(event, "host: upload slot free")
            self.ctx.counters.add(upload_slot_uses=1, upload_slot_waits=int(busy),
                                  upload_slot_wait_s=time.perf_counter() - t0)
        else:
            self.ctx.device.sync_event(self.upload_event, "host: upload buffer free")

    def speculate(self, scale: float, hps: dict[int, HyperParams], steps: dict[int, int]) -> None:
        """Step this bucket's shard before the global norm is known (clip factor assumed 1). Writes only
        `upload` or its ring slot (and `spare` with full_copy): nothing the model reads. A bucket without
        a slot to fill writes only `spare` (full_copy) or nothing (deferred: it steps at publish)."""
        ctx, h = self.ctx, self.host
        assert h is not None
        self._spec_weights = False
        # a non-finite gradient is stepped too (into scratch buffers only): validation discards it
        ctx.device.sync_event(self.d2h_event, "speculate: gradient landed")
        if not self.speculates_weights and h.spare is None:
            return
        out = None
        if self.speculates_weights:
            self._wait_upload_buffer_free()
            out = self._out()
        t0 = time.perf_counter()  # the kernel's time: a wait for the upload buffer is not the host step's
        self._run_kernel(scale, hps, steps, commit=False, out=out, out_of_place=h.spare is not None)
        self._spec_weights = out is not None
        ctx.counters.add(host_step_s=time.perf_counter() - t0)

    def finalize(self, kind: Finalize, scale: float, hps: dict[int, HyperParams], steps: dict[int, int],
                 speculated: bool) -> None:
        """Execute the engine's decision. The upload count the engine raised for it is settled as soon
        as the weights are published (a deferred commit pass still runs after), or on failure."""
        self._settle_on_publish = kind is not Finalize.NOTHING
        try:
            self._finalize(kind, scale, hps, steps, speculated)
        finally:
            if self._settle_on_publish:
                self._settle_on_publish = False
                self._upload_settled()

    def _finalize(self, kind: Finalize, scale: float, hps: dict[int, HyperParams], steps: dict[int, int],
                  speculated: bool) -> None:
        ctx, h = self.ctx, self.host
        assert h is not None
        # the gradient has landed: validation's host synchronization waited for the side stream, whose
        # last event follows every D2H (launch.py), and this task was queued after it
        if kind is Finalize.NOTHING:
            return
        t0 = time.perf_counter()
        spec_weights, self._spec_weights = self._spec_weights, False
        if kind is Finalize.COMMIT:
            if h.spare is not None:  # full_copy: the new state is in the spare set, its weights in upload
                self._swap_state()
                if not spec_weights:  # no slot to speculate into: the weights are the new master's cast
                    self._wait_upload_buffer_free()
                    with ctx.device.access(reads=[h.master], writes=[self._out()]):
                        self._out().copy_(h.master)
                self._publish(self._out())
            elif not spec_weights:
                # an upload ring bucket that had no slot: one pass writes the state and the weights (the
                # same inputs and arithmetic as a speculative pass), published at once
                if not self._step_in_place(scale, hps, steps):
                    self._wait_upload_buffer_free()
                    self._run_kernel(scale, hps, steps, commit=True, out=self._out())
                    self._publish(self._out())
            else:
                # same inputs, same arithmetic as the speculative pass: where the weights can be written
                # in place, the commit pass writes state and weights in one pass
                if not self._step_in_place(scale, hps, steps):
                    # weights now (the next forward waits for them); the commit pass, which only the next
                    # step's use of this bucket needs, is queued after every bucket's return (commit_state)
                    self._publish(self._out())
                    self._commit_pending = (scale, hps, steps)
            ctx.counters.add(commit_s=time.perf_counter() - t0)
            return
        # REDO: the state is untouched in both rollback modes; step it now
        if not self._step_in_place(scale, hps, steps):
            self._wait_upload_buffer_free()
            self._run_kernel(scale, hps, steps, commit=True, out=self._out())
            self._publish(self._out())
        label = "rollback_s" if speculated else "host_step_s"
        ctx.counters.add(**{label: time.perf_counter() - t0})

    def commit_state(self) -> None:
        """The deferred commit pass of a committed speculation: master, m and v written in place from the
        same inputs and arithmetic the speculative pass used (so bit-identical to what was published)."""
        if self._commit_pending is None:
            return
        scale, hps, steps = self._commit_pending
        self._commit_pending = None
        t0 = time.perf_counter()
        self._run_kernel(scale, hps, steps, commit=True, out=None)
        self.ctx.counters.add(commit_s=time.perf_counter() - t0)

    def before_home_write(self) -> None:
        """A flowed bucket's host store may still be read by a fetch in flight."""
        if self.flowed and self.ctx.flow_sink is not None:
            self.ctx.flow_sink.before_store_write(self)

    def _publish(self, src: torch.Tensor | None) -> None:
        """Make this rank's new weights the model's: copy `src` (the upload shard; None when the kernel
        wrote home directly) into home, then all-gather home across ranks. On the upload stream."""
        ctx = self.ctx
        dev = ctx.device
        stream = ctx.upload_stream
        t0 = time.perf_counter()
        nbytes = 0
        if src is not None:
            self.before_home_write()
        with dev.stream(stream):
            if src is not None:
                dst = self.home_shard()
                if self.flowed:
                    dst.copy_(src)  # host store <- upload: a host copy
                elif src.dtype != dst.dtype and not dev.shares_host_memory:
                    # param_cast "device": fp32 crosses the link into a device staging buffer, then the
                    # cast runs on the device (one kernel), not on the host
                    stage = ctx.upload_staging(src.numel())
                    stage.copy_(src, non_blocking=True)
                    dst.copy_(stage)
                    nbytes = src.numel() * src.element_size()
                else:
                    dst.copy_(src, non_blocking=True)
                    nbytes = 0 if dev.shares_host_memory else src.numel() * src.element_size()
            if src is not None and self.ring is not None:
                dev.record(self.ring.free_event[self.ring_slot], stream, "publish: upload slot read")
            if not self.flowed:
                with dev.access(reads=[self.home_shard()], writes=[self.home] if ctx.comm.sharded else []):
                    self.gather = ctx.comm.all_gather(self.home, self.home_shard(), worker=True)
            dev.record(self.upload_event, stream, "publish: weights written")
        ctx.counters.add(bytes_h2d=nbytes, h2d_copies=int(nbytes > 0), upload_s=time.perf_counter() - t0)
        if self._settle_on_publish:  # the next forward may use these weights now
            self._settle_on_publish = False
            self._upload_settled()
