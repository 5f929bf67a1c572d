"""Weight flow: blocks whose weights live in host memory, fetched to the device before each use.

The blocks listed in `config.flow_layers` (indices into the model's list of transformer blocks) keep
their low-precision weights in host stores (pinned with CUDA) instead of device memory:

- a flowed block's trainable parameters are bucketed on their own (laid out at initialize, before the
  arrival order is measured), and each such bucket's *home* is its host store: the host step writes
  the new weights there. Frozen parameters of the block get a store of their own;
- each store has a device buffer whose storage is allocated on fetch (resized back to its size, on the
  compute stream), filled by an H2D copy on a prefetch stream (all-gathered across ranks, ZeRO-3
  style: each rank's store holds its shard), and freed on release (resized to 0 bytes). Parameters are
  views of that buffer while resident, so autograd's saved tensors, which share the storage, are valid
  again once it is refilled before backward;
- outside their uses a flowed parameter's data is a view of its host store (one rank: a read returns
  the right values) or, with several ranks (each holds a shard), an empty tensor as DeepSpeed ZeRO-3
  leaves its parameters (`model.state_dict()` and `materialized()` gather the values; every rank calls
  them); never released memory.

When: a block is fetched before its forward and released after it; fetched again when the gradient of
its output is ready (the start of its backward, before an activation-checkpointing recompute, which
therefore finds the weights present), and released when every parameter of the block has accumulated
its gradient (or at the end of backward). `flow_prefetch` blocks ahead in the direction of travel are
fetched early, so the copy overlaps the compute of the block in front of them. A prefetch never
stalls the training thread on a host step (it is skipped and the block fetched on demand where it is
used), except with several ranks, where every rank must issue the same all-gathers in the same order.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from superoffload.device import Device
from superoffload.engine.comm import Comm
from superoffload.engine.config import ConfigError, SuperOffloadConfig
from superoffload.engine.hooks import EngineHook
from superoffload.engine.layout import BucketLayout, ParamPiece, ParamSlot, pack_layouts
from superoffload.engine.worker import HostWorker
from superoffload.packing import chains, index_pieces, split_numel

if TYPE_CHECKING:
    from superoffload.engine.bucket import Bucket

log = logging.getLogger(__name__)

# where our GPT and Hugging Face models (bare or wrapped by superoffload/models/hf.py) keep their blocks
AUTO_MODULE_LISTS = ("blocks", "model.model.layers", "model.layers")


def _in_backward() -> bool:
    """True while the autograd engine runs a backward in this thread (its hooks, and the forward that
    activation checkpointing re-runs inside backward)."""
    return torch._C._current_graph_task_id() != -1


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    """The tensors in a module's output (a tensor, or tuples / lists / dicts of them, as HF returns)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)


def find_module_list(model: nn.Module, path: str | None) -> tuple[str, nn.Module]:
    """The model's list of blocks at the dotted `path`, or the first of AUTO_MODULE_LISTS that exists."""
    for cand in (path,) if path else AUTO_MODULE_LISTS:
        obj: Any = model
        for part in cand.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, (nn.ModuleList, nn.Sequential)):
            return cand, obj
        if path and obj is not None:
            raise ConfigError(f"flow_module_list={path!r} is a {type(obj).__name__}, not an nn.ModuleList "
                              f"of blocks; point it at the model's list of transformer blocks")
    where = f"flow_module_list={path!r}" if path else f"any of {', '.join(AUTO_MODULE_LISTS)}"
    raise ConfigError(f"flow_layers is set but the model ({type(model).__name__}) has no list of blocks at "
                      f"{where}; set flow_module_list to the dotted attribute path of its nn.ModuleList of "
                      f"transformer blocks, or clear flow_layers")


def flow_segments(model: nn.Module, cfg: SuperOffloadConfig) -> dict[int, int]:
    """id(parameter) -> the flowed block (its index in the list of blocks) it belongs to, for the
    parameters of `cfg.flow_layers`' blocks (nothing is changed: what the engine's checks before any work
    need to pack the buckets as they will be)."""
    if not cfg.flow_layers:
        return {}
    _, blocks = find_module_list(model, cfg.flow_module_list)
    return {id(p): pos for pos in cfg.flow_layers if pos < len(blocks) for p in blocks[pos].parameters()}


