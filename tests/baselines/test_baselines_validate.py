"""Bad configurations fail with a clear ValueError before anything is built; config builders."""

from __future__ import annotations

import pytest

from baselines._deepspeed import build_config, check_deepspeed_version
from baselines.ds_superoffload import DSSuperOffloadSystem
from baselines.fsdp_offload import FSDPOffloadSystem
from baselines.zero_infinity import ZeroInfinitySystem, stage3_base
from baselines.zero_offload import ZeroOffloadSystem
from superoffload.cli.main import main as cli_main
from superoffload.harness import runner
from superoffload.harness.runner import run_benchmark, validate_run
from superoffload.harness.system import RunConfig
from superoffload.harness.systems.torch_system import TorchSystem


def _run(system: str, dtype: str = "fp32", **options) -> RunConfig:
    return RunConfig(system=system, model="gpt-tiny", seq=32, batch=2, steps=1, warmup=0, dtype=dtype,
                     system_options=options)


BAD = [
    ("zero_offload", "fp32", {"bucket_size": 4096}, "no option 'bucket_size'"),
    ("zero_offload", "fp32", {"offload_param": True}, "zero_infinity"),
    ("zero_offload", "fp32", {"reduce_bucket_size": 0}, "positive integer"),
    ("zero_infinity", "fp32", {"offload_param": "maybe"}, "true or false"),
    ("zero_infinity", "fp32", {"ratio": 0.5}, "no option 'ratio'"),
    ("ds_superoffload", "fp32", {"ratio": 1.5}, r"in \[0, 1\]"),
    ("ds_superoffload", "fp32", {"ratio": -0.1}, r"in \[0, 1\]"),
    ("ds_superoffload", "fp32", {"ratio": "high"}, "number"),
    ("ds_superoffload", "fp32", {"cpuadam_cores_perc": 0}, r"in \(0, 1\]"),
    ("ds_superoffload", "fp32", {"overlap_comm": "sometimes"}, "true or false"),
    ("fsdp_offload", "fp16", {}, "fp16"),
    ("fsdp_offload", "fp32", {"offload_param": True}, "no option 'offload_param'"),
    ("torch", "fp32", {"bucket_size": 4}, r"system 'torch' has no option 'bucket_size' \(options: none\)"),
]


@pytest.mark.parametrize(("system", "dtype", "options", "message"), BAD,
                         ids=[f"{s}-{'-'.join(o) or d}" for s, d, o, _ in BAD])
def test_bad_config_is_a_value_error_before_any_work(system, dtype, options, message, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("a model was built before validation failed")

    monkeypatch.setattr(runner, "build_model", no_build)
    run = _run(system, dtype, **options)
    with pytest.raises(ValueError, match=message):
        validate_run(run)
    with pytest.raises(ValueError, match=message):  # run_benchmark raises too, instead of a record
        run_benchmark(run)


@pytest.mark.parametrize("system", ["torch", "zero_offload", "zero_infinity", "ds_superoffload", "fsdp_offload"])
def test_harness_options_are_accepted(system, tmp_path):
    data = tmp_path / "tokens.bin"
    data.write_bytes(b"\0" * 1024)
    validate_run(_run(system, data=str(data), data_dtype="uint16"))


def test_good_options_parse():
    assert DSSuperOffloadSystem.validate(_run("ds_superoffload", ratio=0, cpuadam_cores_perc=1,
                                              offload_param="true")) == \
        {"ratio": 0.0, "cpuadam_cores_perc": 1.0, "offload_param": True}
    assert ZeroInfinitySystem.validate(_run("zero_infinity", offload_param=False)) == {"offload_param": False}
    assert ZeroOffloadSystem.validate(_run("zero_offload", reduce_bucket_size=5e8)) == \
        {"reduce_bucket_size": 500_000_000}


def test_deepspeed_version_range():
    for ok in ("0.19.5", "0.19.8", "0.19.12+abc"):
        check_deepspeed_version(ok)
    for bad in ("0.18.9", "0.19.4", "0.20.0", "1.0.0"):
        with pytest.raises(RuntimeError, match="supported range"):
            check_deepspeed_version(bad)


def test_config_sets_moved_defaults_explicitly():
    run = RunConfig(grad_clip=0.0, dtype="fp16", batch=3, grad_accum=2)
    cfg = build_config(run, stage3_base(False, offload_param=False, resident=True), world=2)
    assert cfg["gradient_clipping"] == 0.0  # DeepSpeed's default is 1.0 since 0.19.3
    assert cfg["train_batch_size"] == 12 and cfg["train_micro_batch_size_per_gpu"] == 3
    assert cfg["fp16"]["enabled"] and cfg["fp16"]["loss_scale"] == 0 and not cfg["bf16"]["enabled"]
    assert cfg["optimizer"]["type"] == "AdamW"
    zero = cfg["zero_optimization"]
    for key in ("overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "sub_group_size",
                "contiguous_gradients", "round_robin_gradients"):
        assert key in zero
    assert zero["offload_optimizer"]["pin_memory"] is False and "offload_param" not in zero
    assert zero["stage3_param_persistence_threshold"] == 10**12
    offl = stage3_base(True, offload_param=True, resident=False)
    assert offl["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert offl["stage3_param_persistence_threshold"] == 100_000


OWN_SYSTEMS = {"torch": TorchSystem, "zero_offload": ZeroOffloadSystem, "zero_infinity": ZeroInfinitySystem,
               "ds_superoffload": DSSuperOffloadSystem, "fsdp_offload": FSDPOffloadSystem}


@pytest.mark.parametrize("system", sorted(OWN_SYSTEMS))
def test_every_adapter_names_itself_and_its_options_for_an_unknown_key(system):
    """An option a system does not use is an error whose one line says which system and what it takes."""
    cls = OWN_SYSTEMS[system]
    valid = ", ".join(sorted(cls.OPTIONS)) or "none"
    with pytest.raises(ValueError) as e:
        validate_run(_run(system, not_an_option=1))
    assert str(e.value) == f"system {system!r} has no option 'not_an_option' (options: {valid})"


def test_cli_rejects_an_unused_option_before_building_a_model(tmp_path, capsys, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("a model was built before the option was checked")

    monkeypatch.setattr(runner, "build_model", no_build)
    out = tmp_path / "r.json"
    argv = ["bench", "run", "--system", "torch", "--model", "gpt-tiny", "-o", "bucket_size=4", "--out", str(out)]
    try:
        rc = cli_main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["superoffload bench run: error: system 'torch' has no option 'bucket_size' (options: none)"]
