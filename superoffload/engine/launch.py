"""The device half of a bucket's life: from autograd's gradients to the reduced shard, its norm and, for a
host bucket, its copy in host memory; then the speculative host step is queued.

Per bucket, on the training thread, once its last gradient is ready (`Launcher.hook`), in bucket order:
1. compute stream: one foreach copy of the bucket's gradients into their flat views (a staging slot, the
   tail bucket's own gradient, or a host landing buffer where the device is the host), which is the
   cast to the reduction dtype; the autograd gradients are then dropped (`.grad = None`): they were read
   on the stream that made them, so their memory is reusable in stream order with no `record_stream`.
2. side stream (one switch; its waits are on preallocated events, never `wait_stream`): the reduction
   across ranks, the norm (one reduction per bucket, `norms.py`), the D2H copy of a host bucket's shard,
   then the events the host worker and the next user of the staging slot wait on.
3. the speculative host step is queued on the worker (it waits for the D2H event).

Tail buckets on one rank need no side stream: the copy lands in the tail's gradient and the norm runs on
the compute stream. Where waiting for a collective blocks the host (the CPU-only backend, gloo) the part
of a launch after the reduction is completed later, in bucket order (`complete`), so backward goes on
while the ranks exchange the bucket.

All per-bucket facts a launch needs (views, targets, norm inputs) are made once per (bucket, staging
slot) and cached (`Target`): the launch's Python work does not grow with a bucket's tensors or bytes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from superoffload.engine.bucket import Bucket, HyperParams, Speculation
from superoffload.engine.buffers import StagingRing
from superoffload.engine.context import EngineContext
from superoffload.engine.layout import ParamSlot
from superoffload.engine.norms import BucketNorms
from superoffload.engine.step_state import InFlight, StepState

SpecInputs = Callable[[], tuple[float, dict[int, HyperParams]]]


@dataclass
class Target:
    """Where one bucket's gradients go through one staging slot (or none): made once, reused per launch."""

    flat: torch.Tensor  # the flat gradient the copy writes (padded)
    views: list[torch.Tensor]  # per piece, its view in `flat` (a whole parameter's in its shape)
    # the copy of a launch that is not a carry: per piece, its destination, or None where an earlier
    # bucket's launch already copied the piece (a split parameter whose pieces lie end to end in the
    # tail's gradient arena is copied whole, in its own shape, by its first piece's launch); and whether
    # the source is the whole gradient (else the piece's slice of it)
    dst: list[torch.Tensor | None]
    whole_src: list[bool]
    shard: torch.Tensor  # where this rank's reduced part lands
    norm_views: list[torch.Tensor]  # what the norm parts read (pads excluded)
    d2h: torch.Tensor | None  # a host bucket's device source of the copy to `landing`
    slot: int | None  # the staging slot, or None
    d2h_bytes: int = 0
    land: torch.Tensor | None = None  # the part of `landing` the D2H writes


