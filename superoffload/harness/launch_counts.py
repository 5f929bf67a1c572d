"""What one training step launches, counted: the engine beside plain torch on the same model.

For one step, on the training thread (and the autograd threads that run its backward), per phase (forward,
backward, step):

- `aten_ops`: every aten op a `TorchDispatchMode` sees (other namespaces, such as the optimizer's
  `profiler::` markers, only in the per-name table). The mode is pushed outside the engine's own (the
  simulated device pushes one inside `dev.tracking()`): an inner mode's `func(...)` re-dispatches to the modes
  below it, so this one sees every op the engine's sees, and the ops the engine runs untracked too. Host
  worker threads never see it (dispatch modes are thread-local; autograd's device threads inherit them);
- `launches`: ops that would launch a kernel: those touching device memory (cuda tensors on `cuda`; on `sim`
  every storage the simulator does not hold as host memory; everything on `host` and for torch on the CPU),
  less views, allocations and host<->device copies;
- `copies`: host<->device copies (`copy_`, `_to_copy`, `_foreach_copy_` between the two memories, `.item()`
  of device memory, and `backend.to_host`);
- device calls, by wrapping the engine's device object (`engine.backend`) for the measured step only:
  `event_records` (record), `event_waits` (wait_event), `wait_streams`, `stream_switches` (entries of
  `backend.stream(...)`), `new_events`, and `host_syncs` (sync_event, synchronize, to_host, plus `.item()` of
  device memory and blocking copies between the memories, seen as ops);
- `py_engine` / `py_device`: Python "call" events (`sys.setprofile`) whose code lives under
  superoffload/engine/ or superoffload/device/. Every frame counts, comprehensions and generator resumptions
  included (Python 3.11 counts them as calls; 3.12 inlines list comprehensions, so the same code counts fewer).

Torch's model holds its weights in the training precision, as the engine's device copy does, so both run the
same forward and backward ops and the engine's extra is its own (autocast, as `bench run`'s torch trains, would
add two casts per weight tensor to torch's count; fp16's GradScaler is left out too, since it refuses fp16
gradients); its step is foreach AdamW after `torch.nn.utils.clip_grad_norm_`.
`count_engine_step` / `count_torch_step` run `warmup` uncounted steps first (the engine's first step measures
the gradient-arrival order and builds its buckets), then count one; `compare` puts the two side by side,
per step, per bucket and per parameter tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PHASES = ("forward", "backward", "step")
FIELDS = ("aten_ops", "launches", "copies", "event_records", "event_waits", "wait_streams", "stream_switches",
          "new_events", "host_syncs", "py_engine", "py_device")
PACKAGE = Path(__file__).resolve().parents[1]  # superoffload/
PY_ROOTS = {"py_engine": str(PACKAGE / "engine") + "/", "py_device": str(PACKAGE / "device") + "/"}

# ops that launch no kernel: allocations and storage bookkeeping (views are found by `OpOverload.is_view`)
_NO_KERNEL = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
                        "aten::new_empty_strided", "aten::resize_", "aten::set_", "aten::record_stream",
                        "aten::lift_fresh", "aten::_has_same_storage_numel", "aten::is_same_size"})
_COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::_foreach_copy_"})
_ITEM_OPS = frozenset({"aten::_local_scalar_dense", "aten::item"})
# the device object's methods counted, and the field each call adds to
_DEVICE_CALLS = {"record": ("event_records",), "wait_event": ("event_waits",), "wait_stream": ("wait_streams",),
                 "stream": ("stream_switches",), "new_event": ("new_events",), "sync_event": ("host_syncs",),
                 "synchronize": ("host_syncs",), "to_host": ("host_syncs", "copies")}

Memory = Callable[[torch.Tensor], str]  # "host" or "device"


@dataclasses.dataclass
class Counts:
    """One phase's counts (FIELDS), and its aten ops by name."""

    aten_ops: int = 0
    launches: int = 0
    copies: int = 0
    event_records: int = 0
    event_waits: int = 0
    wait_streams: int = 0
    stream_switches: int = 0
    new_events: int = 0
    host_syncs: int = 0
    py_engine: int = 0
    py_device: int = 0
    ops: Counter[str] = dataclasses.field(default_factory=Counter)

    def __add__(self, other: Counts) -> Counts:
        out = Counts(**{f: getattr(self, f) + getattr(other, f) for f in FIELDS})
        out.ops = self.ops + other.ops
        return out

    def numbers(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in FIELDS}


