"""`superoffload nightly` from the command line: record, import, check's exit status, accept, annotate,
and bad input refused before any work."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from superoffload.cli.main import main
from superoffload.nightly import cli
from superoffload.nightly.store import History

from .history_helpers import CASE, add_night

ROOT = Path(__file__).resolve().parents[2]


def _record(tps: float, status: str = "ok", commit: str = "ab" * 20) -> dict:
    return {
        "status": status, "created_utc": "2026-11-01T00:00:00+00:00", "losses": [6.0, 5.5],
        "throughput": {"tokens_per_s": tps}, "timing": {"median_s": 256 / tps, "p90_s": 300 / tps,
                                                       "step_times_s": [0.1, 0.1], "warmup_times_s": [0.1]},
        "memory": {"peak_device_bytes": None, "peak_host_rss_bytes": 3e8},
        "system_stats": {"pinned_bytes": 4096, "time_s": {"host_step_s": 0.03}},
        "rollbacks": {"enabled": True, "committed": 2, "rolled_back": 1},
        "run": {"threads": 1, "bind_cores": False, "dtype": "fp32", "steps": 2, "warmup": 1, "grad_clip": 1.0},
        "provenance": {"device": "cpu", "cpu": "Test CPU", "cpu_count": 2, "torch": "2.13.0",
                       "git_commit": commit, "git_dirty": False},
    }


def _night_dir(root: Path, name: str, tps: list[float], commit: str = "ab" * 20) -> Path:
    d = root / name
    for i, t in enumerate(tps):
        (d / CASE).mkdir(parents=True, exist_ok=True)
        (d / CASE / f"rep{i}.json").write_text(json.dumps(_record(t, commit=commit)))
    return d


def test_record_is_once_per_night_and_keeps_every_metric(tmp_path, capsys):
    store = str(tmp_path / "h.sqlite")
    d = _night_dir(tmp_path, "n0", [1000, 1010])
    assert main(["nightly", "record", "--runs", str(d), "--store", store]) == 0
    assert main(["nightly", "record", "--runs", str(d), "--store", store]) == 0
    assert "already recorded" in capsys.readouterr().out
    with History(store) as h:
        [night] = h.nights("training")
        got = {(s.metric, s.rep): s for s in h.samples(night.id)}
    assert night.commit == "ab" * 20 and night.dirty is False
    assert got[("tokens_per_s", 1)].value == 1010 and got[("rollback_rate", 0)].value == pytest.approx(1 / 3)
    assert got[("host_step_s", 0)].value == pytest.approx(0.01) and got[("pinned_bytes", 0)].value == 4096
    assert got[("status", 0)].text == "ok" and len(got[("loss_hash", 0)].text) == 16
    assert json.loads(got[("spec", 0)].text) == {"dtype": "fp32", "grad_clip": 1.0, "steps": 2, "threads": 1,
                                                 "warmup": 1}


def test_check_exit_status_is_nonzero_for_a_regression_only(tmp_path):
    store = str(tmp_path / "h.sqlite")
    assert main(["nightly", "check", "--store", store]) == 2  # nothing recorded: an error, said so
    for i, tps in enumerate([[1000, 1000]] * 4 + [[700, 700]]):
        main(["nightly", "record", "--runs", str(_night_dir(tmp_path, f"n{i}", tps, commit=f"{i:02d}" * 20)),
              "--store", store, "--source", f"n{i}"])
    out, summary = tmp_path / "v.json", tmp_path / "s.md"
    assert main(["nightly", "check", "--store", store, "--out", str(out), "--summary", str(summary)]) == 0
    assert "suspicious" in summary.read_text()  # one slow night
    main(["nightly", "record", "--runs", str(_night_dir(tmp_path, "n5", [700, 700], commit="05" * 20)),
          "--store", store, "--source", "n5"])
    assert main(["nightly", "check", "--store", store, "--out", str(out), "--summary", str(summary)]) == 1
    v = json.loads(out.read_text())
    assert f"{CASE}:tokens_per_s" in v["regressed"]
    assert any(f"nightly bisect --case {CASE} --metric tokens_per_s --good {'03' * 6} --bad {'04' * 6}" in c
               and "--grad-clip 1.0" in c for c in v["bisect"]), v["bisect"]
    # accepting the new level stops the alert
    assert main(["nightly", "accept", "--store", store, "--case", CASE, "--note", "slower by design"]) == 0
    assert main(["nightly", "check", "--store", store]) == 0


def test_import_keeps_the_old_references_as_history(tmp_path):
    store = tmp_path / "h.sqlite"
    refs = sorted((ROOT / "benchmarks" / "reference").glob("nightly-*.json"))
    micro = ROOT / "benchmarks" / "reference" / "pytest-benchmark"
    args = ["nightly", "import", "--store", str(store), "--pytest-benchmark-dir", str(micro)]
    for r in refs:
        args += ["--reference", str(r)]
    assert main(args) == 0 and main(args) == 0  # the second time: already there
    with History(store) as h:
        train, bench = h.nights("training"), h.nights("microbench")
        assert len(train) == len(refs) and len(bench) >= 1
        ref = json.loads(refs[0].read_text())
        case = sorted(ref["cases"])[0]
        vals = h.values(train[:1])[train[0].id][(case, "tokens_per_s")]
        assert [s.value for s in vals] == ref["cases"][case]["tokens_per_s"]["values"]
        assert train[0].fingerprint_fields["device"] == "imported"


def test_annotate_an_intended_change_by_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    store = str(tmp_path / "h.sqlite")
    with History(store) as h:
        for i in range(5):
            add_night(h, i, [1000.0] * 2)
        for i in range(5, 8):
            add_night(h, i, [500.0] * 2, commit=sha)
    assert main(["nightly", "check", "--store", store]) == 1
    assert main(["nightly", "annotate", "--store", store, "--repo", str(repo), "--case", "*", "--commit", "HEAD",
                 "--note", "half the batch on purpose"]) == 0
    assert main(["nightly", "check", "--store", store]) == 0


@pytest.mark.parametrize("argv, says", [
    (["--case", "not a case", "--good", "HEAD~1", "--bad", "HEAD"], "SYSTEM_MODEL_sSEQ_bBATCH"),
    (["--case", CASE, "--good", "HEAD", "--bad", "HEAD~1"], "not an ancestor"),
    (["--case", CASE, "--good", "HEAD~1", "--bad", "HEAD", "--repeats", "0"], "--repeats"),
    (["--case", CASE, "--good", "no-such-ref", "--bad", "HEAD"], "rev-parse"),
])
def test_bisect_refuses_bad_input_before_any_work(tmp_path, capsys, argv, says):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for m in ("a", "b"):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                        "--allow-empty", "-m", m], check=True)
    assert main(["nightly", "bisect", "--repo", str(repo), *argv, "--work-dir", str(tmp_path / "w")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # no worktree was made


def test_rule_config_from_flags():
    import argparse

    a = argparse.Namespace(window=5, min_baseline=3, persist=3, sigma=4.0, threshold_pct=15.0,
                           bound=["peak_host_bytes=0.08"])
    cfg = cli.rule_config(a)
    assert (cfg.window, cfg.min_baseline, cfg.persist, cfg.k) == (5, 3, 3, 4.0)
    assert cfg.floors == {"tokens_per_s": 0.15, "step_s_median": 0.15, "time_median_s": 0.15,
                          "peak_host_bytes": 0.08}
    with pytest.raises(ValueError, match="METRIC=VALUE"):
        cli.rule_config(argparse.Namespace(**{**vars(a), "bound": ["oops"]}))


def test_a_change_without_a_code_change_says_so_and_offers_no_bisect(tmp_path):
    store = str(tmp_path / "h.sqlite")
    with History(store) as h:
        for i in range(4):
            add_night(h, i, [1000.0] * 2, commit="cd" * 20)
        for i in range(4, 6):
            add_night(h, i, [600.0] * 2, commit="cd" * 20)
    out = tmp_path / "v.json"
    assert main(["nightly", "check", "--store", store, "--out", str(out)]) == 1
    v = json.loads(out.read_text())
    row = next(r for r in v["rows"] if r["metric"] == "tokens_per_s")
    assert row["commits"] == "cdcdcdcdcdcd (same commit: not the code)" and v["bisect"] == []
