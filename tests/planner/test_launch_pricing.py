"""The cost model charges what the engine's launch issues: per bucket, the ops overhead.ENGINE_LAUNCH_OPS counts
(recounted here on the simulated device with the CUDA kernels, so the planner's counts cannot drift from the
engine's) at the profile's per-call costs; and a model whose Adam state fits on the device is planned with
every bucket there."""

from __future__ import annotations

from dataclasses import replace

import pytest

from superoffload.planner import buckets as bk
from superoffload.planner import overhead as ov
from superoffload.planner.plan import make_plan
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape
from tests.engine.test_launch_budget import _counts


@pytest.fixture(scope="module")
def counted() -> dict[str, dict[str, float]]:
    """Per host bucket and per tail bucket: (kernels, calls) the engine adds over torch in forward + backward."""
    out = {}
    for kind, (bucket, tail) in {"host": (20_000, 0), "tail": (20_000, 10_000)}.items():
        fb = _counts(bucket_size=bucket, tail=tail)["forward_backward"][f"extra_per_{kind}_bucket"]
        out[kind] = {"kernels": fb["launches"] + fb["copies"],
                     "calls": fb["event_records"] + fb["event_waits"] + fb["stream_switches"]}
    return out


@pytest.mark.parametrize("kind", ["host", "tail"])
def test_the_planners_op_counts_are_the_engines(counted, kind):
    """Within one op per bucket (the forward waits are per module, so their share per bucket varies with the
    model); a launch made cheaper or dearer must update ENGINE_LAUNCH_OPS."""
    for what, planned in ov.ENGINE_LAUNCH_OPS[kind].items():
        assert abs(counted[kind][what] - planned) <= 1.0, (
            f"the engine now issues {counted[kind][what]:.2f} {what} per {kind} bucket; "
            f"superoffload/planner/overhead.py ENGINE_LAUNCH_OPS says {planned}: update it")


def test_launch_priced_by_counts_at_the_profiles_call_costs():
    hw = replace(get_profile("h200-pcie"), launch_op_s=10e-6, device_call_s=2e-6)
    host, tail = ov.ENGINE_LAUNCH_OPS["host"], ov.ENGINE_LAUNCH_OPS["tail"]
    assert ov.engine_launch_overhead_s(hw, 1e6, 7) == pytest.approx(7 * (host["kernels"] * 10e-6
                                                                          + host["calls"] * 2e-6))
    assert ov.engine_launch_overhead_s(hw, 1e6, 7, on_device=True) == pytest.approx(
        7 * (tail["kernels"] * 10e-6 + tail["calls"] * 2e-6))
    # without call costs (a CPU profile) the fitted per-bucket and per-parameter terms price it
    cpu = replace(hw, launch_op_s=None, system_step_s={"superoffload": {"per_bucket_s": 1e-4, "per_param_s": 1e-9}})
    assert ov.engine_launch_overhead_s(cpu, 1e6, 7) == pytest.approx(7e-4 + 1e-3)


def test_dearer_launches_choose_fewer_buckets():
    """The bucket choice follows the launch's price: at the GPU presets' call costs an offloaded gpt-5b is
    planned with fewer buckets than on a host paying 1/20 of them per call (each bucket costs its launch on
    the training thread)."""
    shape = get_shape("gpt-5b")
    dear = get_profile("h100-pcie")
    cheap = replace(dear, launch_op_s=dear.launch_op_s / 20, device_call_s=dear.device_call_s / 20)
    on_dear, on_cheap = make_plan(shape, 1024, 4, dear), make_plan(shape, 1024, 4, cheap)
    assert on_dear.device_tail_buckets < len(bk.pack_buckets(shape, on_dear.bucket_size))  # it offloads
    assert len(bk.pack_buckets(shape, on_dear.bucket_size)) < len(bk.pack_buckets(shape, on_cheap.bucket_size))
    assert on_dear.predicted.step_time_s > on_cheap.predicted.step_time_s


def test_a_model_whose_state_fits_is_planned_whole_on_the_device():
    shape = get_shape("gpt-1b")
    plan = make_plan(shape, 1024, 4, get_profile("h200-pcie"))
    assert plan.device_tail_buckets == len(bk.pack_buckets(shape, plan.bucket_size))
    # with room for only part of it, part stays on the host
    part = make_plan(shape, 1024, 4, get_profile("h200-pcie"), hbm_budget=12e9)
    assert 0 < part.device_tail_buckets < len(bk.pack_buckets(shape, part.bucket_size))