@dataclasses.dataclass
class PhaseCounts:
    """One counted step of one system: counts per phase, and what a step is made of."""

    system: str  # "superoffload" or "torch"
    phases: dict[str, Counts]
    tensors: int  # trained parameter tensors
    params: int  # their elements
    buckets_host: int = 0
    buckets_device: int = 0
    outcome: dict[str, int] = dataclasses.field(default_factory=dict)  # the engine's step: clipped, rolled back...

    def total(self) -> Counts:
        return sum((self.phases[p] for p in PHASES), Counts())

    def forward_backward(self) -> Counts:
        return self.phases["forward"] + self.phases["backward"]

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "tensors": self.tensors, "params": self.params,
                "buckets_host": self.buckets_host, "buckets_device": self.buckets_device, "outcome": self.outcome,
                "phases": {p: c.numbers() for p, c in self.phases.items()},
                "forward_backward": self.forward_backward().numbers(), "total": self.total().numbers(),
                "ops": {p: dict(self.phases[p].ops.most_common()) for p in PHASES}}


# --- memories ------------------------------------------------------------------------------------------------
def memory_of_backend(backend: Any) -> Memory:
    """Which memory a tensor is in, as the engine's device sees it: on `cuda` by the tensor's device; on the
    simulated device by the simulator's storage registry (host transfer buffers are "host", everything else
    is device memory, the model's activations included); on `host` the host is the device."""
    hb = getattr(backend, "hb", None)
    if getattr(backend, "kind", "") == "sim" and hb is not None and hasattr(hb, "kind_of"):
        def sim(t: torch.Tensor) -> str:
            return "host" if hb.kind_of(_base(t)) == "host" else "device"
        return sim
    return memory_of_device(backend.torch_device)


def memory_of_device(device: torch.device) -> Memory:
    """For a plain model on `device`: a CPU model stands for a device-resident one (all "device")."""
    if device.type == "cpu":
        return lambda t: "device"
    return lambda t: "device" if t.device.type == device.type else "host"


def _base(t: torch.Tensor) -> int:
    """The address of a tensor's storage (0 for one without a storage of its own, such as a subclass)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


# --- the counters --------------------------------------------------------------------------------------------
class _Threads:
    """The threads counted: the one that counts and threads Python did not start (autograd's device threads
    run backward there on a GPU); host worker threads (started with `threading`) are left out."""

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self._seen: dict[int, bool] = {self.owner: True}

    def counted(self) -> bool:
        ident = threading.get_ident()
        ok = self._seen.get(ident)
        if ok is None:
            t = threading._active.get(ident)  # noqa: SLF001 - read only: a Thread object or None
            ok = self._seen[ident] = t is None or isinstance(t, threading._DummyThread)  # noqa: SLF001
        return ok


class _OpCounter(TorchDispatchMode):
    def __init__(self, counts: Counts, memory: Memory, threads: _Threads, inside: list[int]) -> None:
        super().__init__()
        self.counts, self.memory, self.threads, self.inside = counts, memory, threads, inside

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.threads.counted():
            self._count(func, args, kwargs, out)
        return out

    def _count(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        c = self.counts
        name = func._schema.name
        c.ops[name.removeprefix("aten::")] += 1
        if not name.startswith("aten::"):
            return
        c.aten_ops += 1
        if self.inside[0]:  # inside a wrapped device call (to_host): that call counted its copy and sync
            return
        if func.is_view or name in _NO_KERNEL:
            return
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        mem = self.memory
        if name in _ITEM_OPS:
            if ins and mem(ins[0]) == "device":
                c.copies += 1
                c.host_syncs += 1
            return
        if name in _COPY_OPS:
            pairs = _copy_pairs(name, args, kwargs, out)
            if any(mem(src) != mem(dst) for src, dst in pairs):
                c.copies += 1
                non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 and name != "aten::_to_copy"
                                          else False)
                if not non_blocking:  # a blocking copy between the memories waits on the host (CUDA, sim)
                    c.host_syncs += 1
                return
        if any(mem(t) == "device" for t in (*ins, *outs)):
            c.launches += 1


def _copy_pairs(name: str, args: tuple, kwargs: dict, out: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(source, destination) of each copy a copy op makes."""
    if name == "aten::_to_copy":
        return [(args[0], out)]
    dst, src = args[0], args[1] if len(args) > 1 else kwargs["src"]
    if name == "aten::_foreach_copy_":
        return list(zip(src, dst, strict=True))
    return [(src, dst)]


