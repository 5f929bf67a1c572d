"""`superoffload bench adam`: one record with every kernel on shared buffers and both host-phase groups."""

import json

import pytest

import grace_adam.pool
from superoffload.cli.main import main as cli_main
from superoffload.harness import record

SPECULATIVE = {"grace_double_buffer", "grace_deferred_commit", "torch_fused_separate_undo"}
VALIDATE_FIRST = {"grace_validate_first", "torch_fused_separate"}


def test_bench_adam_record(tmp_path, capsys):
    out = tmp_path / "adam.json"
    assert cli_main(["bench", "adam", "--numel", "40K", "--threads", "1", "--repeats", "2", "--out", str(out)]) == 0
    rec = record.read_result(out, "adam_bench")  # validated against adam_bench.schema.json
    assert rec["kind"] == "adam_bench" and rec["schema_version"] == 1
    (m,) = rec["measurements"]
    assert m["numel"] == 40 << 10 and m["threads"] == 1
    assert {"grace_adam", "roofline_stream7", "torch_fused", "torch_foreach"} <= set(m["kernels"])
    for k in m["kernels"].values():
        assert k["median_s"] > 0 and k["gb_per_s"] > 0 and k["speedup_vs_best_peer"] > 0
    hp = m["host_phase"]
    assert {n for n, h in hp.items() if h["group"] == "speculative"} >= SPECULATIVE
    assert {n for n, h in hp.items() if h["group"] == "validate_first"} >= VALIDATE_FIRST
    for group in ("speculative", "validate_first"):
        # each group's ratios are against the fastest separate sequence of that same group
        best = max(h["speedup_vs_best_separate"] for n, h in hp.items()
                   if h["group"] == group and not n.startswith("grace"))
        assert best == pytest.approx(1.0)
    assert "host:speculative:grace_double_buffer" in capsys.readouterr().out


def test_bench_adam_thread_scaling(tmp_path, capsys, monkeypatch):
    """`--threads 1,2`: GB/s per thread count beside torch fused's and DeepSpeed's, the ratio to the best,
    and a count above the usable CPUs marked oversubscribed (the CPU count is lowered to 1 so that 2 is);
    also the --pin and --first-touch paths, in the same run."""
    from superoffload.harness.microbench import adam

    monkeypatch.setattr(adam, "usable_cpus", lambda: 1)
    out = tmp_path / "adam.json"
    assert cli_main(["bench", "adam", "--numel", "40K", "--threads", "1,2", "--repeats", "2", "--pin",
                     "--first-touch", "--out", str(out)]) == 0
    rec = record.read_result(out, "adam_bench")  # validated against adam_bench.schema.json
    assert rec["usable_cpus"] == 1 and rec["first_touch"] is True
    assert rec["grace_division"] == grace_adam._backend.division_mode()
    assert rec["grace_prefetch"] == grace_adam._backend.get_prefetch()
    assert [(m["threads"], m["oversubscribed"]) for m in rec["measurements"]] == [(1, False), (2, True)]
    assert all(m["grace_pinned"] is grace_adam.pool.pinning_supported() for m in rec["measurements"])
    lines = capsys.readouterr().out.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("GB/s at 28 B/param by thread count")))
    assert "(1 usable CPUs; GraceAdam pool" in lines[head] and "first touch by its threads" in lines[head]
    assert ("divides through the reciprocal" in lines[head]) is (rec["grace_division"] == "reciprocal")
    assert lines[head + 1].split() == ["numel", "thr", "grace_adam", "torch_fused", "deepspeed", "grace/best"]
    for m, row in zip(rec["measurements"], lines[head + 2:head + 4], strict=True):
        ks, cells = m["kernels"], row.split()
        assert [int(cells[0]), int(cells[1])] == [40 << 10, m["threads"]]
        assert float(cells[2]) == pytest.approx(ks["grace_adam"]["gb_per_s"], abs=0.051)
        assert float(cells[3]) == pytest.approx(ks["torch_fused"]["gb_per_s"], abs=0.051)
        if "deepspeed_cpu_adam" in ks:
            assert float(cells[4]) == pytest.approx(ks["deepspeed_cpu_adam"]["gb_per_s"], abs=0.051)
        else:
            assert cells[4] == "skipped"
        assert cells[5] == f"{ks['grace_adam']['speedup_vs_best_peer']:.2f}x"
        assert ("oversubscribed (2 threads > 1 CPUs)" in row) is m["oversubscribed"]


