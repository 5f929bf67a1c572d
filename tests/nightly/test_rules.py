"""The nightly rules on synthetic histories: baseline, spread, persistence, labels, resets."""

from __future__ import annotations

import math
import random

import pytest

from superoffload.nightly import fingerprint as F
from superoffload.nightly import rules as R
from superoffload.nightly.changes import detect
from superoffload.nightly.metrics import TRAINING

from .history_helpers import CASE, FP, add_night, history

# The noise measured on the 2-core CI-class machine over 10 unchanged nightlies (docs/nightly.md): nights
# differ by 9-16 % (robust sd of the night medians), repeats within a night by 10-19 %. Modelled as a
# night effect shared by its repeats and a per-repeat scatter, whose median of 3 lands in that range.
NIGHT_SD, REPEAT_SD = 0.08, 0.15
# a dedicated node (a GPU server's nightly): a few per cent
QUIET_NIGHT_SD, QUIET_REPEAT_SD = 0.01, 0.02


def _labels(h, metric="tokens_per_s", cfg=None, case=CASE):
    judged = R.judge(h, "training", F.key(FP), cfg or R.RuleConfig())
    return [j.label for j in judged[(case, metric)]], judged


def _noisy(rng, level, n=3, night_sd=QUIET_NIGHT_SD, repeat_sd=QUIET_REPEAT_SD):
    night = level * math.exp(rng.gauss(0, night_sd))
    return [night * math.exp(rng.gauss(0, repeat_sd)) for _ in range(n)]


def test_too_little_history_is_insufficient_data_never_regression(tmp_path):
    with history(tmp_path) as h:
        for i, t in enumerate([1000, 1000, 1000, 500]):  # a halving on the fourth night: only 3 earlier nights
            add_night(h, i, [t] * 3)
        labels, _ = _labels(h)
    assert labels == [R.INSUFFICIENT] * 4


def test_one_outlier_is_suspicious_two_are_a_regression(tmp_path):
    rng = random.Random(1)
    with history(tmp_path) as h:
        for i in range(6):
            add_night(h, i, _noisy(rng, 1000))
        add_night(h, 6, _noisy(rng, 800))  # -20 %
        add_night(h, 7, _noisy(rng, 1000))  # back
        add_night(h, 8, _noisy(rng, 800))
        add_night(h, 9, _noisy(rng, 800))
        labels, judged = _labels(h)
    assert labels[:4] == [R.INSUFFICIENT] * 4
    assert labels[4:] == [R.OK, R.OK, R.SUSPICIOUS, R.OK, R.SUSPICIOUS, R.REGRESSION]
    series = judged[(CASE, "tokens_per_s")]
    assert series[7].baseline_nights == [n.night.id for n in series[:6]]  # the outlier never joined the baseline
    assert series[9].change < -0.15 and series[9].alert
    assert R.violation_start(series, series[9]) is series[8]


def test_noise_of_the_measured_spread_rarely_alerts_over_30_nights(tmp_path):
    """60 histories of 30 unchanged nights at this machine's measured noise: a false regression in at most
    10 % of them (simulated: 4 %; the 10 real nightlies gave none), and a false change point in at most 10 %."""
    false_regressions = false_changes = 0
    for seed in range(60):
        rng = random.Random(seed)
        with history(tmp_path / str(seed)) as h:
            for i in range(30):
                add_night(h, i, _noisy(rng, 1000, night_sd=NIGHT_SD, repeat_sd=REPEAT_SD))
            labels, judged = _labels(h)
            false_regressions += R.REGRESSION in labels
            nights, per = [j.night for j in judged[(CASE, "tokens_per_s")]], h.values(h.nights("training"))
            false_changes += bool(detect(CASE, TRAINING["tokens_per_s"], nights,
                                         [per[n.id][(CASE, "tokens_per_s")] for n in nights], R.RuleConfig()))
    assert false_regressions <= 6 and false_changes <= 6, (false_regressions, false_changes)


def test_a_15_percent_step_is_found_in_its_commit_range(tmp_path):
    rng = random.Random(7)  # a dedicated node's noise: at this machine's, see the docs for the detection rate
    with history(tmp_path) as h:
        for i in range(30):
            add_night(h, i, _noisy(rng, 1000 if i < 17 else 850), commit=f"{i:02d}" * 20)
        labels, judged = _labels(h)
        assert labels[17] == R.SUSPICIOUS and labels[18] == R.REGRESSION
        assert set(labels[18:]) == {R.REGRESSION}  # it keeps alerting until fixed, accepted or annotated
        series = judged[(CASE, "tokens_per_s")]
        nights, per = [j.night for j in series], h.values(h.nights("training"))
        [cp] = detect(CASE, TRAINING["tokens_per_s"], nights, [per[n.id][(CASE, "tokens_per_s")] for n in nights],
                      R.RuleConfig())
    assert cp.index == 17 and cp.good.commit == "16" * 20 and cp.bad.commit == "17" * 20
    assert cp.commit_range == "161616161616..171717171717"
    assert cp.change == pytest.approx(-0.15, abs=0.03)


