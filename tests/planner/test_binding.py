"""What bounds a predicted step: busy time per resource, the busiest named by `explain` with its stages.

At the largest model one GH200 trains (gpt-30b, Fig 13's settings) the host CPU's Adam and commit passes
bound the step; at the paper's Fig 10 point (gpt-1b, seq 1024, batch 8) the planner's tail buckets
balance the two: the device's compute stream and the host are both busy for nearly all of the step."""

from __future__ import annotations

from superoffload.planner.costmodel import Prediction
from superoffload.planner.explain import format_binding
from superoffload.planner.plan import make_plan
from superoffload.planner.presets import get_profile
from superoffload.shapes import get_shape

GH = get_profile("gh200")


def _predicted(model: str, seq: int, batch: int) -> Prediction:
    plan = make_plan(get_shape(model), seq, batch, GH)
    assert plan.predicted is not None and plan.predicted.fits
    return plan.predicted


def test_the_host_bounds_the_largest_model_on_one_chip() -> None:
    p = _predicted("gpt-30b", 1024, 1)
    name, share = p.binding()
    # busy for 87 % of the step since the host step reads bf16 gradients without a cast pass (92 % before)
    assert name == "host" and share > 0.8
    assert {"host_adam"} <= set(p.resource_stages["host"])
    # busy time per resource is the sum of its stages' time: the host's stages are all on the host
    assert abs(p.resource_s["host"] - sum(p.stage_s[k] for k in p.resource_stages["host"])) < 1e-9
    text = "\n".join(format_binding(p))
    assert text.startswith("  bound by             the host CPU: busy") and "host_adam" in text


def test_device_and_host_are_balanced_at_the_paper_throughput_point() -> None:
    p = _predicted("gpt-1b", 1024, 8)
    _, share = p.binding()
    assert share <= 1.0 + 1e-9
    # both near saturation (the host at 94 % since the plan prices the engine's per-bucket cost: 13 large buckets)
    assert p.resource_s["compute"] > 0.9 * p.step_time_s and p.resource_s["host"] > 0.9 * p.step_time_s
    # the device's busy time per step is its compute stream's work in one iteration
    assert p.gpu_busy_s == min(p.step_time_s, p.resource_s["compute"])
    assert p.gpu_idle_s == max(0.0, p.step_time_s - p.gpu_busy_s)


def test_an_old_plan_without_resources_prints_no_binding() -> None:
    d = _predicted("gpt-1b", 1024, 8).to_dict()
    old = Prediction(**{k: v for k, v in d.items() if k not in ("resource_s", "resource_stages")})
    assert old.binding() is None and format_binding(old) == []
