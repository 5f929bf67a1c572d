"""The planner budgets the HBM that weight flow saves and the buffers it needs; both must agree
with what the engine reports for the same model and configuration (its weight_flow stats)."""

from __future__ import annotations

import pytest

from superoffload.engine.config import SuperOffloadConfig
from superoffload.harness.models import build_model, get_shape
from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.memory import BF16
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options
from tests.engine.helpers import OPT, batches, train_engine

SEQ = 16


@pytest.mark.parametrize("flow,prefetch,ac", [([1, 2], 1, False), ([0, 1, 2, 3], 2, True), ([2], 1, False),
                                              ([0, 1, 2, 3], 0, False)])
def test_planner_flow_bytes_match_the_engine(flow: list[int], prefetch: int, ac: bool) -> None:
    shape = get_shape("gpt-tiny")
    model = build_model(shape, seq=SEQ, seed=0, activation_checkpointing=ac)
    cfg = {"precision": "bf16", "flow_layers": flow, "flow_prefetch": prefetch, "bucket_size": 4096,
           "optimizer": OPT, "device": "cpu"}
    engine, _ = train_engine(model, cfg, 2, batches(seq=SEQ))
    try:
        st = engine.flow.stats()
    finally:
        engine.close()
    opts = Options(flow_layers=tuple(flow), flow_prefetch=prefetch, bucket_size=4096, speculation=False)
    pred = predict("superoffload", Workload(shape, SEQ, 2, ac), get_profile("cpu"), opts)
    dev = pred.memory["device"]
    block_bytes = BF16 * shape.block_params()
    # HBM saved: the flowed blocks' bf16 weights, which the engine keeps in its host store
    assert BF16 * shape.total_params() - dev["params_bf16"] == st["bytes"] == block_bytes * len(flow)
    assert pred.memory["host"]["flow_bf16_copy"] == st["bytes"]
    # HBM still needed: the flowed blocks resident at the peak
    assert dev["flow_prefetch_slots"] == st["peak_resident_blocks"] * block_bytes
    # link traffic: every flowed block is fetched for forward and again for backward
    assert pred.stage_s["weight_fetch"] > 0 and st["h2d_bytes_per_step"] == 2 * st["bytes"]


def test_planner_prefetch_default_is_the_engines() -> None:
    """A plan's flow_prefetch (what its memory estimate assumed) is the engine's default."""
    assert Options().flow_prefetch == SuperOffloadConfig().flow_prefetch