@dataclass(eq=False)
class Store:
    """A block's weights in host memory and the device buffer they are fetched into: one bucket, or the
    chain of buckets a split parameter spans (one allocation each side, so the parameter is one view).

    `parts`: (bucket, element offset of its flat layout in `device_flat`, offset of its shard in `host`),
    or for frozen weights a single (None, 0, 0) with `host` the whole layout."""

    params: list[tuple[nn.Parameter, int, torch.Size]]  # (parameter, element offset in the flat layout, shape)
    padded: int
    host: torch.Tensor  # this rank's shards of the buckets, one after another, or the whole (frozen) layout
    parts: list[tuple[Bucket | None, int, int]]
    device_flat: torch.Tensor  # storage resized to 0 when released
    gathers: list[Any] = field(default_factory=list)

    @property
    def buckets(self) -> list[Bucket]:
        return [b for b, _, _ in self.parts if b is not None]

    def placeholder(self, p: nn.Parameter, off: int, shape: torch.Size, sharded: bool) -> torch.Tensor:
        """A released parameter's data: a view of its host store, or with several ranks (each holding a
        shard) an empty tensor, as DeepSpeed ZeRO-3 leaves its parameters outside forward."""
        if sharded:
            return torch.empty(0, dtype=p.dtype, device=self.device_flat.device)
        return self.host[off: off + shape.numel()].view(shape)

    def device_view(self, off: int, shape: torch.Size) -> torch.Tensor:
        return self.device_flat[off: off + shape.numel()].view(shape)


@dataclass(eq=False)
class FlowBlock:
    pos: int  # index in the list of blocks
    name: str  # qualified module name
    module: nn.Module
    params: list[nn.Parameter]  # unique, non-empty parameters of the block
    slots: list[ParamSlot]  # the engine's slots of those params (trainable ones)
    layouts: list[BucketLayout] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    nbytes: int = 0
    resident: bool = True
    event: Any = None  # recorded on the prefetch stream after the block's last fetch copy
    pending: bool = False  # ran forward with autograd; its backward has not started
    in_backward: bool = False
    grads_left: int = 0
    stale: bool = False  # a host store changed while the block was resident


