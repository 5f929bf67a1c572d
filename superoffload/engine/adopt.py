"""Weights changed outside the engine: found by their version counters and taken into the fp32 masters.

A parameter written in place (`load_state_dict`, `torch.nn.init`, an in-place op under `no_grad`) or given
new `.data` since the engine last wrote it holds values torch.optim would step from. Before each backward
and step the engine compares every parameter's (`_version`, address) with what it recorded when it last
wrote the weights; a changed one is copied into its master (and home), and any speculation that read the
old master is redone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from superoffload.engine.bucket import Bucket
from superoffload.engine.layout import ParamSlot

log = logging.getLogger(__name__)


class WeightWatch:
    """`pending`: parameter index -> its whole fp32 master before its buckets exist; `homes`: a resident
    parameter's flat view of its bucket's device weights; `drain`: waits for the host worker."""

    def __init__(self, slots: list[ParamSlot], pending: dict[int, torch.Tensor], homes: dict[int, torch.Tensor],
                 drain: Callable[[], None]) -> None:
        self.slots, self.pending, self.homes = slots, pending, homes
        self.drain = drain
        self.flowed: set[int] = set()  # id() of the parameters weight flow owns (their address moves)
        self.bucket_of: dict[int, Bucket] = {}  # id(piece) -> the bucket holding it
        self.laid_out = False
        self.versions = self._versions()

    def add_buckets(self, buckets: list[Bucket]) -> None:
        self.bucket_of.update({id(pc): b for b in buckets for pc in b.slots})

    def _versions(self) -> list[tuple[int, int]]:
        if not self.laid_out:
            return [(s.param._version, -1) for s in self.slots]
        flowed = self.flowed
        return [(s.param._version, -1 if id(s.param) in flowed else s.param.data_ptr()) for s in self.slots]

    def written(self) -> None:
        """The engine itself wrote the weights (a step's return, a load): not the user's changes to adopt."""
        self.versions = self._versions()

    def adopt(self) -> None:
        """Take the values of every parameter changed since the engine last wrote it into its master, as
        torch.optim would step from them, and redo any speculation that used the old master."""
        now = self._versions()
        changed = [s for s, a, b in zip(self.slots, self.versions, now, strict=True) if a != b]
        if not changed:
            return
        self.drain()  # pending returns must not overwrite what the user wrote after them
        with torch.no_grad():
            for s in changed:
                values = s.param.detach().reshape(-1)
                if s.index in self.pending:  # not in a bucket yet: the weights are all there is
                    self.pending[s.index] = values.to("cpu", torch.float32).clone()
                    continue
                home = self.homes.get(s.index)
                if home is None:  # a flowed parameter: its values go to this rank's part of its host store
                    self._write_flow_store(s, values)
                elif s.param.data_ptr() != home.data_ptr():
                    home.copy_(values)
                    s.param.data = home.view(s.shape)
                self.write_master(s, values)
                for pc in s.pieces:
                    self.bucket_of[id(pc)].spec.queued = False  # its speculation read the old master: redo it
        log.info("adopted new values of %d parameter(s) written outside the engine", len(changed))
        self.versions = self._versions()

    def _write_flow_store(self, s: ParamSlot, values: torch.Tensor) -> None:
        if values.numel() != s.numel:  # sharded across ranks: outside its uses the parameter holds nothing
            return
        for pc in s.pieces:
            b = self.bucket_of[id(pc)]
            if (o := pc.overlap(b.lo, b.hi)) is not None:
                a, e, start = o
                b.before_home_write()
                b.home_shard()[a - b.lo: e - b.lo].copy_(values[start: start + e - a])

    def write_master(self, s: ParamSlot, values: torch.Tensor) -> None:
        """This rank's part of parameter `s`'s fp32 master from its flat `values` (in its pieces' buckets;
        before the layout is built, the whole pending master, which also sets the weights)."""
        if s.index in self.pending:  # not in a bucket yet
            self.pending[s.index] = values.reshape(-1).to("cpu", torch.float32).clone()
            with torch.no_grad():
                s.param.data.copy_(self.pending[s.index].view(s.shape))
            return
        for pc in s.pieces:
            b = self.bucket_of[id(pc)]
            if (o := pc.overlap(b.lo, b.hi)) is not None:
                a, e, start = o
                b.master[a - b.lo: e - b.lo].copy_(values[start: start + e - a])