class _PyCalls:
    """`sys.setprofile` counting "call" events by the directory of the code (PY_ROOTS)."""

    def __init__(self, counts: Counts, threads: _Threads) -> None:
        self.counts, self.threads = counts, threads
        self._where: dict[str, str | None] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        field = self._where.get(path, "")
        if field == "":
            field = self._where[path] = next((f for f, root in PY_ROOTS.items()
                                              if str(Path(path).resolve()).startswith(root)), None)
        if field is not None and self.threads.counted():
            setattr(self.counts, field, getattr(self.counts, field) + 1)

    @contextlib.contextmanager
    def installed(self, all_threads: bool) -> Iterator[None]:
        """On this thread; with `all_threads` (Python >= 3.12) on every thread, autograd's device threads
        included, the workers' calls then left out by `_Threads`."""
        every = all_threads and hasattr(threading, "setprofile_all_threads")
        old = sys.getprofile()
        if every:
            threading.setprofile_all_threads(self)
        else:
            sys.setprofile(self)
        try:
            yield
        finally:
            if every:
                threading.setprofile_all_threads(None)
            sys.setprofile(old)


@contextlib.contextmanager
def _device_calls(backend: Any, counts: Counts, threads: _Threads, inside: list[int]) -> Iterator[None]:
    """The backend's methods wrapped to count their calls; the instance's own attributes restored after."""
    saved = {name: backend.__dict__[name] for name in _DEVICE_CALLS if name in backend.__dict__}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*a: Any, **k: Any) -> Any:
            if not threads.counted():
                return fn(*a, **k)
            for field in _DEVICE_CALLS[name]:
                setattr(counts, field, getattr(counts, field) + 1)
            inside[0] += 1
            try:
                return fn(*a, **k)
            finally:
                inside[0] -= 1
        return counted

    for name in _DEVICE_CALLS:
        setattr(backend, name, wrap(name, getattr(backend, name)))
    try:
        yield
    finally:
        for name in _DEVICE_CALLS:
            if name in saved:
                setattr(backend, name, saved[name])
            else:
                delattr(backend, name)


@contextlib.contextmanager
def counting(counts: Counts, memory: Memory, backend: Any | None = None, all_threads: bool = False) -> Iterator[None]:
    """Count what runs inside the block into `counts` (see the module's docstring)."""
    threads = _Threads()
    inside = [0]
    calls = _PyCalls(counts, threads)
    with contextlib.ExitStack() as stack:
        if backend is not None:
            stack.enter_context(_device_calls(backend, counts, threads, inside))
        stack.enter_context(_OpCounter(counts, memory, threads, inside))
        stack.enter_context(calls.installed(all_threads))
        yield


# --- one step of each system ---------------------------------------------------------------------------------
def _phased(phases: Sequence[tuple[str, Callable[[], Any]]], memory: Memory, backend: Any | None,
            all_threads: bool) -> dict[str, Counts]:
    out: dict[str, Counts] = {}
    for name, fn in phases:
        out[name] = Counts()
        with counting(out[name], memory, backend, all_threads):
            fn()
    return out


def _trained(model: torch.nn.Module) -> tuple[int, int]:
    ps = [p for p in model.parameters() if p.requires_grad]
    return len(ps), sum(p.numel() for p in ps)