class WeightFlow:
    """Fetches and releases the device storage of the flowed blocks' weights; see the module doc."""

    def __init__(self, model: nn.Module, cfg: SuperOffloadConfig, device: Device, comm: Comm,
                 worker: HostWorker, slots: list[ParamSlot]) -> None:
        self.model, self.cfg, self.device, self.comm, self.worker = model, cfg, device, comm, worker
        self.prefetch = cfg.flow_prefetch
        self.path, blocks = find_module_list(model, cfg.flow_module_list)
        self.n_blocks = len(blocks)
        bad = [i for i in cfg.flow_layers if i >= self.n_blocks]
        if bad:
            raise ConfigError(f"flow_layers {bad} out of range: {self.path} has {self.n_blocks} blocks "
                              f"(valid indices 0..{self.n_blocks - 1})")
        self._pos = {id(m): i for i, m in enumerate(blocks)}
        self.modules = list(blocks)
        names = {id(m): n for n, m in model.named_modules()}
        slot_of = {id(s.param): s for s in slots}
        self.slots = slots
        self.blocks: dict[int, FlowBlock] = {}
        self._block_of: dict[int, FlowBlock] = {}  # id(param) -> its flowed block
        for pos in sorted(cfg.flow_layers):
            m = self.modules[pos]
            params = [p for p in dict.fromkeys(m.parameters()) if p.numel() > 0]
            blk = FlowBlock(pos=pos, name=names[id(m)], module=m, params=params,
                            slots=[slot_of[id(p)] for p in params if id(p) in slot_of],
                            nbytes=sum(p.numel() * p.element_size() for p in params))
            self.blocks[pos] = blk
            for p in params:
                self._block_of[id(p)] = blk
        self._check_params(model)
        self.stream = device.new_stream("flow")
        self._hooks: list[Any] = []
        # a block's output gets a backward trigger only if it can fetch a flowed block (itself or ahead)
        self._trigger = {i for i in range(self.n_blocks)
                         if any(q in self.blocks for q in range(i - self.prefetch, i + 1))}
        self.started = False
        self.resident_count = self.peak_resident = self.fetches = self.demand_fetches = 0
        self.bytes_total = self._bytes_step = self.bytes_last_step = self.bytes_steps = self.steps = 0

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def _check_params(self, model: nn.Module) -> None:
        """Refuse what flowing would silently break: a weight shared with a module outside its block."""
        for name, p in model.named_parameters(remove_duplicate=False):
            blk = self._block_of.get(id(p))
            if blk is not None and not name.startswith(blk.name + "."):
                raise ConfigError(f"parameter {name} is also a weight of flowed layer {blk.pos} "
                                  f"({blk.name}): a weight shared with another module cannot flow; remove "
                                  f"{blk.pos} from flow_layers")

    def owns(self, p: torch.Tensor) -> bool:
        return id(p) in self._block_of

    def segment_of(self, s: ParamSlot) -> int | None:
        blk = self._block_of.get(id(s.param))
        return blk.pos if blk is not None else None

    def layouts(self, world: int) -> list[BucketLayout]:
        """Each flowed block's trainable parameters in buckets of their own, in the usual arrival order
        (reverse registration), laid out now so the weights can flow from the first step."""
        out = []
        for blk in self.blocks.values():
            members = list(reversed(blk.slots))
            blk.layouts = pack_layouts(members, self.cfg.bucket_size, world, blk.pos, piece=ParamPiece)
            index_pieces(members, blk.layouts)
            out += blk.layouts
        return out

    def fixed_layouts(self) -> dict[int, list[BucketLayout]]:
        return {pos: blk.layouts for pos, blk in self.blocks.items()}

    def check_tail_window(self, order: list[int], k: int, bucket_size: int, measured: bool) -> None:
        """Device tail buckets keep weights and Adam state on the device; a flowed weight has no device
        home. Before the arrival order is measured this is conservative: a flowed block conflicts if any
        of its weights is among the last-arriving parameters that k tail buckets could ever hold."""
        if k == 0:
            return
        # a bucket holds at most bucket_size elements (a larger tensor is split; superoffload.packing)
        window = k * max(bucket_size, split_numel(bucket_size, self.comm.world))
        at_risk: dict[int, str] = {}
        for i in reversed(order):
            if window <= 0:
                break
            s = self.slots[i]
            window -= s.numel
            if id(s.param) in self._block_of:
                at_risk.setdefault(self._block_of[id(s.param)].pos, s.name)
        self._raise_tail(at_risk, k, measured)

    def check_tail(self, layouts: list[BucketLayout]) -> None:
        at_risk = {lay.flow_block: lay.slots[0].name for lay in layouts if lay.on_device and lay.flow_block is not None}
        self._raise_tail(at_risk, self.cfg.device_tail_buckets, measured=True)

    def _raise_tail(self, at_risk: dict[int, str], k: int, measured: bool) -> None:
        if at_risk:
            layers = sorted(at_risk)
            when = "after measuring the gradient-arrival order, " if measured else ""
            raise ConfigError(
                f"{when}device_tail_buckets={k} can put weights of flowed layer(s) {layers} (e.g. "
                f"{at_risk[layers[0]]}) in a device tail bucket; tail buckets keep weights and Adam state on "
                f"the device, flowed layers keep their weights on the host. Lower device_tail_buckets (or "
                f"bucket_size), or remove {layers} from flow_layers")

    def start(self, buckets: list[Bucket]) -> None:
        """Stores for every flowed block (the buckets' homes; one more for frozen weights), release the
        device copies, install the hooks. Runs last in the engine's __init__, after every check."""
        dev = self.device
        by_layout = {id(b.layout): b for b in buckets}
        for blk in self.blocks.values():
            for chain in chains(blk.layouts):
                bs = [by_layout[id(lay)] for lay in chain]
                padded = sum(lay.padded for lay in chain)
                parts, params, base, host_off = [], [], 0, 0
                for lay, b in zip(chain, bs, strict=True):
                    parts.append((b, base, host_off))
                    params += [(pc.param, base + pc.offset, pc.tensor.shape) for pc in lay.slots if pc.start == 0]
                    base += lay.padded
                    host_off += b.shard_numel
                # the buckets' homes are consecutive slices of one host request (engine._flow_store_requests)
                first = bs[0].home
                host = first.as_strided((host_off,), (1,), first.storage_offset())
                blk.stores.append(Store(params, padded, host, parts, dev.empty(padded, first.dtype, "flow")))
            frozen = [p for p in blk.params if id(p) not in {id(s.param) for s in blk.slots}]
            if frozen:
                blk.stores.append(self._frozen_store(frozen))
            blk.event = dev.new_event()
            for st in blk.stores:
                for p, off, shape in st.params:
                    p.data = st.device_view(off, shape)
            blk.resident = True
            self.resident_count += 1
        for blk in self.blocks.values():
            self._release(blk)
        self.peak_resident = 0
        self._hooks.append(self.model.register_forward_pre_hook(EngineHook(self._root_pre_forward)))
        for i, m in enumerate(self.modules):
            # block i's hooks fetch blocks i..i+prefetch (forward) and trigger i-prefetch..i (backward)
            if any(q in self.blocks for q in range(i - self.prefetch, i + self.prefetch + 1)):
                self._hooks.append(m.register_forward_pre_hook(EngineHook(self._pre_forward)))
                self._hooks.append(m.register_forward_hook(EngineHook(self._post_forward)))
        for blk in self.blocks.values():
            for s in blk.slots:
                hook = EngineHook(partial(self._on_param_grad, blk))
                self._hooks.append(s.param.register_post_accumulate_grad_hook(hook))
        self.started = True

    def _frozen_store(self, params: list[nn.Parameter]) -> Store:
        """Frozen weights of a flowed block: whole on every rank (no optimizer state, never all-gathered)."""
        dev = self.device
        dtype = params[0].dtype
        n = sum(p.numel() for p in params)
        buf = dev.host_buffer(n * params[0].element_size(), pinned=not dev.shares_host_memory, category="transfer")
        host = buf.view(dtype) if n else torch.empty(0, dtype=dtype)
        offs, off = [], 0
        for p in params:
            host[off: off + p.numel()].copy_(p.data.reshape(-1))
            offs.append((p, off, p.shape))
            off += p.numel()
        return Store(offs, n, host, [(None, 0, 0)], dev.empty(n, dtype, "flow"))

    # ------------------------------------------------------------------------------------------
    # fetch and release
    # ------------------------------------------------------------------------------------------
    def _fetch(self, blk: FlowBlock, demand: bool) -> bool:
        """Start the H2D copy of a released block. `demand`: the block is needed now, so wait for its
        buckets' host steps; otherwise (a prefetch) skip it rather than stall the training thread."""
        if blk.resident:
            return True
        if not self.device.enabled("flow fetch: waits for the upload count"):
            pending = []
        else:
            pending = [b for st in blk.stores for b in st.buckets if not b.uploaded.is_set()]
        if pending and not demand and not self.comm.sharded:
            return False
        for b in pending:
            self.worker.wait_event(b.uploaded)
        dev = self.device
        cur = dev.current_stream()
        blk.stale = False
        for st in blk.stores:
            # allocated on the compute stream, which frees it again: no cross-stream reuse of the memory
            st.device_flat.untyped_storage().resize_(st.padded * st.device_flat.element_size())
            dev.storage_alloc(st.device_flat, "flow")
        # the memory may have been freed by compute work still queued: copy only after that work
        dev.wait_stream(self.stream, cur, "flow fetch: copy waits for compute")
        with dev.stream(self.stream):
            for st in blk.stores:
                for b, base, h in st.parts:
                    if b is None:  # frozen weights: whole on every rank
                        st.device_flat.copy_(st.host, non_blocking=True)
                        continue
                    n = b.shard_numel
                    st.device_flat[base + b.lo: base + b.hi].copy_(st.host[h: h + n], non_blocking=True)
                    whole = st.device_flat[base: base + b.layout.padded]
                    st.gathers.append(self.comm.all_gather(whole, whole[b.lo: b.hi], worker=False))
            dev.record(blk.event, self.stream, "flow fetch: weights copied")
        for st in blk.stores:
            for p, off, shape in st.params:
                p.data = st.device_view(off, shape)
        blk.resident = True
        self.resident_count += 1
        self.peak_resident = max(self.peak_resident, self.resident_count)
        self.fetches += 1
        self.demand_fetches += int(demand)
        self.bytes_total += blk.nbytes
        self._bytes_step += blk.nbytes
        return True

    def _use(self, blk: FlowBlock) -> None:
        """Make the block present for compute issued from here on (fetching it if it was not)."""
        if not blk.resident:
            self._fetch(blk, demand=True)
        self._wait_gathers(blk)
        self.device.wait_event(self.device.current_stream(), blk.event, "flow use: compute waits for the fetch")

    def _wait_gathers(self, blk: FlowBlock) -> None:
        for st in blk.stores:
            for g in st.gathers:
                if g is not None:
                    self.comm.wait(g)
            st.gathers = []

    def _release(self, blk: FlowBlock) -> None:
        if not blk.resident:
            return
        dev = self.device
        self._wait_gathers(blk)
        # the H2D into this memory must precede anything that reuses it once it is freed
        dev.wait_event(dev.current_stream(), blk.event, "flow release: waits for the fetch copy")
        for st in blk.stores:
            for p, off, shape in st.params:
                p.data = st.placeholder(p, off, shape, sharded=bool(st.buckets) and self.comm.sharded)
            dev.storage_free(st.device_flat, "flow", "flow release")
            st.device_flat.untyped_storage().resize_(0)
        blk.resident = False
        self.resident_count -= 1

    # ------------------------------------------------------------------------------------------
    # hooks
    # ------------------------------------------------------------------------------------------
    def _root_pre_forward(self, module: nn.Module, args: Any) -> None:
        if _in_backward():
            return
        for q in range(min(self.prefetch, self.n_blocks)):  # the first blocks overlap the embedding
            if q in self.blocks:
                self._fetch(self.blocks[q], demand=False)

    def _pre_forward(self, module: nn.Module, args: Any) -> None:
        pos = self._pos[id(module)]
        blk = self.blocks.get(pos)
        if _in_backward():
            # activation-checkpointing recompute: fetched when the block's backward began; keep it
            if blk is not None:
                self._use(blk)
            return
        if blk is not None and blk.resident:
            # resident across a host step (a forward that raised before its release, a materialized()
            # block): refetch rather than run on the old weights. A step whose host tasks have not yet
            # reached this block's stores marks it stale only when they do: wait for them first
            for b in (b for st in blk.stores for b in st.buckets):
                if not b.uploaded.is_set():
                    self.worker.wait_event(b.uploaded)
            if blk.stale:
                self._release(blk)
        if blk is not None and not blk.resident:
            self._fetch(blk, demand=True)
        for q in range(pos + 1, min(pos + 1 + self.prefetch, self.n_blocks)):
            if q in self.blocks:
                self._fetch(self.blocks[q], demand=False)
        if blk is not None:
            self._use(blk)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if _in_backward():
            return  # recompute inside backward: the weights stay until the block's backward is done
        pos = self._pos[id(module)]
        if pos in self._trigger and torch.is_grad_enabled():
            outs = [t for t in _tensors(output) if t.requires_grad]
            for t in outs:
                t.register_hook(partial(self._on_output_grad, pos))
            if outs and pos in self.blocks:
                self.blocks[pos].pending = True
        blk = self.blocks.get(pos)
        if blk is not None:
            blk.in_backward = False  # a new forward starts a new graph for this block
            self._release(blk)

    def _on_output_grad(self, pos: int, grad: torch.Tensor) -> None:
        """The gradient of block `pos`'s output is ready: its backward (and any recompute) starts next."""
        blk = self.blocks.get(pos)
        if blk is not None:
            self._use(blk)
            blk.pending = False
            if not blk.in_backward:
                blk.in_backward = True
                blk.grads_left = len(blk.slots) if len(blk.slots) == len(blk.params) else -1
        for q in range(pos - 1, max(pos - 1 - self.prefetch, -1), -1):
            b = self.blocks.get(q)
            if b is not None and b.pending:
                self._fetch(b, demand=False)

    def _on_param_grad(self, blk: FlowBlock, p: torch.Tensor) -> None:
        # a weight's gradient is accumulated after every backward node that read the weight has run, so
        # once all of the block's weights have theirs, its backward no longer needs them
        if blk.in_backward and blk.grads_left > 0:
            blk.grads_left -= 1
            if blk.grads_left == 0:
                self._release(blk)

    # ------------------------------------------------------------------------------------------
    # called by the engine and the buckets
    # ------------------------------------------------------------------------------------------
    def begin_backward(self) -> None:
        """Before loss.backward(): prefetch the last blocks of the graph, which backward needs first."""
        pending = sorted((q for q, b in self.blocks.items() if b.pending), reverse=True)
        for q in pending[:self.prefetch]:
            self._fetch(self.blocks[q], demand=False)

    def end_backward(self) -> None:
        """After loss.backward(): whatever is still resident (unused weights, frozen ones) goes."""
        for blk in self.blocks.values():
            self._release(blk)
            blk.pending = blk.in_backward = False
            blk.grads_left = 0

    def end_step(self) -> None:
        self.bytes_last_step, self._bytes_step = self._bytes_step, 0
        self.bytes_steps += self.bytes_last_step
        self.steps += 1

    def before_store_write(self, bucket: Bucket) -> None:
        """A bucket's finalize (worker thread) is about to write its host store: an H2D still reading
        it must finish first, and a resident copy is stale from now on."""
        blk = self.blocks[bucket.layout.flow_block]
        self.device.sync_event(blk.event, "flow store write: waits for fetches reading it")
        blk.stale = True

    def reload_resident(self) -> None:
        """After the stores changed outside a step (load_state_dict): refresh resident device copies."""
        for blk in self.blocks.values():
            if blk.resident:
                self._release(blk)
                self._use(blk)

    @contextlib.contextmanager
    def materialized(self) -> Iterator[None]:
        """Every flowed weight resident on the device inside the block (reading weights, saving the
        model's state_dict); blocks that were not resident before are released after."""
        was = {q for q, b in self.blocks.items() if b.resident}
        for blk in self.blocks.values():
            if blk.resident and blk.stale:
                self._release(blk)
            self._use(blk)
        try:
            yield
        finally:
            for q, blk in self.blocks.items():
                if q not in was:
                    self._release(blk)

    def state_dict_entries(self, module: nn.Module, state: dict[str, Any], prefix: str) -> None:
        """model.state_dict(): flowed weights as copies of their current values (their data between uses
        is a view of a host store that the next step rewrites, or a meta tensor with several ranks)."""
        names = {}
        for n, p in module.named_parameters(remove_duplicate=False):
            if id(p) in self._block_of:
                names.setdefault(id(p), []).append(prefix + n)
        if not names:
            return
        with self.materialized():
            for blk in self.blocks.values():
                for p in blk.params:
                    for key in names.get(id(p), []):
                        if key in state:
                            state[key] = p.detach().clone()

    def close(self) -> None:
        """Remove the hooks and bring the weights back, so the model is a plain module again. If they no
        longer fit the device, a flowed parameter keeps a copy of its host values."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if not self.started:
            return
        for blk in self.blocks.values():
            try:
                self._use(blk)
            except Exception as e:
                if not self.device.is_oom(e):
                    raise
                log.warning("weight flow: layer %d does not fit the device after close(); its parameters "
                            "now live on the host", blk.pos)
                for st in blk.stores:
                    for p, off, shape in st.params:
                        p.data = st.host[off: off + shape.numel()].view(shape).clone()
                blk.resident = False
        self.device.synchronize()
        self.started = False

    def stats(self) -> dict[str, Any]:
        return {
            "layers": sorted(self.blocks), "module_list": self.path, "prefetch": self.prefetch,
            "params": sum(p.numel() for b in self.blocks.values() for p in b.params),
            "bytes": sum(b.nbytes for b in self.blocks.values()),  # host store = device bytes saved
            "h2d_bytes_last_step": self.bytes_last_step,
            "h2d_bytes_per_step": self.bytes_steps / self.steps if self.steps else 0.0,
            "h2d_bytes_total": self.bytes_total,
            "fetches": self.fetches, "demand_fetches": self.demand_fetches,
            "resident_blocks": self.resident_count, "peak_resident_blocks": self.peak_resident,
        }
