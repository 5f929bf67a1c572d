"""`snakemake nightly` end to end on a tiny matrix: old-style config keys, the history, the verdict and the
summary, the microbenchmark suite, and the old refresh flag (`nightly_update_reference=true`) as an accept."""

from __future__ import annotations

import json
import sqlite3

import yaml
from wf_helpers import snakemake

# the nightly block as configs wrote it before the history existed: no window / persist / bounds keys
OLD_STYLE = {
    "repeats": 2, "threshold_pct": 10, "sigma": 3, "dtype": "fp32", "steps": 2, "warmup": 1, "threads": 1,
    "cases": [{"system": "torch", "model": "gpt-tiny", "seq": 16, "batch": 2}],
}


# the planner regression case, as small as it gets: one point, the plan and one bucket, two repeats
PLANNER_CASE = {"workloads": ["gpt-tiny:16"], "world": [1], "grid": "planned,one-bucket", "repeats": 2,
                "hardware": "this-cpu"}


def test_nightly_records_history_and_judges(tmp_path):
    cfg = tmp_path / "nightly.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "res"),
                                   "nightly": {**OLD_STYLE, "plan_optimality": PLANNER_CASE}}))
    snakemake("nightly", "--cores", "2", "--configfile", str(cfg), "--config", "nightly_hardware_key=cpu-test",
              "nightly_update_reference=true", env={"SUPEROFFLOAD_NIGHTLY_STAMP": "20261101T000000Z"})
    night = tmp_path / "res" / "nightly" / "cpu-test" / "20261101T000000Z"
    verdict = json.loads((night / "verdict.json").read_text())
    assert verdict["regression"] is False and verdict["suite"] == "training"
    assert {r["label"] for r in verdict["rows"]} == {"baseline reset"}  # accepted: the baseline starts here
    assert {r["case"] for r in verdict["rows"]} == {"torch_gpt-tiny_s16_b2", "plan_optimality_gpt-tiny_s16_b2_w1_fp32"}
    assert any(r["metric"] == "planned_over_best" and 0 < r["value"] <= 1.5 for r in verdict["rows"])
    summary = (night / "summary.md").read_text()
    assert "no regression" in summary and "torch_gpt-tiny_s16_b2" in summary
    micro = json.loads((night / "microbench-verdict.json").read_text())
    assert micro["suite"] == "microbench" and micro["rows"] and not micro["regression"]
    page = (tmp_path / "res" / "history" / "nightly.html").read_text()
    assert "torch_gpt-tiny_s16_b2" in page and "<svg" in page or "data:image/svg" in page
    db = sqlite3.connect(tmp_path / "res" / "history" / "nightly.sqlite")
    assert db.execute("SELECT COUNT(*) FROM nights").fetchone() == (2,)  # one training, one microbench night
    assert db.execute("SELECT COUNT(DISTINCT rep) FROM samples WHERE metric='tokens_per_s'").fetchone() == (2,)
    assert db.execute("SELECT COUNT(*) FROM annotations WHERE kind='accept'").fetchone()[0] >= 5


def test_the_nightly_target_runs_the_planner_case_by_default(results_dir):
    """config.yaml's nightly has the plan_optimality case (docs/nightly.md); a config without the key has none."""
    proc = snakemake("-n", "nightly", "--config", f"results_dir={results_dir}")
    assert "nightly_plan_optimality" in proc.stdout