def test_the_band_is_not_widened_by_one_wild_night(tmp_path):
    with history(tmp_path) as h:
        for i in range(6):
            add_night(h, i, [1000, 1002, 998] if i != 2 else [400, 401, 100])  # one wild night
        add_night(h, 6, [880, 880, 880])
        labels, judged = _labels(h)
    assert labels[2] == R.INSUFFICIENT and labels[6] == R.SUSPICIOUS
    assert judged[(CASE, "tokens_per_s")][6].allowed == pytest.approx(0.10)


def test_status_ok_to_error_is_a_regression_at_once_and_recovers(tmp_path):
    with history(tmp_path) as h:
        for i in range(4):
            add_night(h, i, [1000] * 3)
        add_night(h, 4, [0] * 3, status="oom")
        add_night(h, 5, [1000] * 3)
        labels, judged = _labels(h, "status")
        tps, _ = _labels(h)
    assert labels[4:] == [R.REGRESSION, R.RECOVERED]
    assert judged[(CASE, "status")][4].value == "oom" and judged[(CASE, "status")][4].alert
    assert tps[4] == R.MISSING and tps[5] == R.OK


def test_a_different_loss_trajectory_is_a_correctness_regression(tmp_path):
    with history(tmp_path) as h:
        for i in range(4):
            add_night(h, i, [1000] * 3)
        add_night(h, 4, [1000] * 3, loss="0ther")
        labels, _ = _labels(h, "loss_hash")
    assert labels[4] == R.CORRECTNESS


def test_repeats_that_disagree_are_nondeterministic_not_a_regression(tmp_path):
    from superoffload.nightly.store import Sample

    with history(tmp_path) as h:
        for i in range(5):
            h.add_night("training", f"2026-11-01T0{i}:00:00+00:00", f"{i:040x}", False, FP, f"n{i}",
                        [Sample(CASE, r, "loss_hash", text=f"h{r}") for r in range(2)])
        labels, _ = _labels(h, "loss_hash")
    assert labels[4] == R.NONDETERMINISTIC


def test_memory_is_exact_within_one_percent(tmp_path):
    with history(tmp_path) as h:
        for i in range(4):
            add_night(h, i, [1000] * 3, device_bytes=1e9)
        add_night(h, 4, [1000] * 3, device_bytes=1e9 * 1.005)  # within 1 %
        add_night(h, 5, [1000] * 3, device_bytes=1e9 * 1.02)
        add_night(h, 6, [1000] * 3, device_bytes=1e9 * 1.02)
        labels, _ = _labels(h, "peak_device_bytes")
    assert labels[4:] == [R.OK, R.SUSPICIOUS, R.REGRESSION]


def test_an_accepted_improvement_becomes_the_baseline(tmp_path):
    with history(tmp_path) as h:
        for i in range(5):
            add_night(h, i, [1000] * 3)
        for i in range(5, 7):
            add_night(h, i, [1300] * 3)
        labels, judged = _labels(h)
        assert labels[5:] == [R.POSSIBLE_IMPROVEMENT, R.IMPROVEMENT]
        start = R.violation_start(judged[(CASE, "tokens_per_s")], judged[(CASE, "tokens_per_s")][-1])
        h.annotate("accept", "training", F.key(FP), CASE, "faster kernel", metric="tokens_per_s",
                   from_night=start.night.id)
        for i in range(7, 10):
            add_night(h, i, [1300] * 3)
        add_night(h, 10, [1000] * 3)  # back to the old level: now a violation
        labels, _ = _labels(h)
    assert labels[5] == R.INTENDED and labels[6:9] == [R.INSUFFICIENT] * 3 and labels[9] == R.OK
    assert labels[10] == R.SUSPICIOUS


def test_an_intended_change_annotated_by_commit_stops_alerting(tmp_path):
    with history(tmp_path) as h:
        for i in range(5):
            add_night(h, i, [1000] * 3, commit=f"{i:02d}" * 20)
        h.annotate("intended", "training", F.key(FP), CASE, "bigger model default", commit="05" * 20)
        for i in range(5, 12):
            add_night(h, i, [700] * 3, commit=f"{i:02d}" * 20)
        labels, _ = _labels(h)
    assert R.REGRESSION not in labels and R.SUSPICIOUS not in labels
    assert labels[5] == R.INTENDED and labels[-1] == R.OK


def test_another_fingerprint_is_not_history(tmp_path):
    with history(tmp_path) as h:
        for i in range(6):
            add_night(h, i, [1000] * 3, fp={**FP, "torch": "2.12.0"})
        add_night(h, 6, [500] * 3)
        labels, _ = _labels(h)
    assert labels == [R.INSUFFICIENT]


def test_latest_reports_a_case_that_stopped_running(tmp_path):
    with history(tmp_path) as h:
        add_night(h, 0, [1000], case="a_gpt-tiny_s1_b1")
        add_night(h, 1, [1000], case="b_gpt-tiny_s1_b1")
        rows = R.latest(R.judge(h, "training", F.key(FP), R.RuleConfig()))
    assert any(j.case == "a_gpt-tiny_s1_b1" and j.label == R.MISSING for j in rows)
