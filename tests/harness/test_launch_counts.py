"""The launch counters (superoffload/harness/launch_counts.py) and their benchmark (benchmarks/launch_costs.py).

The counts are the budget the engine's launch path is held to, so each counter is checked against something
known: torch's optimizer step grows by a fixed number of ops per tensor without foreach and launches the same
kernels for any tensor count with it; a mode pushed outside another mode sees every op the inner one sees;
a device call is counted on the training thread and not on a worker's; a planted Python function's calls are
counted, comprehension frames included, and nothing outside the counted folders is. The engine's counts on the
simulated device repeat exactly, and the benchmark writes them as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import superoffload
from superoffload.device.base import HostDevice
from superoffload.harness import launch_counts as lc
from superoffload.harness.data import SyntheticData
from superoffload.harness.models import build_model, get_shape

ROOT = Path(__file__).resolve().parents[2]
SEQ = 8
CFG = {"device": "sim", "precision": "bf16", "grad_clip": 1.0, "bucket_size": 65536, "device_tail_buckets": 2,
       "optimizer": {"lr": 1e-4, "weight_decay": 0.1}, "host_threads": 1}


@pytest.fixture(autouse=True)
def _one_thread():
    """One compute thread, as the benchmark on the CPU (bf16 ops with two on a busy 2-core machine crawl)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return SyntheticData(get_shape("gpt-tiny").vocab, SEQ, 1, seed=1).micro_batch(0, 0)


def _benchmark():  # noqa: ANN202 - a module loaded from its path (benchmarks/ is no package)
    spec = importlib.util.spec_from_file_location("launch_costs", ROOT / "benchmarks" / "launch_costs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _engine_counts() -> lc.PhaseCounts:
    model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=0)
    engine = superoffload.initialize(model, CFG)
    try:
        return lc.count_engine_step(engine, model, _batch())
    finally:
        engine.close()


class _Linears(torch.nn.Module):
    """`n` bias-free 4x4 linear layers, returning a scalar loss as the zoo's models do."""

    def __init__(self, n: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4, bias=False) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.square().sum()


def _torch_step_counts(n: int, foreach: bool) -> lc.Counts:
    model = _Linears(n)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    return lc.count_torch_step(model, opt, (torch.randn(2, 4),), clip=1.0, warmup=1).phases["step"]


def test_torch_step_ops_grow_per_tensor_without_foreach_and_launch_alike_with_it() -> None:
    per_tensor = [_torch_step_counts(n, foreach=False) for n in (1, 2, 4)]
    a, b, c = (s.aten_ops for s in per_tensor)
    assert b - a > 0 and c - b == 2 * (b - a), (a, b, c)  # linear in the tensor count
    fused = [_torch_step_counts(n, foreach=True) for n in (1, 2, 4)]
    assert len({s.launches for s in fused}) == 1 and fused[0].launches > 0, [s.launches for s in fused]
    # the per-tensor `.item()` of foreach AdamW's step counts (host tensors, as torch keeps them for a GPU
    # model) are ops, but neither launches nor host syncs
    assert fused[2].ops["_local_scalar_dense"] > fused[0].ops["_local_scalar_dense"]
    assert all(s.host_syncs == 0 and s.copies == 0 for s in fused)


