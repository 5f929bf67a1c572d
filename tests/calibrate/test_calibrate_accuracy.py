"""Predicted vs measured rows from run records, with the options each run really used."""

import dataclasses

from superoffload.calibrate.accuracy import compare, format_rows, run_options
from superoffload.harness.runner import run_benchmark
from superoffload.harness.system import RunConfig
from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape


def test_compare_real_records():
    recs = [run_benchmark(RunConfig(system=s, model="gpt-tiny", seq=32, batch=2, steps=2, warmup=1, threads=1))
            for s in ("torch", "superoffload")]
    recs.append({**recs[0], "status": "error"})  # errors are skipped
    rows = compare(recs, get_profile("cpu"))
    assert [r["system"] for r in rows] == ["torch", "superoffload"]
    for r in rows:
        assert r["predicted_s"] > 0 and r["measured_s"] > 0
        assert r["rel_error"] == r["predicted_s"] / r["measured_s"] - 1
    text = format_rows(rows, "cpu")
    assert "within ±20%" in text and "gpt-tiny" in text
    # every record says how quiet the machine was; a flagged one is named under the table
    assert all("noise" in rec and isinstance(rec["noise"]["flags"], list) for rec in recs[:2])
    # (the second made quiet by hand: on a loaded machine the real run is flagged too)
    noisy = [{**recs[0], "noise": {**recs[0]["noise"], "flags": ["loaded"]}},
             {**recs[1], "noise": {**recs[1]["noise"], "flags": []}}]
    text = format_rows(compare(noisy, get_profile("cpu")), "cpu")
    assert "1 of the measurements come from runs flagged noisy" in text and "loaded" in text


def test_a_run_with_another_host_kernel_is_predicted_with_that_kernel():
    """The record's engine config reaches the cost model whole: a run made with host_optimizer torch is
    predicted with torch's host Adam rate, not GraceAdam's."""
    run = RunConfig(system="superoffload", model="gpt-tiny", seq=32, batch=2, steps=2, warmup=1, threads=1,
                    system_options={"host_optimizer": "torch"})
    rec = run_benchmark(run)
    assert rec["status"] == "ok", rec["error"]
    opts = run_options(rec)
    assert opts.host_optimizer == "torch"
    assert opts.bucket_size == rec["system_stats"]["config"]["bucket_size"]
    (row,) = compare([rec], get_profile("cpu"))
    w = Workload(get_shape("gpt-tiny"), 32, 2, False, dtype="fp32")
    torch_pred = predict("superoffload", w, get_profile("cpu"), opts).step_time_s
    grace_pred = predict("superoffload", w, get_profile("cpu"),
                         dataclasses.replace(opts, host_optimizer="grace")).step_time_s
    assert row["predicted_s"] == torch_pred != grace_pred


def test_peer_records_take_precision_and_clipping_from_the_run():
    rec = {"system": "zero_offload", "run": {"dtype": "bf16", "grad_clip": 0.0, "grad_accum": 2}}
    opts = run_options(rec)
    assert (opts.precision, opts.clipping, opts.grad_accum) == ("bf16", False, 2)


def test_a_multi_rank_record_is_predicted_with_its_ranks_and_host():
    from superoffload.calibrate.accuracy import run_host

    rec = {"world_size": 2, "placement": {"cores": [1], "bound": True}, "run": {"threads": 1},
           "system_stats": {"config": {"host_threads": 1}}}
    assert run_host(rec) == {"chips": 2, "cores_per_rank": 1.0, "compute_threads": 1, "host_threads": 1}
    # unbound, the ranks share the cores the process could use; an old record says nothing: the defaults
    assert run_host({"world_size": 2, "placement": {"cores": [0, 1], "bound": False}})["cores_per_rank"] == 1.0
    assert run_host({}) == {"chips": 1}


def test_validate_reads_a_results_folder_as_every_reader_does(tmp_path):
    """`superoffload validate DIR` loads records through superoffload.harness.record: run records anywhere below
    DIR count; other JSON, unreadable files and a writer's hidden temporary file do not."""
    import argparse
    import json

    from superoffload.calibrate.accuracy import main
    from superoffload.harness.record import write_record

    rec = run_benchmark(RunConfig(system="torch", model="gpt-tiny", seq=32, batch=2, steps=2, warmup=1, threads=1))
    write_record(tmp_path / "runs" / "torch" / "gpt-tiny_s32_b2.json", rec)
    (tmp_path / "runs" / "torch" / ".gpt-tiny_s32_b2.json.tmp.json").write_text(json.dumps(rec))
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": "cpu_smoke"}))
    (tmp_path / "broken.json").write_text("{")
    out = tmp_path / "rows.json"
    assert main(argparse.Namespace(results_dir=str(tmp_path), hardware="cpu", out=str(out))) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["system"], r["dtype"], r["world"]) for r in rows] == [("torch", "fp32", 1)]
