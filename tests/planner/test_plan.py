"""The planner: choices, reasons, infeasibility, and the explain front end."""

from __future__ import annotations

import argparse
import json

import pytest

from superoffload.options import SHARED_KEYS
from superoffload.planner import explain as explain_mod
from superoffload.planner.explain import explain
from superoffload.planner.plan import Plan, PlanInfeasible, make_plan, saturating_bucket_bytes
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape


def test_plan_for_gh200_13b() -> None:
    hw = get_profile("gh200")
    plan = make_plan(get_shape("gpt-13b"), 1024, 8, hw)
    assert plan.grad_cast == plan.param_cast and plan.grad_cast in ("device", "host")
    assert plan.flow_layers == []  # fits without streaming
    assert 0 < plan.bucket_size <= saturating_bucket_bytes(hw) // 4  # link-curve size, or capped
    assert plan.predicted is not None and plan.predicted.peak_hbm_bytes <= hw.device_hbm_bytes
    assert len(plan.reasons) >= 5 and all(any(ch.isdigit() for ch in r) for r in plan.reasons)
    d = plan.to_dict()
    for key in ("bucket_size", "device_tail_buckets", "grad_cast", "param_cast", "flow_layers", "host_optimizer",
                "rollback_mode"):
        assert key in d
    json.dumps(d)
    assert Plan.from_dict(json.loads(json.dumps(d))) == plan


def test_engine_options_are_engine_config_keys() -> None:
    """The plan hands the engine its own keys and values: a merge, nothing translated or dropped."""
    plan = make_plan(get_shape("gpt-13b"), 1024, 8, get_profile("gh200"))
    opts = plan.engine_options()
    assert set(opts) <= set(SHARED_KEYS)
    assert opts["host_optimizer"] == plan.host_optimizer == "grace"
    assert (opts["bucket_size"], opts["rollback_mode"]) == (plan.bucket_size, plan.rollback_mode)
    assert "grad_cast" not in plan.engine_options(precision="fp32")  # fp32 weights: nothing to cast
    assert plan.options().host_optimizer == plan.host_optimizer


def test_old_plan_blocks_still_load() -> None:
    """Run records written before the shared vocabulary: their plan block reads with the new names."""
    d = make_plan(get_shape("gpt-tiny"), 128, 2, get_profile("cpu")).to_dict()
    old = {k: v for k, v in d.items() if k not in ("bucket_size", "host_optimizer", "rollback_mode", "grad_cast",
                                                   "param_cast", "flow_prefetch")}
    old.update(bucket_size_params=d["bucket_size"], host_adam="graceadam", exact_mode=d["rollback_mode"],
               cast_policy=d["grad_cast"])
    plan = Plan.from_dict(old)
    assert (plan.bucket_size, plan.host_optimizer, plan.rollback_mode) == (d["bucket_size"], "grace",
                                                                          d["rollback_mode"])
    assert plan.grad_cast == plan.param_cast == d["grad_cast"]
    with pytest.raises(ValueError, match="unknown Plan fields"):
        Plan.from_dict({**d, "bucket_sise": 1})


def test_a_calibrated_profile_can_choose_another_host_kernel() -> None:
    from dataclasses import replace

    hw = get_profile("cpu")
    hw = replace(hw, host_adam_gbps={**hw.host_adam_gbps, "cpuadam": 10 * hw.host_adam_gbps["grace"]})
    plan = make_plan(get_shape("gpt-tiny"), 128, 2, hw)
    assert plan.host_optimizer == "cpuadam" and plan.engine_options()["host_optimizer"] == "cpuadam"
    assert plan.reasons[0].startswith("Host Adam kernel: cpuadam")


def test_tight_hbm_budget_makes_layers_flow() -> None:
    hw = get_profile("gh200")
    shape = get_shape("gpt-13b")
    plan = make_plan(shape, 16384, 1, hw, hbm_budget=40e9)
    assert 0 < len(plan.flow_layers) < shape.layers
    assert plan.predicted is not None and plan.predicted.peak_hbm_bytes <= 40e9


def test_infeasible_device_memory_raises_with_bytes() -> None:
    with pytest.raises(PlanInfeasible, match="bytes") as e:
        make_plan(get_shape("gpt-13b"), 16384, 4, get_profile("gh200"), hbm_budget=10e9)
    assert "micro-batch" in str(e.value)