def test_a_mode_outside_another_sees_every_op_the_inner_one_sees() -> None:
    class Inner(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            Inner.n += 1
            return func(*args, **(kwargs or {}))

    counts = lc.Counts()
    with lc.counting(counts, lc.memory_of_device(torch.device("cpu"))), Inner():
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
    assert Inner.n > 0 and counts.aten_ops == Inner.n


def test_views_allocations_copies_and_syncs_are_told_apart_from_launches() -> None:
    host, dev, other = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    hosts = {lc._base(host)}  # `host`'s storage stands for host memory, every other for device memory
    counts = lc.Counts()
    with lc.counting(counts, lambda t: "host" if lc._base(t) in hosts else "device"):
        dev.view(2, 2).t()                   # views: ops, no launch
        torch.empty(3)                       # an allocation
        dev.add_(1)                          # a launch
        dev.copy_(host, non_blocking=True)   # host -> device, asynchronous: a copy
        host.copy_(dev)                      # device -> host, blocking: a copy and a host sync
        torch._foreach_copy_([other], [dev])  # device -> device: a launch
        dev.sum().item()                     # a launch (sum), then a read of device memory on the host
        host[0].item()                       # a view and a host value's read: ops, nothing more
    assert counts.launches == 3 and counts.copies == 3 and counts.host_syncs == 2, counts
    assert counts.aten_ops == sum(counts.ops.values()) == 11, counts.ops


def test_device_calls_are_counted_on_the_training_thread_only_and_unwrapped_after() -> None:
    dev = HostDevice()
    counts = lc.Counts()
    value = torch.ones(2)
    with lc.counting(counts, lc.memory_of_backend(dev), dev):
        ev, s = dev.new_event(), dev.current_stream()
        dev.record(ev, s, "p")
        dev.wait_event(s, ev, "p")
        with dev.stream(s):
            dev.to_host(value)
        worker = threading.Thread(target=dev.record, args=(ev, s, "p"))
        worker.start()
        worker.join()
    assert (counts.new_events, counts.event_records, counts.event_waits, counts.stream_switches) == (1, 1, 1, 1)
    assert counts.host_syncs == 1 and counts.copies == 1 and counts.launches == 0  # to_host: its copy
    assert not set(lc._DEVICE_CALLS) & set(vars(dev))  # the class's methods again


def test_the_python_call_counter_counts_a_planted_function(tmp_path: Path, monkeypatch) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def leaf():\n    return 1\n\n\ndef caller():\n    return sum([leaf() for _ in range(3)])\n")
    spec = importlib.util.spec_from_file_location("planted_mod", planted)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(lc.PY_ROOTS, "py_engine", str(tmp_path.resolve()) + "/")
    counts = lc.Counts()
    with lc.counting(counts, lc.memory_of_device(torch.device("cpu"))):
        mod.caller()
        json.dumps({"not": "counted"})  # stdlib frames are no one's
        worker = threading.Thread(target=mod.leaf)
        worker.start()
        worker.join()
    # caller, 3 x leaf, and (Python 3.11) the list comprehension's own frame; the worker's leaf is not counted
    assert counts.py_engine == (5 if sys.version_info < (3, 12) else 4), counts.py_engine
    assert counts.py_device == 0


def test_engine_counts_on_sim_repeat_exactly_and_include_the_models_ops() -> None:
    first, second = _engine_counts(), _engine_counts()
    assert first.buckets_host >= 1 and first.buckets_device == 2
    for phase in lc.PHASES:
        assert first.phases[phase].numbers() == second.phases[phase].numbers(), phase
        assert first.phases[phase].ops == second.phases[phase].ops, phase
    model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=0).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    plain = lc.count_torch_step(model, opt, _batch(), clip=1.0)
    # the engine's mode (the simulator's) sits inside ours: every op the model runs is still seen
    for phase in ("forward", "backward"):
        missing = plain.phases[phase].ops - first.phases[phase].ops
        assert not missing, (phase, missing)
    cmp = lc.compare(first, plain)
    assert cmp["total"]["engine"]["py_engine"] > 0 and cmp["total"]["torch"]["py_engine"] == 0
    assert cmp["forward_backward"]["extra_per_host_bucket"] is None  # mixed: only the per-bucket mean
    fb = cmp["forward_backward"]
    assert fb["extra_per_bucket"]["aten_ops"] == fb["extra"]["aten_ops"] / (first.buckets_host + 2)


def test_the_benchmark_writes_its_counts_as_json(tmp_path: Path) -> None:
    bench = _benchmark()
    out = tmp_path / "lc.json"
    rc = bench.main(["--device", "sim", "--model", "gpt-tiny", "--seq", str(SEQ), "--batch", "1", "--precision",
                     "bf16", "--bucket-size", "65536", "--steps", "2", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and data["steady"] is True and data["kernels"] == "torch"
    assert data["buckets_host"] > 1 and data["buckets_device"] == 0 and data["tensors"] == 52
    assert data["engine_aten_ops_per_step"] == sum(p["aten_ops"] for p in data["engine"]["phases"].values())
    assert data["torch_aten_ops_per_step"] == data["torch"]["total"]["aten_ops"] > 0
    assert set(data["compare"]) >= {"forward_backward", "step", "total"}
    assert data["provenance"]["torch"] == torch.__version__ and data["command"].endswith(str(out))
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--device", "tpu"]])
def test_the_benchmark_refuses_bad_arguments(argv: list[str], tmp_path: Path) -> None:
    bench = _benchmark()
    with pytest.raises(SystemExit) as e:
        bench.main([*argv, "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and not (tmp_path / "x.json").exists()
