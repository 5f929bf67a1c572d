"""Runner statistics, records (ok / oom / error), bad input, CLI."""

import dataclasses
import json
import sys

import pytest
import torch

import grace_adam
from superoffload.cli.main import main as cli_main
from superoffload.harness import record
from superoffload.harness.runner import run_benchmark, validate_run
from superoffload.harness.stats import percentile, summarize
from superoffload.harness.system import RunConfig
from superoffload.harness.systems import SYSTEMS
from tests import _watchdog as watchdog


def test_percentile_and_summary():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 10) == pytest.approx(1.3)
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median_s"] == 3.0 and s["min_s"] == 1.0 and s["max_s"] == 5.0
    assert s["p10_s"] == pytest.approx(1.4) and s["iqr_s"] == pytest.approx(2.0)


def test_torch_run_record_is_valid_and_excludes_warmup():
    run = RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2, steps=4, warmup=2, threads=1)
    rec = run_benchmark(run)
    record.validate(rec)
    assert rec["status"] == "ok", rec["error"]
    assert len(rec["losses"]) == 6
    assert len(rec["timing"]["step_times_s"]) == 4 and len(rec["timing"]["warmup_times_s"]) == 2
    tp = rec["throughput"]
    assert tp["tokens_per_s"] == pytest.approx(2 * 32 / rec["timing"]["median_s"])
    assert 0 < tp["mfu"] <= tp["hfu"]
    assert rec["provenance"]["torch"] == torch.__version__
    assert rec["provenance"]["grace_adam"] == grace_adam.isa()  # "torch" when the native kernel is not built
    assert rec["losses"][-1] < rec["losses"][0]  # it trains


def test_same_seed_same_losses():
    run = RunConfig(system="torch", model="gpt-tiny", seq=16, batch=2, steps=3, warmup=0, threads=1)
    a, b = run_benchmark(run), run_benchmark(run)
    assert a["losses"] == b["losses"]


class _ExplodingSystem:
    name = "explode"

    def __init__(self, exc):
        self.exc = exc

    def setup(self, model, shape, run):
        pass

    def step(self, batch):
        raise self.exc

    def stats(self):
        return {}

    def teardown(self):
        pass


@pytest.mark.parametrize("exc,status", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    (MemoryError(), "oom"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes. "
                  "Error code 12 (Cannot allocate memory) out of memory"), "oom"),
    (ValueError("boom in step"), "error"),
])
def test_failures_become_records(monkeypatch, exc, status):
    import superoffload.harness.runner as runner

    monkeypatch.setattr(runner, "create_system", lambda name: _ExplodingSystem(exc))
    rec = run_benchmark(RunConfig(system="torch", model="gpt-tiny", seq=16, batch=1, steps=1, warmup=0))
    record.validate(rec)
    assert rec["status"] == status
    assert rec["timing"] is None and rec["throughput"] is None
    assert type(exc).__name__ in rec["error"]


@pytest.mark.parametrize("kw,msg", [
    ({"system": "nope"}, "unknown system"),
    ({"model": "gpt-999b"}, "unknown model"),
    ({"precision": "fp8"}, "precision must be one of"),
    ({"dtype": "fp8"}, "precision must be one of"),  # the old name of RunConfig.precision
    ({"seq": 0}, "seq must be >= 1"),
    ({"warmup": -1}, "warmup"),
    ({"grad_clip": -1.0}, "grad_clip"),
    ({"betas": (0.9, 1.5)}, "betas"),
    ({"init_device": "gpu"}, "init_device must be one of host, cuda"),
])
def test_validate_rejects_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        validate_run(RunConfig(**kw))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_init_device_cuda_needs_a_gpu():
    with pytest.raises(ValueError, match="--init-device cuda needs a CUDA device"):
        validate_run(RunConfig(init_device="cuda"))


@pytest.mark.cuda
def test_init_on_the_gpu_hands_the_system_a_host_model_with_the_same_weights_each_time():
    from superoffload.harness.runner import _initial_model

    run = RunConfig(system="torch", model="gpt-tiny", seq=32, init_device="cuda")
    shape = validate_run(run)
    a, b = _initial_model(run, shape), _initial_model(run, shape)
    assert all(p.device.type == "cpu" for p in a.parameters())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    rec = run_benchmark(dataclasses.replace(run, steps=2, warmup=1, device="cuda"))
    assert rec["status"] == "ok", rec["error"]
    assert rec["run"]["init_device"] == "cuda"


def test_every_registered_system_name_is_valid():
    for name in SYSTEMS:
        validate_run(RunConfig(system=name))


