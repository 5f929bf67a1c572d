"""Weight flow (DESIGN.md, "The life of a bucket", stage 7): blocks whose weights live on the host.

The blocks listed in `config.flow_layers` (indices into the model's list of transformer blocks) keep
their low-precision weights in a host store (pinned with CUDA) instead of HBM. Each flowed parameter
keeps its tensor, its autograd identity and its metadata; only its device storage comes and goes:

- fetch: resize the storage back to its size (allocated on the compute stream), copy the host store
  into it on a prefetch stream and record an event; the compute stream waits for that event before
  the block runs;
- release: resize the storage to 0 bytes (FSDP1-style). Autograd's saved tensors that reference the
  weight share the same storage object, so once it is resized back and refilled before backward they
  are valid again. The copies write through `param.data`, which has its own version counter: autograd
  does not see them as in-place modifications.

When: a block is fetched before its forward and released after it; fetched again when the gradient of
its output is ready (the start of its backward, before an activation-checkpointing recompute, which
therefore finds the weights present), and released when every parameter of the block has accumulated
its gradient (or at the end of backward). `flow_prefetch` blocks ahead in the direction of travel are
fetched early, so the copy overlaps the compute of the block in front of them.

With the optimizer: a host step's new weights for a flowed parameter go into its host store
(`write_host`, called by `Bucket._upload` on the worker), not into the device; a fetch first waits
until the buckets holding the block's parameters are uploaded (`worker.wait_event`: never a bare wait
that could hang on a dead worker). A prefetch never stalls the training thread on a host step: if the
host step is not done it is skipped and the block is fetched on demand where it is used.

CPU-only: streams and events are no-ops and "device" storage is host memory, but the storage is still
released and refetched: the same code path, so the CPU tests exercise it.
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

from superoffload.engine.config import ConfigError

if TYPE_CHECKING:
    from superoffload.engine.bucket import Bucket
    from superoffload.engine.engine import SuperOffloadEngine
    from superoffload.engine.layout import ParamSlot

log = logging.getLogger(__name__)

# where our GPT and Hugging Face models (bare or wrapped by harness/models/hf.py) keep their blocks
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


@dataclass(eq=False)
class FlowBlock:
    pos: int  # index in the list of blocks
    name: str  # qualified module name
    module: nn.Module
    params: list[nn.Parameter]  # unique, non-empty parameters of the block
    slots: list[ParamSlot]  # the engine's slots of those params (trainable ones)
    stores: list[torch.Tensor] = field(default_factory=list)  # flat host view per param
    nbytes: int = 0
    tracked: bool = True  # every param is trained by the engine: release after the last one's gradient
    resident: bool = True
    event: Any = None  # recorded on the prefetch stream after the block's last fetch copy
    pending: bool = False  # ran forward with autograd; its backward has not started
    in_backward: bool = False
    grads_left: int = 0
    stale: bool = False  # the host store changed since the last fetch


class WeightFlow:
    """Fetches and releases the device storage of the flowed blocks' parameters; see the module doc."""

    def __init__(self, engine: SuperOffloadEngine) -> None:
        cfg = engine.config
        self.eng = engine
        self.device = engine.device
        self.prefetch = cfg.flow_prefetch
        self.path, blocks = find_module_list(engine.model, cfg.flow_module_list)
        self.n_blocks = len(blocks)
        bad = [i for i in cfg.flow_layers if i >= self.n_blocks]
        if bad:
            raise ConfigError(f"flow_layers {bad} out of range: {self.path} has {self.n_blocks} blocks "
                              f"(valid indices 0..{self.n_blocks - 1})")
        self._pos = {id(m): i for i, m in enumerate(blocks)}
        self.modules = list(blocks)
        names = {id(m): n for n, m in engine.model.named_modules()}
        slot_of = {id(s.param): s for s in engine.slots}
        self.blocks: dict[int, FlowBlock] = {}
        self._block_of: dict[int, FlowBlock] = {}  # id(param) -> its flowed block
        for pos in sorted(cfg.flow_layers):
            m = self.modules[pos]
            params = [p for p in dict.fromkeys(m.parameters()) if p.numel() > 0]
            slots = [slot_of[id(p)] for p in params if id(p) in slot_of]
            blk = FlowBlock(pos=pos, name=names[id(m)], module=m, params=params, slots=slots,
                            nbytes=sum(p.numel() * p.element_size() for p in params),
                            tracked=len(slots) == len(params))
            self.blocks[pos] = blk
            for p in params:
                self._block_of[id(p)] = blk
        self._check_params(engine.model)
        self._store_of: dict[int, torch.Tensor] = {}
        self.stream = self.device.new_stream()
        self._hooks: list[Any] = []
        # a block's output gets a backward trigger only if it can fetch a flowed block (itself or ahead)
        self._trigger = {i for i in range(self.n_blocks)
                         if any(q in self.blocks for q in range(i - self.prefetch, i + 1))}
        self.started = False
        # stats
        self.resident_count = 0
        self.peak_resident = 0
        self.fetches = 0
        self.demand_fetches = 0
        self.bytes_total = 0
        self._bytes_step = 0
        self.bytes_last_step = 0
        self.bytes_steps = 0  # fetched within completed optimizer steps
        self.steps = 0

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def _check_params(self, model: nn.Module) -> None:
        """Refuse what storage release would silently break: weights shared with anything outside
        their block, and storages that are not exactly one parameter's own."""
        by_storage: dict[int, dict[int, str]] = {}  # storage address -> {id(param): name}
        for name, p in model.named_parameters(remove_duplicate=False):
            blk = self._block_of.get(id(p))
            if blk is not None and not name.startswith(blk.name + "."):
                raise ConfigError(f"parameter {name} is also a weight of flowed layer {blk.pos} "
                                  f"({blk.name}): a weight shared with another module cannot flow; remove "
                                  f"{blk.pos} from flow_layers")
            if p.numel() > 0:
                by_storage.setdefault(p.untyped_storage().data_ptr(), {})[id(p)] = name
        for blk in self.blocks.values():
            for p in blk.params:
                st = p.untyped_storage()
                sharing = by_storage[st.data_ptr()]
                if len(sharing) > 1:
                    raise ConfigError(f"parameters {sorted(sharing.values())} share storage; a flowed "
                                      f"layer's parameters need storage of their own")
                if (p.device != self.device.torch_device or p.storage_offset() != 0 or not p.is_contiguous()
                        or st.nbytes() != p.numel() * p.element_size() or not st.resizable()):
                    raise ConfigError(f"a parameter of flowed layer {blk.pos} ({blk.name}) is a view or does "
                                      f"not own a resizable storage on {self.device.type}; weight flow needs "
                                      f"each parameter to own its storage")

    def check_layout(self, buckets: list[Bucket]) -> None:
        """Device tail buckets step their weights on the device; a flowed weight has no device home.

        Before the gradient-arrival order is measured (at initialize) the buckets follow a provisional
        order, and the measured one moves bucket boundaries (the ln1 of block 0 arrives after its
        matmul weights, for instance). So at initialize the check is conservative: a flowed block
        conflicts if any of its weights is among the last-arriving parameters that k tail buckets could
        ever hold (k buckets of at most max(bucket_size, largest parameter) elements). After measuring,
        the actual tail buckets are checked, which can only fail where that estimate was wrong."""
        eng = self.eng
        k = eng.config.device_tail_buckets
        if k == 0:
            return
        at_risk: dict[int, str] = {}  # flowed layer -> a weight of it
        for b in buckets:
            if b.on_device:
                for s in b.slots:
                    if id(s.param) in self._block_of:
                        at_risk.setdefault(self._block_of[id(s.param)].pos, s.name)
        if not eng.layout_measured:
            window = k * max(eng.config.bucket_size, max(s.numel for s in eng.slots))
            for i in reversed(eng.order):
                if window <= 0:
                    break
                s = eng.slots[i]
                window -= s.numel
                if id(s.param) in self._block_of:
                    at_risk.setdefault(self._block_of[id(s.param)].pos, s.name)
        if at_risk:
            layers = sorted(at_risk)
            when = ("after measuring the gradient-arrival order, " if eng.layout_measured else "")
            raise ConfigError(
                f"{when}device_tail_buckets={k} can put weights of flowed layer(s) {layers} (e.g. "
                f"{at_risk[layers[0]]}) in a device tail bucket; tail buckets keep weights and Adam state on "
                f"the device, flowed layers keep their weights on the host. Lower device_tail_buckets (or "
                f"bucket_size), or remove {layers} from flow_layers")

    def start(self) -> None:
        """Copy the flowed weights into their host stores, release the device storage, install the hooks.
        Runs last in the engine's __init__, so a ConfigError never leaves a model with released weights."""
        for blk in self.blocks.values():
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in blk.params:
                by_dtype.setdefault(p.dtype, []).append(p)
            views: dict[int, torch.Tensor] = {}
            for dtype, ps in by_dtype.items():  # one host allocation per block and dtype
                flat = self.device.empty_host(sum(p.numel() for p in ps), dtype)
                off = 0
                for p in ps:
                    views[id(p)] = flat[off: off + p.numel()]
                    off += p.numel()
            blk.stores = [views[id(p)] for p in blk.params]
            for p, store in zip(blk.params, blk.stores, strict=True):
                store.copy_(p.data.reshape(-1))  # synchronous D2H: the store starts as the weights
                self._store_of[id(p)] = store
            blk.event = self.device.new_event()
            blk.resident = True
            self.resident_count += 1
        for blk in self.blocks.values():
            self._release(blk)
        self.peak_resident = 0
        model = self.eng.model
        self._hooks.append(model.register_forward_pre_hook(self._root_pre_forward))
        for i, m in enumerate(self.modules):
            # block i's hooks fetch blocks i..i+prefetch (forward) and trigger i-prefetch..i (backward)
            if any(q in self.blocks for q in range(i - self.prefetch, i + self.prefetch + 1)):
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward))
                self._hooks.append(m.register_forward_hook(self._post_forward))
        for blk in self.blocks.values():
            if blk.tracked:
                for p in blk.params:
                    hook = partial(self._on_param_grad, blk)
                    self._hooks.append(p.register_post_accumulate_grad_hook(hook))
        self.started = True

    # ------------------------------------------------------------------------------------------
    # fetch and release
    # ------------------------------------------------------------------------------------------
    def owns(self, p: torch.Tensor) -> bool:
        return id(p) in self._block_of

    def _buckets(self, blk: FlowBlock) -> list[Bucket]:
        # looked up on every fetch: the engine rebuilds its buckets after measuring the arrival order
        return [self.eng.buckets[i] for i in sorted({s.bucket for s in blk.slots})]

    def _fetch(self, blk: FlowBlock, demand: bool) -> bool:
        """Start the H2D copy of a released block. `demand`: the block is needed now, so wait for its
        buckets' host steps; otherwise (a prefetch) skip it rather than stall the training thread."""
        if blk.resident:
            return True
        buckets = self._buckets(blk)
        if not all(b.uploaded.is_set() for b in buckets):
            if not demand:
                return False
            for b in buckets:
                if not b.uploaded.is_set():
                    self.eng.worker.wait_event(b.uploaded)
        blk.stale = False
        cur = self.device.current_stream()
        for p in blk.params:
            # allocated on the compute stream, which frees it again: no cross-stream reuse of the memory
            p.untyped_storage().resize_(p.numel() * p.element_size())
        # the memory may have been freed by compute work still queued: copy only after that work
        self.stream.wait_stream(cur)
        with self.device.stream(self.stream):
            for p, store in zip(blk.params, blk.stores, strict=True):
                p.data.copy_(store.view(p.shape), non_blocking=True)
            blk.event.record(self.stream)
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
        self.device.current_stream().wait_event(blk.event)

    def _release(self, blk: FlowBlock) -> None:
        if not blk.resident:
            return
        # the H2D into this memory must precede anything that reuses it once it is freed
        self.device.current_stream().wait_event(blk.event)
        for p in blk.params:
            p.untyped_storage().resize_(0)
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
        if blk is not None and blk.resident and blk.stale:
            # resident across a host step (a forward that raised before its release, a materialized()
            # block): refetch rather than run on the old weights
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
                blk.grads_left = len(blk.slots) if blk.tracked else -1
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
    # called by the engine
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

    def write_host(self, p: torch.Tensor, src: torch.Tensor) -> None:
        """New weights of a flowed parameter (worker thread, or load_state_dict): into its host store.
        Its device copy, if resident, is not touched (on the worker it may still be in use by this
        backward); the block is marked stale and the next forward or materialized() refetches it."""
        blk = self._block_of[id(p)]
        blk.event.synchronize()  # (CUDA) an H2D still reading the store must finish before it changes
        self._store_of[id(p)].copy_(src.reshape(-1))
        blk.stale = True

    def reload_resident(self) -> None:
        """After the stores changed outside a step (load_state_dict): refresh resident device copies."""
        for blk in self.blocks.values():
            if blk.resident and blk.stale:
                self._release(blk)
                self._use(blk)

    def host_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The host store of a flowed parameter, shaped like it (read it; do not write it)."""
        return self._store_of[id(p)].view(p.shape)

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

    def close(self) -> None:
        """Remove the hooks and bring the weights back, so the model is a plain module again. If they no
        longer fit the device, a flowed parameter is left pointing at a host copy (a clear device-mismatch
        error if it is used on the device, never a read of released memory)."""
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
                for p, store in zip(blk.params, blk.stores, strict=True):
                    p.data = store.view(p.shape).clone()  # drops the (partly) resized device storage
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
