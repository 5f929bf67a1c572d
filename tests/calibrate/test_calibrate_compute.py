"""Profiled compute (calibrate --workloads): parsing, the block/top split, validate's two predictions,
and calibrate's thread setting and CLI checks."""

from __future__ import annotations

import dataclasses

import pytest

from superoffload.calibrate import compute as cc
from superoffload.calibrate.accuracy import compare, format_rows
from superoffload.calibrate.threads import set_threads
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig
from superoffload.planner.hardware import shape_signature, workload_key
from superoffload.planner.presets import get_profile
from superoffload.shapes import ModelShape

TOY = ModelShape(name="gpt-tiny", layers=3, hidden=32, heads=2, vocab=64, ffn_hidden=128, max_seq=64)


def _entry(shape: ModelShape, dtype: str = "fp32", **over: float) -> dict:
    return {"shape": shape_signature(shape), "dtype": dtype, "device": "cpu", "block_fwd_s": 0.01,
            "block_bwd_s": 0.03, "top_fwd_s": 0.005, "top_bwd_s": 0.007, **over}


def test_parse_workloads() -> None:
    assert cc.parse_workloads("gpt-tiny:128:2, gpt-small:64:1") == [("gpt-tiny", 128, 2), ("gpt-small", 64, 1)]
    for bad, says in [("gpt-tiny:128", "MODEL:SEQ:BATCH"), ("gpt-tiny:x:2", "integers"),
                      ("gpt-tiny:0:2", ">= 1"), (" , ", "empty")]:
        with pytest.raises(ValueError, match=says):
            cc.parse_workloads(bad)


def test_check_workloads_rejects_unknown_and_too_large_models() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        cc.check_workloads([("no-such-model", 128, 2)], "fp32")
    with pytest.raises(ValueError, match="GiB to profile"):
        cc.check_workloads([("gpt-70b", 128, 1)], "fp32", memory_bytes=2**30)
    with pytest.raises(ValueError, match="dtype"):
        cc.check_workloads([("gpt-tiny", 128, 2)], "int8")
    # a deep model is profiled at MAX_PROFILED_LAYERS blocks, so only those count against memory
    big = cc.check_workloads([("gpt-13b", 128, 1)], "fp32", memory_bytes=40 * 2**30)
    assert big["gpt-13b"].layers > cc.MAX_PROFILED_LAYERS


@pytest.mark.parametrize("layers", [1, 3])
def test_profile_splits_block_and_top_consistently(layers: int) -> None:
    shape = dataclasses.replace(TOY, layers=layers)
    e = cc.profile_workload(shape, 16, 2, "cpu", "fp32")
    assert e["shape"] == shape_signature(shape) and e["dtype"] == "fp32"
    for k in ("block_fwd_s", "block_bwd_s", "top_fwd_s", "top_bwd_s"):
        assert e[k] >= 0
    deep = e["profiled_layers"][0]
    if e["block_fwd_s"] > 0 and e["top_fwd_s"] > 0:  # no clamping: the split adds up to the deep model
        assert deep * e["block_fwd_s"] + e["top_fwd_s"] == pytest.approx(e["model_fwd_s"], rel=1e-9)


def test_validate_reports_profiled_and_op_model_predictions() -> None:
    rec = run_benchmark(RunConfig(system="torch", model="gpt-tiny", seq=16, batch=2, steps=2, warmup=1, threads=1))
    from superoffload.shapes import get_shape

    shape = get_shape("gpt-tiny")
    hw = dataclasses.replace(get_profile("cpu"), compute_profiles={
        workload_key("gpt-tiny", 16, 2): _entry(shape, block_fwd_s=1.0, block_bwd_s=2.0)})
    (row,) = compare([rec], hw)
    assert row["compute"] == "profiled" and row["predicted_s"] > shape.layers * 3.0
    assert row["op_model_s"] < 1.0  # the op-level prediction ignores the (absurd) profile
    assert row["op_model_rel_error"] == row["op_model_s"] / row["measured_s"] - 1
    assert "op-level compute only" in format_rows([row], hw.name)


def test_calibrate_threads_are_checked_and_applied() -> None:
    import torch

    with pytest.raises(ValueError, match="--threads must be >= 1"):
        set_threads(0)
    grace_adam = pytest.importorskip("grace_adam")
    before = torch.get_num_threads(), grace_adam.get_num_threads()
    try:
        set_threads(1)  # both pools: the rates calibrate measures are those of the runs' thread count
        assert (torch.get_num_threads(), grace_adam.get_num_threads()) == (1, 1)
    finally:
        torch.set_num_threads(before[0])
        grace_adam.set_num_threads(before[1])


def test_calibrate_cli_rejects_bad_workloads_before_measuring(capsys) -> None:
    import argparse

    from superoffload.calibrate import machine as cal

    sub = argparse.ArgumentParser().add_subparsers()
    cal.add_cli(sub)
    args = sub.choices["calibrate"].parse_args(["--workloads", "gpt-tiny:128", "--quick"])
    assert args.func(args) == 2
    assert "MODEL:SEQ:BATCH" in capsys.readouterr().err


def test_calibrate_cli_rejects_a_bad_dtype_before_measuring(capsys) -> None:
    import argparse

    from superoffload.calibrate import machine as cal

    sub = argparse.ArgumentParser().add_subparsers()
    cal.add_cli(sub)
    for extra in (["--workloads", "gpt-tiny:16:2"], []):  # with or without workloads to profile
        args = sub.choices["calibrate"].parse_args([*extra, "--dtype", "fp32,int8", "--quick"])
        assert args.func(args) == 2
        assert "--dtype" in capsys.readouterr().err


def test_workloads_are_profiled_in_each_precision_asked_for() -> None:
    assert cc.parse_dtypes("fp32, bf16,fp32") == ["fp32", "bf16"]
    profiles = cc.profile_workloads([("gpt-tiny", 16, 2)], "cpu", "fp32,bf16")
    # fp32 keeps the key profiles had before they held several precisions; bf16 gets its own
    assert set(profiles) == {workload_key("gpt-tiny", 16, 2), workload_key("gpt-tiny", 16, 2, "bf16")}
    assert workload_key("gpt-tiny", 16, 2, "bf16") == "gpt-tiny:s16:b2:bf16"
    assert [profiles[k]["dtype"] for k in sorted(profiles)] == ["fp32", "bf16"]


def test_a_bf16_profile_times_the_model_as_the_engine_trains_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 weights and no autocast (the engine's `place_in_precision`), not fp32 weights cast per op under
    autocast: what the forward saw is recorded by a hook on the harness's model."""
    import torch

    import superoffload.harness.models as hm

    seen: list[tuple[set, bool]] = []
    build = hm.build_model

    def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda m, a: seen.append(
            ({p.dtype for p in m.parameters()}, torch.is_autocast_enabled("cpu"))))
        return model

    monkeypatch.setattr(hm, "build_model", recording)
    cc.profile_workload(TOY, 16, 2, "cpu", "bf16")
    assert seen and all(dtypes == {torch.bfloat16} and not autocast for dtypes, autocast in seen)
    seen.clear()
    cc.profile_workload(TOY, 16, 2, "cpu", "fp32")
    assert seen and all(dtypes == {torch.float32} and not autocast for dtypes, autocast in seen)