def count_engine_step(engine: Any, model: torch.nn.Module, batch: Sequence[Any], warmup: int = 2) -> PhaseCounts:
    """`warmup` uncounted steps of `engine` (built over `model`) on `batch` (the model's positional
    arguments; it returns the loss), then one counted: forward (`engine(*batch)`), backward
    (`engine.backward`), step (`engine.step`). The engine is synchronized (uncounted) before and after, so
    what the training thread does does not depend on how far the host worker has got."""
    for _ in range(warmup):
        engine.backward(engine(*batch))
        engine.step()
    engine.synchronize()
    backend = engine.backend
    memory = memory_of_backend(backend)
    all_threads = backend.torch_device.type != "cpu"
    before = dict(engine.stats["speculation"])
    loss: list[Any] = []
    phases = _phased([("forward", lambda: loss.append(engine(*batch))),
                      ("backward", lambda: engine.backward(loss.pop())),
                      ("step", engine.step)], memory, backend, all_threads)
    engine.synchronize()
    stats = engine.stats
    after = stats["speculation"]
    outcome = {k: int(v - before.get(k, 0)) for k, v in after.items()
               if isinstance(v, int) and not isinstance(v, bool) and v != before.get(k, 0)}
    tensors, params = _trained(model)
    return PhaseCounts("superoffload", phases, tensors, params, int(stats["buckets_host"]),
                       int(stats["buckets_device"]), outcome)


def count_torch_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Sequence[Any], clip: float,
                     warmup: int = 2) -> PhaseCounts:
    """The same for plain torch: forward (`model(*batch)`), `loss.backward()`, then step:
    `clip_grad_norm_(clip)` (when clip > 0), `opt.step()` and `opt.zero_grad(set_to_none=True)`. The model is
    taken as given: in the training precision it runs the engine's forward and backward ops, no autocast casts."""
    device = next(model.parameters()).device
    loss: list[torch.Tensor] = []

    def step() -> None:
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    phases = [("forward", lambda: loss.append(model(*batch))), ("backward", lambda: loss.pop().backward()),
              ("step", step)]
    for _ in range(warmup):
        for _, fn in phases:
            fn()
    _sync(device)
    counted = _phased(phases, _torch_memory(device, opt), None, device.type != "cpu")
    _sync(device)
    tensors, params = _trained(model)
    return PhaseCounts("torch", counted, tensors, params)


def _torch_memory(device: torch.device, opt: torch.optim.Optimizer) -> Memory:
    """Torch's memories; on the CPU, standing for a GPU, the optimizer's step counts are host tensors, as
    torch keeps them for a GPU model (foreach and per-tensor AdamW: their `.item()` is no device read)."""
    if device.type != "cpu":
        return memory_of_device(device)
    host = {_base(st["step"]) for st in opt.state.values() if isinstance(st.get("step"), torch.Tensor)}
    host.discard(0)
    return lambda t: "host" if _base(t) in host else "device"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- side by side --------------------------------------------------------------------------------------------
def _per(value: int, n: int) -> float | None:
    return value / n if n else None


def compare(engine: PhaseCounts, torch_: PhaseCounts) -> dict[str, Any]:
    """The engine's counts beside torch's: per step, the engine's extra over torch, and that extra per bucket
    (host and tail buckets together; per host bucket when all are host buckets, per tail bucket when all are
    tail buckets, since one run cannot tell the two kinds' shares apart) and per parameter tensor."""
    host, tail = engine.buckets_host, engine.buckets_device
    buckets = host + tail
    parts = {"forward_backward": (engine.forward_backward(), torch_.forward_backward()),
             "step": (engine.phases["step"], torch_.phases["step"]),
             "total": (engine.total(), torch_.total())}
    out: dict[str, Any] = {"buckets_host": host, "buckets_device": tail, "tensors": engine.tensors}
    for part, (e, t) in parts.items():
        en, tn = e.numbers(), t.numbers()
        extra = {f: en[f] - tn[f] for f in FIELDS}
        out[part] = {
            "engine": en, "torch": tn, "extra": extra,
            "extra_per_bucket": {f: _per(v, buckets) for f, v in extra.items()},
            "extra_per_host_bucket": {f: _per(v, host) for f, v in extra.items()} if not tail else None,
            "extra_per_tail_bucket": {f: _per(v, tail) for f, v in extra.items()} if not host else None,
            "engine_per_tensor": {f: _per(v, engine.tensors) for f, v in en.items()},
            "torch_per_tensor": {f: _per(v, torch_.tensors) for f, v in tn.items()},
        }
    return out