class Launcher:
    """Launches buckets as their gradients become ready, in bucket order. Used by the engine's backward and
    by the plain-loop driver (`plain_loop.py`) through the public methods only."""

    def __init__(self, ctx: EngineContext, slots: list[ParamSlot], step_state: StepState,
                 steps: list[int], spec_inputs: SpecInputs) -> None:
        self.ctx = ctx
        self.dev = dev = ctx.device
        self.slots = slots
        self.step_state = step_state
        self.steps = steps
        self.spec_inputs = spec_inputs
        self.slot_of = {id(s.param): s.index for s in slots}
        self.side = dev.new_stream("side")
        self.compute = dev.current_stream()
        self.side_done = dev.new_event()  # the side stream's last launch: norms and shards written
        self.side_used = False  # a launch this step ran on the side stream (validation waits for it)
        self.comm_active = ctx.comm.active
        self.sharded = ctx.comm.sharded
        # per-launch figures kept here and added to the engine's counters once per step (`flush`): a
        # locked counter update per bucket was a measurable part of the launch
        self.launch_s = 0.0
        self.d2h_bytes = 0
        self.d2h_copies = 0
        self.buckets: list[Bucket] = []
        self.ring: StagingRing | None = None
        self.norms: BucketNorms | None = None
        self.buckets_of: list[list[Bucket]] = []  # per parameter, the buckets its gradient launches in
        self.grads_copied: list[Any] = []  # per staging slot: the compute stream's copy into it ran
        self.dirty: list[int] = []  # per staging slot: elements past which it holds zeros
        self.targets: dict[tuple[Bucket, int | None], Target] = {}
        self.in_flight: collections.deque[InFlight] = collections.deque()
        self.grad_gen = [0] * len(slots)  # bumped when a parameter's gradient is released
        self.adopted: set[int] = set()  # parameters whose gradient a launch took and has not yet released
        # the plain-loop driver's gradient-ready handler, when a plain loop drives the engine
        self.plain: Callable[[int], None] | None = None

    def bind(self, buckets: list[Bucket], ring: StagingRing | None, norms: BucketNorms) -> None:
        """The laid-out buckets and their staging ring (once, when the layout is built)."""
        self.buckets, self.ring, self.norms = buckets, ring, norms
        self.comm_active = self.ctx.comm.active  # read per launch; fixed once the layout is built
        self.sharded = self.ctx.comm.sharded
        self.buckets_of = [[buckets[k] for k in s.buckets] for s in self.slots]
        n = len(ring) if ring is not None else 0
        self.grads_copied = [self.dev.new_event() for _ in range(n)]
        self.dirty = [0] * n
        self.targets = {}

    # --- gradient-ready hooks ------------------------------------------------------------------------
    def hook(self, p: torch.Tensor) -> None:
        """A parameter's gradient is ready (its post-accumulate-grad hook): with the engine's own backward,
        at an accumulation boundary, launch what is complete (the measuring step records the arrival
        order instead); with a plain loop, its driver decides (`plain`)."""
        idx = self.slot_of[id(p)]
        if self.plain is not None:
            self.plain(idx)
            return
        st = self.step_state
        if not st.boundary:
            return
        if not self.buckets:
            st.arrival.append(idx)
            return
        self.param_ready(idx)

    def param_ready(self, idx: int) -> None:
        """Parameter `idx` holds its last gradient of the step (so does each of its pieces, in one or
        several buckets): launch every bucket that is complete, in bucket order (identical on every rank
        whatever order gradients arrive in)."""
        for b in self.buckets_of[idx]:
            b.ready += 1
        st, buckets = self.step_state, self.buckets
        while st.next_launch < len(buckets):
            nxt = buckets[st.next_launch]
            if nxt.ready < nxt.pieces:
                break
            self.launch(nxt)
            st.next_launch += 1

    def launch_remaining(self) -> None:
        """The buckets still waiting when backward ended (parameters without a gradient), in order; then
        every launch is completed (validation reads every bucket's norm)."""
        for b in self.buckets[self.step_state.next_launch:]:
            self.launch(b)
        self.step_state.next_launch = len(self.buckets)
        self.complete()

    # --- one bucket ----------------------------------------------------------------------------------
    def _target(self, b: Bucket) -> Target:
        """The bucket's target for this launch (a staging slot taken round robin), cached per slot."""
        ring, comm = self.ring, self.ctx.comm
        direct = (b.tail is not None and not self.comm_active) or (
            b.host is not None and self.dev.shares_host_memory and not comm.sharded)
        slot = None if direct or ring is None else ring.acquire()
        t = self.targets.get((b, slot))
        if t is None:
            t = self.targets[(b, slot)] = self._make_target(b, slot)
        return t

    def _make_target(self, b: Bucket, slot: int | None) -> Target:
        comm, dev, lay = self.ctx.comm, self.dev, b.layout
        if slot is None:  # reduced in place: the tail's gradient, or the landing buffer the host reads
            flat = b.tail["grad"] if b.tail is not None else b.host.landing
            shard = flat
        else:
            ring = self.ring
            flat = ring.flat[slot][: lay.padded]
            if b.tail is not None and b.tail["grad"].dtype == flat.dtype:
                shard = b.tail["grad"]
            elif b.tail is None and dev.shares_host_memory:
                shard = b.host.landing
            elif comm.sharded:  # a discrete device, or a tail bucket's low-precision reduction (cast after)
                shard = ring.shard[slot][: b.shard_numel]
            else:
                shard = flat
        parts = flat[: lay.numel].split([pc.numel for pc in b.slots])
        views = [v.view(pc.tensor.shape) if pc.whole else v for pc, v in zip(b.slots, parts, strict=True)]
        dst: list[torch.Tensor | None] = list(views)
        whole_src = [pc.whole for pc in b.slots]
        if slot is None and b.tail is not None:
            for i, pc in enumerate(b.slots):
                if not pc.whole and self._lies_end_to_end(pc.tensor):
                    if pc.start == 0:
                        n = pc.tensor.numel
                        dst[i] = flat.as_strided((n,), (1,), flat.storage_offset() + pc.offset).view(pc.tensor.shape)
                        whole_src[i] = True
                    else:
                        dst[i] = None
        offset = b.lo if comm.sharded else 0
        reduced = shard if b.tail is None or shard is b.tail["grad"] else b.tail["grad"]
        norm_views = self.norms.part_views(lay, reduced, offset)
        d2h = None
        if b.host is not None and shard is not b.host.landing:
            # sharded, the whole shard (its pads are zeros); else the elements, not the pads
            d2h = shard if comm.sharded else shard[: lay.numel]
        nbytes = d2h.numel() * d2h.element_size() if d2h is not None else 0
        land = b.host.landing[: d2h.numel()] if d2h is not None else None
        return Target(flat, views, dst, whole_src, shard, norm_views, d2h, slot, nbytes, land)

    def _lies_end_to_end(self, s: ParamSlot) -> bool:
        """A split parameter whose pieces are all in tail buckets that reduce in place, each piece right
        after the previous one in the tail's gradient arena (one rank: its buckets' shards are whole)."""
        if self.ctx.comm.active:
            return False
        first = None
        for pc in s.pieces:
            b = self.buckets[pc.bucket]
            if b.tail is None:
                return False
            g = b.tail["grad"]
            at = g.storage_offset() + pc.offset
            if first is None:
                first, base = g, at
            elif g.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or at != base + pc.start:
                return False
        return True

    def launch(self, b: Bucket, carry: bool = False) -> None:
        """The bucket's gradients to the host (or its device tail). `carry`: the bucket was launched
        earlier in this step and its reduced shard (landing, or the tail's gradient) holds that part: the
        new gradients are added to it (the plain-loop driver, when a step has more backward passes than
        predicted)."""
        dev, ctx = self.dev, self.ctx
        t0 = time.perf_counter()
        nested = self.complete(only_done=not carry) if self.in_flight else 0.0
        if dev.enabled("launch: waits for the bucket's host tasks") and not b.idle.is_set():
            ctx.worker.wait_event(b.idle)  # last step's tasks still read this bucket's landing buffer
            ctx.counters.add(launch_wait_s=time.perf_counter() - t0)
            t0 = time.perf_counter()
        held = b.mark_present(carry)
        if b.present_idx is not b.all_present:
            self.step_state.partial = True  # the tail step takes the general path (tail.py)
        b.launched = True
        params = b.slot_params
        grads = []
        for i in held:
            grads.append(params[i].grad)
        if b.all_whole and not carry:
            dev.adopt_grads(grads)
        else:  # a split parameter's gradient is taken once, by its first piece
            index, adopted, taken = b.slot_index, self.adopted, []
            for k, i in enumerate(held):
                if index[i] not in adopted:
                    taken.append(grads[k])
            dev.adopt_grads(taken)
        t = self._target(b)
        # before the copy or the reduction overwrite it
        prev = self._carried_shard(b, t, b.resent(self.grad_gen)) if carry else None
        slot = t.slot
        if slot is not None:
            if self.in_flight:
                nested += self.complete(slot=slot)  # a reduction still reading this staging slot
            dev.wait_event(self.compute, self.ring.free_event[slot], "launch: staging slot free")
        # the copy into the flat views, on the stream that made the gradients (the cast to the reduction
        # dtype); a whole parameter's gradient copies in its own shape
        if b.all_whole and held:
            torch._foreach_copy_([t.views[i] for i in held] if len(held) < len(t.views) else t.views, grads)
        elif held:
            pieces = b.layout.slots
            if carry:  # every piece its own part (an earlier launch's whole copies hold older gradients)
                dst, whole = t.views, b.slot_whole
            else:
                dst, whole = t.dst, t.whole_src
            to, src = [], []
            for k, i in enumerate(held):
                if dst[i] is not None:
                    to.append(dst[i])
                    src.append(grads[k] if whole[i] else pieces[i].grad_view())
            if to:
                torch._foreach_copy_(to, src)
        if len(held) < len(t.views):
            has = set(held)
            torch._foreach_zero_([v for i, v in enumerate(t.views) if i not in has])
        if slot is not None and self.sharded:
            self._zero_pads(b, slot, t.flat)
        self._release(b, held, grads)
        if slot is None and not self.comm_active:  # nothing to reduce: no side stream
            self._complete(InFlight(b, None, t, slot, prev))
        else:
            self._reduce(b, t, prev)
        self.launch_s += time.perf_counter() - t0 - nested

    def _zero_pads(self, b: Bucket, slot: int, flat: torch.Tensor) -> None:
        """The pad of a staging slot after the bucket's elements must hold zeros for the reduce-scatter;
        zeroed only where an earlier, larger bucket wrote (so once per slot in steady state)."""
        n, dirty = b.layout.numel, self.dirty[slot]
        if dirty > n:
            flat[n: min(dirty, b.layout.padded)].zero_()
        self.dirty[slot] = n if dirty <= b.layout.padded else dirty

    def _release(self, b: Bucket, held: list[int], grads: list[torch.Tensor]) -> None:
        """Autograd's gradients are consumed: dropped now (their memory returns in compute-stream order); a
        split parameter's gradient is kept while its later pieces, in later buckets, still read it."""
        params, index, gen = b.slot_params, b.slot_index, self.grad_gen
        if b.all_whole:
            if grads:
                self.dev.release_grads(grads)
            for i in held:
                params[i].grad = None
                gen[index[i]] += 1
            return
        last, adopted = b.slot_last, self.adopted
        b.kept = {}
        done = []
        for k, i in enumerate(held):
            if last[i]:
                done.append(grads[k])
                params[i].grad = None
                gen[index[i]] += 1
                adopted.discard(index[i])
            else:
                adopted.add(index[i])
        if len(done) < len(held):
            b.keep(held, gen)
        self.dev.release_grads(done)

    def _reduce(self, b: Bucket, t: Target, prev: torch.Tensor | None) -> None:
        """The side stream's part: waits for the copy, then the reduction (left in flight where waiting
        blocks the host), then the rest (`_complete`)."""
        dev, side = self.dev, self.side
        if t.slot is not None:
            ev = self.grads_copied[t.slot]
            dev.record(ev, self.compute, "launch: side stream waits for the gradients")
            dev.wait_event(side, ev, "launch: side stream waits for the gradients")
        work = None
        if self.comm_active:  # one rank: the copy wrote the shard itself (a separate output only when sharded)
            with dev.stream(side):
                work = self.ctx.comm.reduce_scatter(t.shard, t.flat)
        f = InFlight(b, work, t, t.slot, prev)
        if work is not None and dev.host_waits_for_collectives:
            self.in_flight.append(f)
            self.ctx.counters.add(launches_in_flight=1)
        else:
            self._complete(f)

    def complete(self, only_done: bool = False, slot: int | None = None) -> float:
        """Complete launched buckets whose reduction was left in flight, oldest first (bucket order, the
        same on every rank, so the host worker's tasks and all-gathers keep one order): all of them; with
        `only_done`, those already reduced; with `slot`, until none still reads that staging slot. Returns
        the seconds it took."""
        q, t0 = self.in_flight, time.perf_counter()
        while q:
            if only_done and not q[0].work.is_completed():
                break
            if slot is not None and all(f.slot != slot for f in q):
                break
            self._complete(q.popleft())
        return time.perf_counter() - t0

    def _complete(self, f: InFlight) -> None:
        """A launch from the reduced shard on: the norm, the copy to the host, the speculative step. On the
        side stream, or, where nothing was reduced (a tail bucket on one rank), on the compute stream
        with no stream switch."""
        b = f.bucket
        if f.target.slot is not None or self.comm_active:
            with self.dev.stream(self.side):
                self._reduced(f, self.side)
            self.dev.record(self.side_done, self.side, "validate: compute waits for the bucket norms")
            self.side_used = True
        else:
            self._reduced(f, self.compute)
        if b.host is not None and self.step_state.speculating:
            scale, hps = self.spec_inputs()  # the clip factor assumed 1
            b.spec = Speculation(queued=True, scale=scale, hps=hps)
            steps = b.steps_snapshot(self.steps)
            b.submit(lambda: b.speculate(scale, hps, steps), "speculate")

    def _reduced(self, f: InFlight, stream: Any) -> None:
        dev, b, t = self.dev, f.bucket, f.target
        if f.work is not None:
            self.ctx.comm.wait(f.work)
        if b.tail is not None and t.shard is not b.tail["grad"]:
            b.tail["grad"].copy_(t.shard)  # reduced in the training precision; the tail steps in fp32
        if f.prev is not None:
            (b.tail["grad"] if b.tail is not None else t.shard).add_(f.prev)
            dev.hold_for(f.prev, (stream,))  # freed when this returns: not reused before the add ran
        self.norms.compute(dev.kernels, b.layout.index, t.norm_views)
        if b.host is not None:
            if t.d2h is not None:
                t.land.copy_(t.d2h, non_blocking=True)
                self.d2h_bytes += t.d2h_bytes
                self.d2h_copies += 1
            dev.record(b.d2h_event, stream, "launch: gradient landed")
        if t.slot is not None:
            dev.record(self.ring.free_event[t.slot], stream, "launch: staging slot read")

    def _carried_shard(self, b: Bucket, t: Target, resent: list[ParamSlot]) -> torch.Tensor:
        """A copy of the bucket's reduced shard from its earlier launch this step, on the stream the launch
        uses (from the host landing buffer when the device is discrete); the parts of `resent` pieces
        zeroed (their gradient, sent again, holds them)."""
        dev = self.dev
        on_side = t.slot is not None or self.ctx.comm.active
        stream = self.side if on_side else self.compute
        src = b.tail["grad"] if b.tail is not None else b.host.landing
        with dev.stream(stream):
            if b.tail is None and not dev.shares_host_memory:
                dev.wait_event(stream, b.d2h_event, "launch: gradient landed")
                prev = dev.device_buffer_like(src, "staging")
                prev.copy_(src, non_blocking=True)
            else:
                prev = src.clone()
            for pc in resent:
                if (o := pc.overlap(b.lo, b.hi)) is not None:
                    prev[o[0] - b.lo: o[1] - b.lo].zero_()
        return prev

    # --- the end of a step's launches ----------------------------------------------------------------
    def side_waited(self) -> None:
        """The compute stream waits for every launch's side-stream work (validation reads the norms, the
        tail step the reduced gradients); the step's launch figures go to the counters."""
        self.ctx.counters.add(grad_launch_s=self.launch_s, bytes_d2h=self.d2h_bytes, d2h_copies=self.d2h_copies)
        self.launch_s, self.d2h_bytes, self.d2h_copies = 0.0, 0, 0
        if self.side_used:
            self.dev.wait_event(self.compute, self.side_done, "validate: compute waits for the bucket norms")
            self.side_used = False

    def reset(self) -> None:
        """Forget the launches of the step in progress (their collectives are waited for: they still
        write staging and landing buffers)."""
        for f in self.in_flight:
            self.ctx.comm.wait(f.work)
        self.in_flight.clear()
        for b in self.buckets:
            b.spec = Speculation()
            b.launched = False
            b.ready = 0

    def abort(self) -> None:
        """An exception escaped backward: reductions left in flight are not waited for (a rank that raised
        may never see its peers issue theirs)."""
        self.in_flight.clear()

    def drop_grads(self) -> None:
        """zero_grad(): every gradient the parameters hold is dropped."""
        for s in self.slots:
            g = s.param.grad
            if g is not None:
                if s.index in self.adopted:  # a gradient a launch took (and counted) but did not release
                    self.dev.release_grads([g])
                s.param.grad = None
                self.grad_gen[s.index] += 1
        self.adopted.clear()
