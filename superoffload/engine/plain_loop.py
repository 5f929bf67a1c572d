"""The engine driven by a plain training loop: `loss.backward(); opt.step(); opt.zero_grad()`.

`superoffload.AdamW` has no `backward()` of its own to say which backward pass completes an optimizer
step (the last micro-batch of an accumulation window), yet the engine's overlap needs to know it while
that pass runs: it launches each bucket to the host as soon as its last gradient of the step is there,
and speculates the host step. So the engine learns it from the loop:

- Passes are counted from the gradients themselves. The first post-accumulate-grad hook of a backward
  pass opens it and queues a callback on that autograd graph task, which closes it when the task ends.
  A reentrant backward (activation checkpointing with `use_reentrant=True`) runs nested graph tasks
  inside the outer one; they are tracked on a stack and a pass ends only when the outermost task does.
- The number of passes per step is predicted as the most frequent count of the recent steps (a short
  last window of an epoch does not change it). In the predicted last pass a bucket is launched when
  each of its parameters has had its gradient in that pass; at the end of the pass the rest are
  launched (parameters without a gradient), as `engine.backward()` does at a boundary.
- `step()` validates. If the window had fewer passes than predicted (or there is no prediction yet,
  the first step, which also measures the bucket layout), the buckets launch there and the step is
  validated first, then stepped: the same arithmetic, without overlap.
- More passes than predicted (a gradient for a bucket that has already left): every speculation of
  the step is dropped (it used part of the gradient), gradients accumulate in `.grad` as torch
  accumulates them, and `step()` launches every bucket again, adding the new gradients to the reduced
  shard of the earlier launch (`Launcher.launch(carry=True)`), so the step uses the sum, as torch's
  does. With several ranks every rank first issues the same reductions: the buckets one rank launched
  before it saw the extra pass and another had not yet (a prefix in bucket order; the longest one is
  agreed by an all-reduce) are launched by the others too, each contributing what it holds.

Nothing here changes the arithmetic: a step with overlap, one validated first and one that needed the
extra launch give the same bits (the reduction sums the same values in the same order on one rank).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import torch
from torch.autograd import Variable

from superoffload.engine.bucket import Speculation

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine

HISTORY = 8  # steps whose pass counts predict the next step's


class PlainLoop:
    def __init__(self, engine: SuperOffloadEngine) -> None:
        self.engine = engine
        self.history: collections.deque[int] = collections.deque(maxlen=HISTORY)
        self.overruns = 0  # steps that had more passes than predicted (reported in stats)
        self._new_window()

    def _new_window(self) -> None:
        self.passes = 0  # backward passes of this window that produced a gradient for the engine
        self.active: list[int] = []  # autograd graph tasks running now, outermost first
        self.order: list[int] = []  # first arrival of each parameter (the layout, on the first step)
        self.seen: set[int] = set()
        self.ready: set[int] = set()  # parameters counted ready in the last pass
        self.boundary = False  # the predicted last pass has begun
        self.overrun = False  # ... and another pass came after it
        self.launched_all = False  # every bucket has been launched for this step

    # --- what the loop did ---------------------------------------------------------------------------
    def predicted(self) -> int | None:
        """Passes the next step is expected to have: the most frequent recent count (the latest wins a
        tie); None before the first step."""
        if not self.history:
            return None
        counts = collections.Counter(self.history)
        best = max(counts.values())
        return next(n for n in reversed(self.history) if counts[n] == best)

    @property
    def has_gradients(self) -> bool:
        return self.passes > 0

    # --- autograd thread -----------------------------------------------------------------------------
    def on_grad(self, idx: int) -> None:
        task = torch._C._current_graph_task_id()
        if task not in self.active:
            if not self.active:
                self._begin_pass()
            self.active.append(task)
            Variable._execution_engine.queue_callback(lambda task=task: self._end_task(task))
        if idx not in self.seen:
            self.seen.add(idx)
            self.order.append(idx)
        if not self.boundary or self.overrun:
            return  # not the step's last pass (yet): torch accumulates into .grad
        e = self.engine
        if any(e.buckets[k].launched for k in e.slots[idx].buckets):
            self._overrun()  # a gradient for a bucket that has already left: more passes than predicted
        elif idx not in self.ready:
            self.ready.add(idx)
            e.launcher.param_ready(idx)

    def _begin_pass(self) -> None:
        e = self.engine
        self.passes += 1
        if self.passes == 1:
            with torch.no_grad():
                e.adopt_weight_changes()  # weights written since the last step (torch would step them)
        if self.boundary:
            self._overrun()
            return
        if e.layout_measured and self.passes == self.predicted():
            self.boundary = True
            self.ready = set()
            e.begin_boundary()

    def _end_task(self, task: int) -> None:
        e = self.engine
        if task in self.active:
            self.active.remove(task)
        if self.active:
            return  # a nested (reentrant) task: the pass goes on
        e.check_unowned_grads()
        with e.backend.tracking():
            if e.flow is not None:
                e.flow.end_backward()
            if self.boundary and not self.overrun and not self.launched_all:
                e.launcher.launch_remaining()  # buckets with parameters that had no gradient in this pass
                self.launched_all = True

    def _overrun(self) -> None:
        e = self.engine
        if e.step_state.norm is not None or e.step_state.step_clip is not None:
            raise RuntimeError("a backward pass after the step's gradient norm was taken (clip_grad_norm_ or "
                               "grad_norm()) and before step(): torch would clip the earlier gradients only, "
                               "which the engine cannot; clip after the window's last backward()")
        if not self.overrun:
            self.overrun = True
            self.launched_all = False  # step() launches every bucket again with the new gradients
            self.overruns += 1
            e.step_state.speculating = False
            for b in e.buckets:
                b.spec = Speculation()  # it stepped from part of the step's gradient

    # --- training thread -----------------------------------------------------------------------------
    def complete(self) -> None:
        """Every bucket launched for this step (once), whatever the window looked like."""
        e = self.engine
        self.active.clear()  # a pass whose backward raised never ran its callbacks
        if self.launched_all:
            return
        with e.backend.tracking():
            if not e.layout_measured:
                first = self.order + [i for i in reversed(range(len(e.slots))) if i not in self.seen]
                with e.backend.allow_sync():
                    e.build_layout(first)
            if not self.boundary:  # no prediction yet, or fewer passes than predicted: validate first
                e.begin_boundary(speculate=False)
            if self.overrun:
                self._launch_again()
            else:
                e.launcher.launch_remaining()
        e.step_state.boundary = False
        e.step_state.backward_done = True
        self.launched_all = self.boundary = True  # a pass after this is more than the step's

    def _launch_again(self) -> None:
        e = self.engine
        done = e.step_state.next_launch
        agreed = done
        if e.comm.active:
            t = torch.tensor([done], dtype=torch.int64, device=e.device)
            e.comm.all_reduce_max(t)
            with e.backend.allow_sync():
                agreed = int(e.backend.to_host(t)[0])
        for b in e.buckets[done:agreed]:
            e.launcher.launch(b)  # what other ranks launched before the extra pass: contribute what this rank holds
        for b in e.buckets:
            if b.index < agreed and not e.comm.active and not any(s.param.grad is not None for s in b.slots):
                continue  # nothing new for it (one rank: no collective to keep in step)
            e.launcher.launch(b, carry=b.index < agreed)
        e.step_state.next_launch = len(e.buckets)
        e.launcher.complete()

    def step(self) -> bool | None:
        """Validate and apply the step; None when no gradient reached the engine since the last one
        (torch's AdamW then changes nothing either)."""
        if not self.has_gradients:
            self.active.clear()
            return None
        self.complete()
        applied = self.engine.finish_step()
        self.history.append(self.passes)
        self._new_window()
        return applied

    def zero_grad(self, keep_grads: bool = False) -> None:
        """Discard the window: gradients in `.grad` (unless `keep_grads`: the caller zeroes them) and
        whatever was launched (its speculation wrote only scratch buffers, and the next launch waits for
        its host tasks)."""
        e = self.engine
        if not keep_grads:
            e.drop_grads()
        if self.passes:
            e.worker.drain()
            e.reset_step()
        self._new_window()
