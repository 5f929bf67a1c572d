"""benchmarks/plan_optimality.py in its small CI variant: one workload, a three-point grid, one repeat. Its file
follows plan_optimality.schema.json, an interrupted run resumes, and bad arguments are one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from superoffload.harness.record import read_result
from tests.ranks import REPO, rank_env

SCRIPT = REPO / "benchmarks" / "plan_optimality.py"
SMALL = ["--workloads", "gpt-tiny:32", "--world", "1", "--dtype", "fp32", "--grid", "planned,bucket/4,one-bucket",
         "--repeats", "1", "--steps", "2", "--warmup", "1", "--threads", "1"]


def _load():
    spec = importlib.util.spec_from_file_location("plan_optimality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO, env=rank_env(), capture_output=True,
                          text=True, timeout=600)


def test_small_variant_measures_the_grid_and_resumes(tmp_path) -> None:
    out = tmp_path / "po.json"
    res = _run("--out", str(out), *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    r = read_result(out, "plan_optimality")  # validates against the schema
    assert r["complete"] and len(r["points"]) == 1
    p = r["points"][0]
    assert [c["label"] for c in p["configs"]] == ["planned", "bucket/4", "one-bucket"]
    for c in p["configs"]:
        assert len(c["tokens_per_s"]) == 1 and not c["errors"] and c["predicted_step_s"] > 0
    from superoffload.shapes import get_shape

    assert p["configs"][2]["options"] == {"bucket_size": get_shape("gpt-tiny").total_params()}
    assert p["configs"][1]["options"] == {"bucket_size": p["plan"]["bucket_size"] // 4}
    best = max(c["median_tokens_per_s"] for c in p["configs"])
    assert p["planned_over_best"] == pytest.approx(p["configs"][0]["median_tokens_per_s"] / best)
    assert sorted(p["predicted_order"]) == sorted(p["measured_order"]) == sorted(c["label"] for c in p["configs"])
    assert r["summary"]["points_measured"] == 1 and r["provenance"]["git_commit"]
    assert "planned/best" in res.stdout
    # the same command again: everything was measured, nothing runs, the numbers stay
    again = _run("--out", str(out), *SMALL)
    assert again.returncode == 0 and "repeat 0:" not in again.stdout
    assert [c["tokens_per_s"] for c in json.loads(out.read_text())["points"][0]["configs"]] == \
        [c["tokens_per_s"] for c in p["configs"]]
    # more repeats extend it: only the missing ones run
    i = SMALL.index("--repeats")
    more = _run("--out", str(out), *SMALL[:i], "--repeats", "2", *SMALL[i + 2:])
    assert more.returncode == 0 and more.stdout.count("repeat 1:") == 3 and "repeat 0:" not in more.stdout
    extended = read_result(out, "plan_optimality")["points"][0]["configs"]
    assert [c["tokens_per_s"][0] for c in extended] == [c["tokens_per_s"][0] for c in p["configs"]]
    assert all(len(c["tokens_per_s"]) == 2 for c in extended)
    # other settings on the same file would mix two experiments
    other = _run("--out", str(out), *SMALL[:-6], "--steps", "3", "--warmup", "1", "--threads", "1")
    assert other.returncode == 2 and "other settings (steps)" in other.stderr


@pytest.mark.parametrize("argv, says", [
    (["--grid", "bucket/4"], "planned"),
    (["--grid", "planned,bucket*9"], "bucket*9"),
    (["--workloads", "gpt-tiny"], "MODEL:SEQ"),
    (["--workloads", "gpt-nope:64"], "gpt-nope"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, argv, says) -> None:
    res = _run("--out", str(tmp_path / "x.json"), *argv)
    assert res.returncode == 2 and says in res.stderr and not (tmp_path / "x.json").exists()


def test_grid_and_rank_correlation() -> None:
    mod = _load()
    from superoffload.planner.plan import make_plan
    from superoffload.planner.presets import get_profile
    from superoffload.shapes import get_shape

    shape = get_shape("gpt-tiny")
    plan = make_plan(shape, 64, 2, get_profile("cpu"), activation_checkpointing=False)
    n = shape.total_params()
    grid = mod.grid_for(plan, n, "bf16", False, list(mod.GRID))
    labels = [g["label"] for g in grid]
    assert labels[0] == "planned" and "cast" in labels and "tail0" in labels
    sizes = [g["options"]["bucket_size"] for g in grid if "bucket_size" in g["options"]]
    assert all(b <= n for b in sizes) and plan.bucket_size not in sizes and len(set(sizes)) == len(sizes)
    # fp32 casts nothing and a host device has no tail: those configurations are not run
    host = [g["label"] for g in mod.grid_for(plan, n, "fp32", True, list(mod.GRID))]
    assert "cast" not in host and "tail0" not in host and "tail*2" not in host
    assert mod.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert mod.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert mod.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # ties: mean ranks
    assert mod.spearman([1, 2], [1, 2]) is None and mod.spearman([1, 1, 1], [1, 2, 3]) is None