def test_infeasible_host_memory_raises_with_bytes() -> None:
    with pytest.raises(PlanInfeasible, match="host memory needs .* bytes"):
        make_plan(get_shape("gpt-100b"), 2048, 1, get_profile("gh200"))


def test_no_checkpointing_hint() -> None:
    with pytest.raises(PlanInfeasible, match="checkpointing"):
        make_plan(get_shape("gpt-13b"), 32768, 2, get_profile("gh200"), activation_checkpointing=False,
                  hbm_budget=30e9)


def test_explain_prints_plan_and_reasons() -> None:
    out = explain("gpt-13b", 8192, 1, "gh200")
    for needle in ("bucket_size", "device_tail_buckets", "grad_cast", "param_cast", "flow_layers", "Why:",
                   "step time", "host_optimizer", "rollback_mode"):
        assert needle in out
    for old in ("bucket_size_params", "cast_policy", "exact_mode", "graceadam"):  # (host_adam is a stage)
        assert old not in out
    data = json.loads(explain("gpt-1b", 1024, 2, "h100-pcie", json=True))
    assert data["plan"]["reasons"] and data["hardware"]["name"] == "h100-pcie"


def test_add_cli_wires_explain(capsys) -> None:
    parser = argparse.ArgumentParser(prog="superoffload")
    sub = parser.add_subparsers(dest="cmd", required=True)
    explain_mod.add_cli(sub)
    args = parser.parse_args(["explain", "--model", "gpt-2b", "--seq", "1024", "--batch", "2",
                              "--hardware", "gh200", "--no-checkpointing"])
    assert args.func(args) == 0
    assert "no activation checkpointing" in capsys.readouterr().out
    args = parser.parse_args(["explain", "--model", "gpt-13b", "--seq", "16384", "--batch", "4",
                              "--hbm-budget-gb", "10"])
    assert args.func(args) == 2
    assert "infeasible" in capsys.readouterr().err


def test_full_copy_chosen_only_where_it_fits_and_wins():
    """gpt-20b on gh200: the deferred commit pass leaves host work exposed and full_copy (no commit pass)
    is predicted faster, but its 12 B/param do not fit 480 GB; with more host memory it is chosen."""
    from dataclasses import replace

    hw = get_profile("gh200")
    small = make_plan(get_shape("gpt-20b"), 1024, 8, hw)
    assert small.rollback_mode == "deferred"
    big = make_plan(get_shape("gpt-20b"), 1024, 8, replace(hw, host_memory_bytes=2 * hw.host_memory_bytes))
    assert big.rollback_mode == "full_copy"
    assert big.predicted.step_time_s < small.predicted.step_time_s
    assert any("'full_copy' instead" in r for r in big.reasons)
    # where the commit pass hides under the next forward, the 12 B/param are not worth it
    assert make_plan(get_shape("gpt-5b"), 1024, 8, replace(hw, host_memory_bytes=2 * hw.host_memory_bytes)
                     ).rollback_mode == "deferred"


@pytest.mark.parametrize("argv,says", [
    (["--model", "gpt-nope"], "error: unknown model 'gpt-nope'"),
    (["--hardware", "tpu-v9"], "error: unknown hardware 'tpu-v9'"),
    (["--seq", "0"], "error: --seq must be a positive integer, got 0"),
    (["--batch", "-2"], "error: --batch must be a positive integer, got -2"),
    (["--hbm-budget-gb", "0"], "error: --hbm-budget-gb must be > 0"),
    (["--model", "gpt-200b", "--seq", "1024"], "infeasible: gpt-200b: host memory needs"),
])
def test_explain_user_errors_are_one_line_and_exit_2(capsys, argv, says) -> None:
    from superoffload.cli.main import main

    assert main(["explain", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("superoffload explain: ")
    assert says in err


def test_explain_rejects_a_file_that_is_not_a_profile(capsys, tmp_path) -> None:
    from superoffload.cli.main import main

    for name, text in (("garbage.json", "not json"), ("partial.json", '{"name": "x"}'), ("list.json", "[1, 2]")):
        path = tmp_path / name
        path.write_text(text)
        assert main(["explain", "--hardware", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"hardware profile {path}: not a profile" in err


def test_make_plan_rejects_a_non_positive_workload() -> None:
    for seq, batch in ((0, 1), (1024, 0)):
        with pytest.raises(ValueError, match="must be a positive integer"):
            make_plan(get_shape("gpt-1b"), seq, batch, get_profile("gh200"))