@pytest.mark.parametrize("args", [["--numel", "12Q"], ["--numel", "0"], ["--threads", "0"], ["--repeats", "0"]])
def test_bench_adam_rejects_bad_input(tmp_path, capsys, args):
    out = tmp_path / "a.json"
    assert cli_main(["bench", "adam", *args, "--out", str(out)]) == 2
    assert "error" in capsys.readouterr().err
    assert not out.exists()


def _valid_record() -> dict:
    timing = {"median_s": 0.01, "mean_s": 0.01, "std_s": 0.0, "p10_s": 0.01, "p90_s": 0.01, "iqr_s": 0.0,
              "min_s": 0.01, "max_s": 0.01}
    kernel = {**timing, "gb_per_s": 1.0, "pct_roofline": 50.0, "speedup_vs_best_peer": 1.0}
    hp = {**timing, "speedup_vs_best_separate": 1.0}
    return {
        "kind": "adam_bench", "schema_version": 1, "created_utc": "2026-01-01T00:00:00+00:00", "command": "x",
        "bytes_per_param": 28, "hyper": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        "grace_isa": "avx512", "grace_native": True, "omp_wait_policy": "PASSIVE",
        "provenance": {"device": "cpu", "cpu": "x", "torch": "2"}, "loadavg_before": [0, 0, 0],
        "loadavg_after": [0, 0, 0],
        "measurements": [{
            "numel": 4, "threads": 1, "skipped": {},
            "kernels": {k: dict(kernel) for k in ("grace_adam", "roofline_stream7", "torch_fused", "torch_foreach")},
            "host_phase": {**{k: {**hp, "group": "speculative"} for k in SPECULATIVE},
                           **{k: {**hp, "group": "validate_first"} for k in VALIDATE_FIRST}},
        }],
    }


def test_schema_rejects_what_it_does_not_define(tmp_path):
    record.validate(_valid_record(), "adam_bench")
    bad = _valid_record()
    bad["measurements"][0]["kernels"]["grace_adam"]["ns_per_param"] = 1.0  # a field the schema lacks
    with pytest.raises(record.jsonschema.ValidationError):
        record.validate(bad, "adam_bench")
    bad = _valid_record()
    del bad["measurements"][0]["kernels"]["torch_fused"]["median_s"]
    path = tmp_path / "adam.json"
    with pytest.raises(record.jsonschema.ValidationError):
        record.write_result(path, bad, "adam_bench")  # the writer refuses, and leaves no file
    assert not path.exists()
    path.write_text(json.dumps(bad))
    with pytest.raises(record.ResultFileError, match=r"adam_bench.schema.json: at measurements/0/kernels/torch_fused"):
        record.read_result(path, "adam_bench")


def test_files_from_before_the_schema_are_still_read(tmp_path):
    """The first records had "benchmark": "adam" and "date" (now "kind" and "created_utc")."""
    old = _valid_record()
    for k in ("kind", "schema_version", "created_utc"):
        del old[k]
    old.update(benchmark="adam", date="2026-01-01T00:00:00+00:00")
    (tmp_path / "adam.json").write_text(json.dumps(old))
    rec = record.read_result(tmp_path / "adam.json", "adam_bench")
    assert rec["kind"] == "adam_bench" and rec["created_utc"] == "2026-01-01T00:00:00+00:00"
    assert "benchmark" not in rec and "date" not in rec


def test_bench_adam_says_it_builds_deepspeed_and_clears_a_dead_build(tmp_path, monkeypatch, capsys):
    """Before the workers load DeepSpeedCPUAdam: one line about the build, and a lock with no live owner
    (left by a killed build) is removed instead of hanging the workers. Nothing is built here."""
    pytest.importorskip("deepspeed")
    from deepspeed.git_version_info import installed_ops

    from superoffload.harness.microbench import adam

    if installed_ops.get("cpu_adam"):
        pytest.skip("this DeepSpeed ships cpu_adam prebuilt: nothing to build")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("SUPEROFFLOAD_DS_LOCK_STALE_S", "0")
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").touch()
    adam._prepare_deepspeed()
    err = capsys.readouterr().err
    assert "removed the stale build lock" in err and not (tmp_path / "cpu_adam" / "lock").exists()
    assert "building DeepSpeed's CPU op cpu_adam" in err and "first use takes ~1-2 min" in err
    assert not list(tmp_path.rglob("*.so"))
