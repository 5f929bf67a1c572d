"""`superoffload bench adam`: one record with every kernel on shared buffers and both host-phase groups."""

import json

import pytest

from superoffload.cli.main import main as cli_main

SPECULATIVE = {"grace_double_buffer", "grace_deferred_commit", "torch_fused_separate_undo"}
VALIDATE_FIRST = {"grace_validate_first", "torch_fused_separate"}


def test_bench_adam_record(tmp_path, capsys):
    out = tmp_path / "adam.json"
    assert cli_main(["bench", "adam", "--numel", "40K", "--threads", "1", "--repeats", "2", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
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


@pytest.mark.parametrize("args", [["--numel", "12Q"], ["--numel", "0"], ["--threads", "0"], ["--repeats", "0"]])
def test_bench_adam_rejects_bad_input(tmp_path, capsys, args):
    out = tmp_path / "a.json"
    assert cli_main(["bench", "adam", *args, "--out", str(out)]) == 2
    assert "error" in capsys.readouterr().err
    assert not out.exists()
