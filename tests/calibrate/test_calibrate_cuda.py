"""calibrate on a CUDA device: every measured field is physical and the profile predicts (GPU only)."""

from __future__ import annotations

import pytest

from superoffload.calibrate.machine import calibrate
from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.hardware import HardwareProfile
from superoffload.shapes import ModelShape

TOY = ModelShape(name="gpt-tiny", layers=2, hidden=64, heads=2, vocab=128, ffn_hidden=256, max_seq=128)


@pytest.mark.cuda
def test_cuda_calibrate_quick_is_physical_and_predicts(tmp_path) -> None:
    prof = calibrate(tmp_path / "p.json", quick=True, systems=False)
    assert not prof.device_is_host
    for curve in (prof.h2d_pinned, prof.d2h_pinned, prof.h2d_pageable, prof.d2h_pageable):
        assert all(0 < g < 2000 for g in curve.gbps)  # GB/s: below any link there is
    assert prof.h2d_pinned.peak() >= 0.5 * prof.h2d_pageable.peak()
    assert 1e12 < prof.device_matmul_flops <= 1.05 * prof.device_peak_flops
    assert prof.device_cast_gbps > 10 and prof.sync_latency_s < 1e-3
    assert 1e-7 < prof.launch_op_s < 1e-3 and 1e-8 < prof.device_call_s < 1e-3
    again = HardwareProfile.load(tmp_path / "p.json")
    assert again == prof
    pred = predict("superoffload", Workload(TOY, 128, 2, False), again)
    assert pred.step_time_s > 0 and pred.fits
