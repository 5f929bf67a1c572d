"""What the engine allocates for a bucket layout, and the checks that it fits, before any of it is.

`BufferBuilder.create(layouts)` requests every host buffer the buckets need from two exact-size arenas
(`buffers.py`: pinned for what crosses the link, pageable for the optimizer state), gives resident
buckets their device weights (one allocation per chain of buckets a split parameter spans, so the
parameter stays one view: `superoffload.packing.chains`), fills each bucket's fp32 master from the
weights as given and builds the `Bucket`s. The same requests, made on arenas that are never allocated,
price a layout first (`check_budgets`: the device tail against `hbm_budget_bytes`, the host buffers
against `host_budget_bytes`), so an over-budget config is an error before anything is moved or
allocated. The engine asks for the staging and upload rings once the layout is built.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from superoffload.device import Device
from superoffload.engine.bucket import Bucket, HostBuffers
from superoffload.engine.buffers import ArenaRequest, HostArena, StagingRing, UploadRing, aligned_bytes
from superoffload.engine.comm import Comm
from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.context import EngineContext
from superoffload.engine.layout import BucketLayout, ParamSlot
from superoffload.packing import ShapeTensor, chains, plan_buckets
from superoffload.planner.presets import physical_memory_bytes
from superoffload.units import nbytes

Requests = dict[int, dict[str, Any]]  # id(layout) -> its host buffer requests
StoreRequests = dict[int, tuple[ArenaRequest, int, int]]  # id(layout) -> (its chain's store request, start, end)


class BufferBuilder:
    """Builds buckets and their buffers for one engine. `pending_master`: parameter index -> the fp32
    master taken from the weights as given (a bucket takes its part; the last piece's bucket drops it)."""

    def __init__(self, ctx: EngineContext, pending_master: dict[int, torch.Tensor]) -> None:
        self.ctx = ctx
        self.pending_master = pending_master
        self.arenas: list[HostArena] = []  # every host allocation made so far
        self.homes: dict[int, torch.Tensor] = {}  # a resident parameter's flat view of its device weights

    @property
    def device(self) -> Device:
        return self.ctx.device

    @property
    def config(self) -> SuperOffloadConfig:
        return self.ctx.config

    @property
    def comm(self) -> Comm:
        return self.ctx.comm

    @property
    def dtype(self) -> torch.dtype:
        return self.ctx.dtype

    # --- dtypes --------------------------------------------------------------------------------------
    @property
    def grad_dtype(self) -> torch.dtype:
        """The dtype gradients are flattened, reduced and moved to the host in: the training precision with
        `grad_cast: host` (the host kernel casts; with several ranks the reduce-scatter sums in it, as
        DeepSpeed's default communication_data_type and DDP on a bf16 model do), else fp32 (cast on the
        device before any reduction)."""
        lowp = self.dtype != torch.float32
        return self.dtype if lowp and self.config.grad_cast == "host" else torch.float32

    @property
    def upload_dtype(self) -> torch.dtype:
        """The dtype new weights cross the link in: the training precision with `param_cast: host`."""
        lowp = self.dtype != torch.float32
        return self.dtype if lowp and self.config.param_cast == "host" else torch.float32

    # --- budgets -------------------------------------------------------------------------------------
    @staticmethod
    def provisional_layouts(slots: Sequence[ParamSlot], order: list[int], config: SuperOffloadConfig, world: int,
                            segment: Callable[[ParamSlot], Hashable | None]) -> list[BucketLayout]:
        """The buckets an arrival order gives (the real one is measured on the first step), packed from
        stand-ins for the parameters so that no engine state changes."""
        seg = {s.name: segment(s) for s in slots}
        stand_ins = [ShapeTensor(s.name, s.numel, s.group) for s in slots]
        return plan_buckets(stand_ins, order, config.bucket_size, config.device_tail_buckets, world,
                            segment=lambda t: seg[t.name])

    def check_budgets(self, layouts: list[Any]) -> None:
        """The device tail and the host buffers `layouts` (the buckets still to build) need must fit."""
        self._check_tail_budget(layouts)
        self._check_host_budget(layouts)

    def _check_tail_budget(self, layouts: list[Any]) -> None:
        per_elem = 4 * (5 if self.config.optimizer.amsgrad else 4)  # fp32 master, m, v, (vmax), grad shard
        tail = sum(lay.padded // self.comm.shards * per_elem for lay in layouts if lay.on_device)
        if tail > self.device.hbm_budget_bytes:
            raise ConfigError(f"device_tail_buckets={self.config.device_tail_buckets} needs {tail} B of device "
                              f"memory for grads + Adam state, budget is {self.device.hbm_budget_bytes} B; "
                              f"lower device_tail_buckets or bucket_size")

    def host_needs(self, layouts: list[Any]) -> dict[str, int]:
        """Host bytes by kind of buffer that building `layouts` would allocate (aligned as the arenas
        carve them); the upload ring's slots under "upload" when `upload_slots` > 0."""
        pinned, pageable = self._new_arenas()
        reqs, stores = self._request_buffers(layouts, pinned, pageable)
        need: dict[str, int] = collections.Counter()
        for r in reqs.values():
            for key in ("state", "spare", "landing", "upload"):
                value = r[key]
                for one in value if isinstance(value, list) else [value] if value is not None else []:
                    need[key] += aligned_bytes(one)
        need["flow stores"] = sum(aligned_bytes(req) for req in {id(v[0]): v[0] for v in stores.values()}.values())
        host = [lay for lay in layouts if not lay.on_device]
        if self.config.upload_slots and host:
            width = max(lay.padded // self.comm.shards for lay in host)
            need["upload"] += self.config.upload_slots * aligned_bytes(ArenaRequest(width, self.upload_dtype))
        return need

    def _check_host_budget(self, layouts: list[Any]) -> None:
        """Against `host_budget_bytes` (default: this machine's physical memory), with what the engine
        already holds: an error naming the settings that would make it fit."""
        cfg = self.config
        need = self.host_needs(layouts)
        held = sum(a.nbytes for a in self.arenas)
        total = held + sum(need.values())
        budget = cfg.host_budget_bytes or physical_memory_bytes()
        if total <= budget:
            return
        names = {"state": "fp32 master, m, v", "spare": "full_copy spare state", "landing": "gradient landing",
                 "upload": "weight upload", "flow stores": "flowed weights"}
        parts = ", ".join(f"{names[k]} {nbytes(v)}" for k, v in sorted(need.items(), key=lambda kv: -kv[1]) if v)
        hints = []
        if need["upload"] and not cfg.upload_slots:
            hints.append(f"upload_slots: 2 (two pinned slots instead of {nbytes(need['upload'])} of upload buffers)")
        if self.dtype != torch.float32 and self.grad_dtype == torch.float32:
            hints.append(f"grad_cast: host (gradients land in {cfg.precision}: half of {nbytes(need['landing'])})")
        if need["spare"]:
            hints.append(f"rollback_mode: deferred (no spare state: {nbytes(need['spare'])})")
        if cfg.device_tail_buckets < len(layouts):
            hints.append("more device_tail_buckets (their state lives on the device)")
        hints.append("more ranks (each holds 1/W of the state)")
        where = "host_budget_bytes" if cfg.host_budget_bytes else "this machine's physical memory"
        raise ConfigError(f"the engine's host buffers need {nbytes(total)} ({parts}"
                          f"{f', already allocated {nbytes(held)}' if held else ''}), more than {where} "
                          f"({nbytes(budget)}); to fit, set {'; or '.join(hints)}; or raise host_budget_bytes")

    # --- buckets -------------------------------------------------------------------------------------
    def create(self, layouts: list[BucketLayout]) -> list[Bucket]:
        """Buffers for `layouts` (host ones from two exact-size arenas), filled from the pending masters
        and the current weights; resident parameters become views of their buckets' device weights."""
        if not layouts:
            return []
        pinned, pageable = self._new_arenas()
        reqs, stores = self._request_buffers(layouts, pinned, pageable)
        pinned.allocate()
        pageable.allocate()
        self.arenas += [pinned, pageable]
        resident = [lay for lay in layouts if lay.flow_block is None]
        homes = self._device_homes(resident)
        for key, (req, a, e) in stores.items():  # a flowed bucket's home: its part of its chain's host store
            homes[key] = req.tensor[a:e]
        tails = self._tail_arenas(layouts)
        buckets = [self._make_bucket(lay, reqs.get(id(lay)), homes[id(lay)], tails.get(id(lay))) for lay in layouts]
        self._view_homes(resident, homes)
        return buckets

    def _new_arenas(self) -> tuple[HostArena, HostArena]:
        """(pinned: what crosses the link, pageable: the optimizer state)."""
        dev = self.device
        return (HostArena(dev, pinned=not dev.shares_host_memory, category="transfer"),
                HostArena(dev, pinned=False, category="optimizer_state"))

    def _request_buffers(self, layouts: list[Any], pinned: HostArena,
                         pageable: HostArena) -> tuple[Requests, StoreRequests]:
        """Every host buffer `layouts` need, requested from the two arenas: per host bucket, and the
        flowed buckets' stores."""
        dev, cfg, comm = self.device, self.config, self.comm
        grad_dtype, up_dtype = self.grad_dtype, self.upload_dtype
        full_copy = cfg.rollback_mode == "full_copy"
        state = 4 if cfg.optimizer.amsgrad else 3
        reqs: Requests = {}
        stores = self._flow_store_requests(layouts, pinned)
        for lay in layouts:
            if lay.on_device:
                continue
            lo, hi = lay.shard(comm.shard_rank, comm.shards)
            n = hi - lo
            # with a shared memory device and one rank, the flatten writes the landing buffer directly
            landing_n = lay.padded if dev.shares_host_memory and not comm.sharded else n
            reqs[id(lay)] = {
                "state": [pageable.request(n, torch.float32) for _ in range(state)],
                "spare": [pageable.request(n, torch.float32) for _ in range(state)] if full_copy else None,
                "landing": (pageable if dev.shares_host_memory else pinned).request(landing_n, grad_dtype),
                "upload": pinned.request(n, up_dtype) if cfg.upload_slots == 0 else None}
        return reqs, stores

    def _flow_store_requests(self, layouts: list[Any], arena: HostArena) -> StoreRequests:
        """Flowed buckets' host stores (this rank's shard of their weights): one request per chain, so at
        one rank a split parameter's stored weights are contiguous too."""
        out: StoreRequests = {}
        for chain in chains([lay for lay in layouts if lay.flow_block is not None]):
            sizes = [lay.padded // self.comm.shards for lay in chain]
            req = arena.request(sum(sizes), self.dtype)
            base = 0
            for lay, n in zip(chain, sizes, strict=True):
                out[id(lay)] = (req, base, base + n)
                base += n
        return out

    def _device_homes(self, layouts: list[BucketLayout]) -> dict[int, torch.Tensor]:
        """Each resident bucket's flat device weights; the buckets of a chain share one allocation."""
        homes: dict[int, torch.Tensor] = {}
        for chain in chains(layouts):
            flat = self.device.zeros(sum(lay.padded for lay in chain), self.dtype, "weights")
            base = 0
            for lay in chain:
                homes[id(lay)] = flat[base: base + lay.padded]
                base += lay.padded
        return homes

    def _view_homes(self, layouts: list[BucketLayout], homes: dict[int, torch.Tensor]) -> None:
        """Resident parameters become views of their buckets' device weights (holding their values)."""
        with torch.no_grad():
            for lay in layouts:
                for pc in lay.slots:
                    homes[id(lay)][pc.offset: pc.offset + pc.numel].copy_(
                        pc.param.data.reshape(-1)[pc.start: pc.start + pc.numel])
            for lay in layouts:
                for pc in lay.slots:
                    if pc.start == 0:  # the first piece: the view starts here and runs on through the chain
                        s = pc.tensor
                        home = homes[id(lay)]
                        flat = home.as_strided((s.numel,), (1,), home.storage_offset() + pc.offset)
                        self.homes[s.index] = flat
                        s.param.data = flat.view(s.shape)

    def _tail_arenas(self, layouts: list[BucketLayout]) -> dict[int, dict[str, torch.Tensor]]:
        """The device tail buckets' fp32 master, moments and gradient shards: one flat device allocation
        per kind, each bucket's shard a view of it (id(layout) -> its views)."""
        tails = [lay for lay in layouts if lay.on_device]
        if not tails:
            return {}
        comm = self.comm
        sizes = [lay.shard(comm.shard_rank, comm.shards) for lay in tails]
        total = sum(hi - lo for lo, hi in sizes)
        keys = ("master", "exp_avg", "exp_avg_sq", "grad", *(["max_exp_avg_sq"] if self.config.optimizer.amsgrad
                                                             else []))
        flat = {k: self.device.zeros(total, torch.float32, "tail_state") for k in keys}
        out, base = {}, 0
        for lay, (lo, hi) in zip(tails, sizes, strict=True):
            out[id(lay)] = {k: t[base: base + hi - lo] for k, t in flat.items()}
            base += hi - lo
        return out

    def _make_bucket(self, lay: BucketLayout, req: dict[str, Any] | None, home: torch.Tensor,
                     tail: dict[str, torch.Tensor] | None) -> Bucket:
        comm = self.comm
        lo, hi = lay.shard(comm.shard_rank, comm.shards)
        host = None
        if tail is not None:  # a device tail bucket
            master = tail["master"]
        else:
            st = [r.tensor for r in req["state"]]
            for t in st:
                t.zero_()
            host = HostBuffers(master=st[0], exp_avg=st[1], exp_avg_sq=st[2],
                               max_exp_avg_sq=st[3] if len(st) > 3 else None,
                               spare=[r.tensor for r in req["spare"]] if req["spare"] is not None else None,
                               landing=req["landing"].tensor,
                               upload=req["upload"].tensor if req["upload"] is not None else None)
            if host.upload is not None:
                host.upload.zero_()
            master = host.master
        with torch.no_grad():
            for pc in lay.slots:  # this rank's part of each piece's fp32 master
                if (o := pc.overlap(lo, hi)) is not None:
                    a, b, start = o
                    master[a - lo: b - lo].copy_(self.pending_master[pc.index][start: start + b - a])
            for pc in lay.slots:
                if pc.last:  # the other pieces of a split parameter are in earlier buckets
                    self.pending_master.pop(pc.index, None)
            if lay.flow_block is not None:  # the host store: this rank's shard of the bucket's weights
                _fill_shard(home, lay, lo, hi)
        return Bucket(lay, self.ctx, home, host, tail)

    # --- rings ---------------------------------------------------------------------------------------
    def staging_ring(self, buckets: list[Bucket]) -> StagingRing | None:
        """The device slots the largest host bucket's flat gradient (and, sharded over several ranks, its
        reduced shard) passes through on its way to the host; None when the device is the host, buckets are
        not sharded (one rank, or `replicate`) and no tail bucket is reduced across ranks."""
        dev, comm = self.device, self.comm
        # host buckets' gradients are flattened into their landing buffers directly where the device is the
        # host and a bucket is not split across ranks (engine._grad_target); tail buckets on one rank, into
        # their own gradient
        direct = dev.shares_host_memory and not comm.sharded
        need = [b for b in buckets if (b.host is not None and not direct) or (b.tail is not None and comm.active)]
        if not need:
            return None
        numel = max(b.layout.padded for b in need)
        dtype = self.grad_dtype
        # several ranks: the reduce-scatter's output is a slot of its own, except where it can land in the
        # host buffer directly (a device that is the host) and tail buckets' fp32 gradients take it as is
        return StagingRing(dev, self.config.staging_buffers, numel, numel // comm.shards, dtype,
                           separate_shard=comm.sharded and (not dev.shares_host_memory or dtype != torch.float32))

    def upload_ring(self, buckets: list[Bucket]) -> UploadRing | None:
        """With `upload_slots` = k > 0: k pinned slots of the largest host shard, in the dtype weights
        cross the link in. Publish order is forward order (the last-arriving host bucket first); the first
        k buckets in it may speculate into their slot."""
        host = [b for b in buckets if b.host is not None and b.host.upload is None]
        if not host:
            return None
        # flowed blocks' buckets are built at initialize: a reconfigure (the plan) that changed upload_slots
        # after that leaves them as they were built, with their own buffers or, turned off, a 2-slot ring
        k = self.config.upload_slots or 2
        ring = UploadRing(self.device, k, max(b.shard_numel for b in host), self.upload_dtype)
        self.arenas.append(ring.arena)
        for p, b in enumerate(reversed(host)):
            b.use_upload_ring(ring, p % k, speculate=p < k)
        return ring


def _fill_shard(dst: torch.Tensor, lay: BucketLayout, lo: int, hi: int) -> None:
    """`dst` (a flowed bucket's host store, this rank's shard) <- the current weights of its pieces."""
    dst.zero_()
    for pc in lay.slots:
        if (o := pc.overlap(lo, hi)) is not None:
            a, b, start = o
            dst[a - lo: b - lo].copy_(pc.param.data.reshape(-1)[start: start + b - a])
