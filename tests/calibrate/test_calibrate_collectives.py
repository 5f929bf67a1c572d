"""`calibrate --collectives 2`: reduce-scatter, all-gather and all-reduce measured on two gloo ranks of this host,
and the cost model reading them back."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from superoffload.calibrate import collectives as coll
from superoffload.planner.hardware import COLLECTIVES, fit_collective
from superoffload.planner.presets import get_profile


@pytest.fixture(scope="module")
def measured() -> dict:
    return coll.measure(2, quick=True)


def test_two_gloo_ranks_measure_sane_positive_times_that_grow_with_size(measured) -> None:
    assert measured["backend"] == "gloo" and measured["world"] == 2
    sizes = measured["sizes"]
    assert sizes == sorted(sizes) and sizes[0] >= 4096
    for kind in COLLECTIVES:
        secs = measured["seconds"][kind]
        assert len(secs) == len(sizes)
        assert all(0 < s < 5.0 for s in secs), (kind, secs)  # positive and not absurd on loopback
        # monotone in size, allowing the noise of a loaded 2-core machine between neighbours: the largest
        # message (256 x the smallest) takes longer than any of the three smallest
        assert secs[-1] > min(secs[:3]), (kind, secs)
        lat, gbps = measured["latency_s"][kind], measured["gbps"][kind]
        assert 0 < lat < 0.1 and 0 < gbps < 1e4, (kind, lat, gbps)
    assert measured["worker_issue_s"] >= 0


def test_fit_recovers_a_ring_it_was_given() -> None:
    world, lat, gbps = 4, 50e-6, 12.0
    sizes = [4096 << 2 * i for i in range(6)]
    secs = [(world - 1) * lat + (world - 1) / world * n / (gbps * 1e9) for n in sizes]
    fl, fg = fit_collective(sizes, secs, world)
    # the smallest message is taken as all latency: its bandwidth term is folded in (< 1 % here)
    assert fl == pytest.approx(secs[0] / (world - 1))
    assert fg == pytest.approx(gbps, rel=0.01)


def test_the_cost_model_uses_the_measurement_instead_of_the_preset(measured) -> None:
    preset = get_profile("cpu")
    prof = replace(preset, collectives={"intra": measured})
    sizes = measured["sizes"]
    for kind in COLLECTIVES:
        # at a measured size and world: the measured time itself
        for n, s in zip(sizes, measured["seconds"][kind], strict=True):
            assert prof.collective_seconds(kind, n, 2) == pytest.approx(s)
        # between two sizes: log-log interpolation, so within them
        mid = math.sqrt(sizes[1] * sizes[2])
        lo, hi = sorted(measured["seconds"][kind][1:3])
        assert lo <= prof.collective_seconds(kind, mid, 2) <= hi
        # at another world: the fitted ring, growing with the ranks
        assert 0 < prof.collective_seconds(kind, sizes[-1], 4) < prof.collective_seconds(kind, sizes[-1], 8)
    # across nodes nothing was measured and this calibrated-only profile has no link numbers for it
    bare = replace(prof, intra_node_gbps=None, inter_node_gbps=None)
    assert bare.collective_seconds("all_reduce", sizes[-1], 2, ranks_per_node=1) == 0.0
    # a profile written and read back keeps them
    assert type(prof).from_dict(prof.to_dict()).collectives == prof.collectives