def test_cli_writes_valid_record(tmp_path, capsys):
    out = tmp_path / "r" / "x.json"
    rc = cli_main(["bench", "run", "--system", "torch", "--model", "gpt-tiny", "--seq", "32", "--batch", "2",
                   "--steps", "3", "--warmup", "1", "--threads", "1", "--out", str(out), "--no-progress"])
    assert rc == 0
    rec = json.loads(out.read_text())
    record.validate(rec)
    line = capsys.readouterr().out
    assert "tok/s" in line and "MFU" in line and "TFLOPS" in line
    assert not list(out.parent.glob(".*.tmp"))  # atomic write left no temp file


@pytest.mark.parametrize("argv,msg", [
    (["--system", "nope", "--model", "gpt-tiny"], "invalid choice: 'nope'"),
    (["--system", "torch", "--model", "gpt-nope"], "invalid choice: 'gpt-nope'"),
    (["--system", "torch", "--model", "gpt-tiny", "--seq", "0"], "expected a positive integer"),
    (["--system", "torch", "--model", "gpt-tiny", "--grad-clip", "-1"], "expected a number >= 0"),
    (["--system", "torch", "--model", "gpt-tiny", "--dtype", "fp8"], "invalid choice: 'fp8'"),
    (["--system", "torch", "--model", "gpt-tiny", "-o", "novalue"], "expected KEY=VALUE"),
])
def test_cli_rejects_bad_input_before_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "run", *argv, "--out", str(out)])
    assert e.value.code == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_cli_missing_data_file(tmp_path, capsys):
    rc = cli_main(["bench", "run", "--system", "torch", "--model", "gpt-tiny", "--data", str(tmp_path / "no.bin"),
                   "--out", str(tmp_path / "x.json")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_cli_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "run", "--help"])
    text = capsys.readouterr().out
    for opt in ("--system", "--model", "--seq", "--batch", "--steps", "--dtype", "--seed", "--warmup",
                "--grad-clip", "--threads", "--out", "--checkpointing", "--device"):
        assert opt in text


def test_console_script_module_runs():
    r = watchdog.run([sys.executable, "-m", "superoffload", "bench", "run", "--help"])
    assert r.returncode == 0 and "--system" in r.stdout


# ------------------------------------------------------------------ memory: fail fast, in one line
@pytest.mark.parametrize("system", ["torch", "superoffload"])
def test_cli_refuses_a_model_this_machine_cannot_hold(tmp_path, capsys, system):
    """gpt-200b needs terabytes: bench run says so in one line (GiB needed vs available) before building."""
    import time

    out = tmp_path / "x.json"
    t0 = time.perf_counter()
    rc = cli_main(["bench", "run", "--system", system, "--model", "gpt-200b", "--out", str(out), "--no-progress"])
    assert rc == 2 and time.perf_counter() - t0 < 30
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("superoffload bench run: error: ")
    assert f"{system} on gpt-200b" in err and "GiB of host memory" in err and "GiB is available" in err
    assert not out.exists()


def test_check_memory_against_given_availability():
    from superoffload.cli.bench_run import check_memory
    from superoffload.shapes import get_shape

    run = RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2)
    check_memory(run, get_shape("gpt-tiny"), host_available=2**30)  # ~20 MB needed
    with pytest.raises(ValueError, match=r"needs about \d+ MiB of host memory .* but 1 MiB is available"):
        check_memory(run, get_shape("gpt-tiny"), host_available=2**20)
    # a system the planner does not model: fp32 weights, gradients and Adam state against host memory
    other = RunConfig(system="my_system", model="gpt-small")
    need = 16 * get_shape("gpt-small").total_params()
    check_memory(other, get_shape("gpt-small"), host_available=need + 1)
    with pytest.raises(ValueError, match="fp32 weights, gradients and Adam state"):
        check_memory(other, get_shape("gpt-small"), host_available=need - 1)


def test_check_memory_with_a_gpu_uses_the_device_free_memory(monkeypatch):
    """With CUDA the device's free memory bounds what stays on it; SuperOffload's plan may flow weights."""
    from superoffload.cli.bench_run import check_memory
    from superoffload.shapes import get_shape

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    shape = get_shape("gpt-13b")
    run = RunConfig(system="torch", model="gpt-13b", seq=1024, batch=1, dtype="bf16", device="cuda")
    with pytest.raises(ValueError, match="GiB of device memory"):
        check_memory(run, shape, host_available=2**40, device_available=80 * 2**30)
    so = dataclasses.replace(run, system="superoffload")
    check_memory(so, shape, host_available=2**40, device_available=80 * 2**30)  # bf16 weights fit
    check_memory(so, shape, host_available=2**40, device_available=20 * 2**30)  # some layers flow
    with pytest.raises(ValueError, match="GiB of device memory"):
        check_memory(so, shape, host_available=2**40, device_available=2 * 2**30)
    with pytest.raises(ValueError, match="GiB of host memory"):
        check_memory(so, shape, host_available=100 * 2**30, device_available=80 * 2**30)
