"""Several chips in the cost model: ring collectives per link class, what each system communicates, host
memory and Adam work divided by the chip count, make_plan / explain with --chips, the paper's 4- and
16-chip points. One chip must predict exactly what it did before any of this existed."""

from __future__ import annotations

import dataclasses

import pytest

from superoffload.planner import buckets as bk
from superoffload.planner.costmodel import Workload, predict
from superoffload.planner.explain import explain
from superoffload.planner.hardware import GB
from superoffload.planner.plan import make_plan
from superoffload.planner.presets import get_profile
from superoffload.planner.systems import Options, system_spec
from superoffload.shapes import get_shape

GH = get_profile("gh200")
NET_STAGES = {"reduce_scatter", "all_gather", "all_reduce"}


def test_ring_collective_cost() -> None:
    w, n = 4, 1e9
    intra = 3 * GH.intra_node_latency_s + 3 / 4 * n / (GH.intra_node_gbps * GB)
    assert GH.collective_seconds("reduce_scatter", n, w) == pytest.approx(intra)
    assert GH.collective_seconds("all_gather", n, w) == pytest.approx(intra)
    assert GH.collective_seconds("all_reduce", n, w) == pytest.approx(2 * intra)
    # 4 chips fit one GH200 node; one chip per node crosses the network (each chip's NIC)
    inter = 3 * GH.inter_node_latency_s + 3 / 4 * n / (GH.inter_node_gbps * GB)
    assert GH.collective_seconds("reduce_scatter", n, w, ranks_per_node=1) == pytest.approx(inter)
    assert GH.collective_seconds("reduce_scatter", n, 16) > GH.collective_seconds("reduce_scatter", n, 4)
    assert GH.collective_seconds("all_gather", n, 1) == 0.0
    bare = dataclasses.replace(GH, intra_node_gbps=None, inter_node_gbps=None)
    assert bare.collective_seconds("all_gather", n, 4) == 0.0
    with pytest.raises(ValueError):
        GH.collective_seconds("broadcast", n, 4)


def test_link_numbers_of_the_gh200_preset() -> None:
    """NV6 between GH200 pairs (6 NVLink 4 links at 25 GB/s per direction), one 200 Gb/s NIC per chip,
    both at the preset's protocol efficiency (docs/cost_model.md)."""
    eff = 55 / 64
    assert GH.chips_per_node == 4
    assert GH.intra_node_gbps == pytest.approx(eff * 150)
    assert GH.inter_node_gbps == pytest.approx(eff * 25)


@pytest.mark.parametrize("system", ["superoffload", "zero_offload", "zero_infinity", "ds_superoffload",
                                    "fsdp_offload", "torch"])
def test_one_chip_has_no_communication(system: str) -> None:
    w = Workload(get_shape("gpt-1b"), 1024, 8, True)
    p = predict(system, w, GH)
    assert not NET_STAGES & set(p.stage_s) and p.chips == 1
    assert p.aggregate_tokens_per_s == pytest.approx(p.tokens_per_s)


def _stages(system: str, chips: int, opts: Options | None = None, model: str = "gpt-8b", rpn: int | None = None):
    return predict(system, Workload(get_shape(model), 1024, 4, True, chips=chips, ranks_per_node=rpn), GH, opts)


def test_superoffload_reduce_scatters_fp32_and_gathers_the_weights() -> None:
    shape = get_shape("gpt-8b")
    opts = Options(device_tail_buckets=0, bucket_size=1 << 24)
    p = _stages("superoffload", 4, opts, rpn=1)
    n = shape.total_params()
    # each bucket is one collective, paying its latency
    buckets = sum(g.real_buckets for g in bk.bucket_groups(shape, opts.bucket_size, 0))
    bw = GH.inter_node_gbps * GB
    rs_bytes = 3 / 4 * 4 * n / bw  # fp32 gradients
    ag_bytes = 3 / 4 * 2 * n / bw  # bf16 weights
    lat = 3 * GH.inter_node_latency_s
    assert rs_bytes <= p.stage_s["reduce_scatter"] <= rs_bytes + buckets * lat + 1e-9
    assert ag_bytes <= p.stage_s["all_gather"] <= ag_bytes + buckets * lat + 1e-9
    assert p.stage_s["all_reduce"] == pytest.approx(2 * (lat + 3 / 4 * 16 / bw))  # [norm², non-finite count]


def test_host_work_and_state_are_divided_by_the_chips() -> None:
    opts = Options(device_tail_buckets=0)
    one, four = _stages("superoffload", 1, opts), _stages("superoffload", 4, opts)
    # the bytes are divided; the per-bucket sync latency is not
    groups = bk.bucket_groups(get_shape("gpt-8b"), opts.bucket_size, 0)
    latency = GH.sync_latency_s * sum(g.real_buckets for g in groups)
    assert four.stage_s["host_adam"] - latency == pytest.approx((one.stage_s["host_adam"] - latency) / 4, rel=1e-6)
    host = {k: v for k, v in one.memory["host"].items() if k != "reserve"}
    host4 = {k: v for k, v in four.memory["host"].items() if k != "reserve"}
    assert sum(host4.values()) == pytest.approx(sum(host.values()) / 4, rel=0.01)
    # the peers' host state too
    for system in ("zero_offload", "fsdp_offload"):
        m1, m4 = _stages(system, 1).memory["host"], _stages(system, 4).memory["host"]
        assert sum(m4.values()) - m4["reserve"] == pytest.approx((sum(m1.values()) - m1["reserve"]) / 4)


def test_peers_communicate_as_they_do() -> None:
    shape = get_shape("gpt-8b")
    n = shape.total_params()
    bw = GH.intra_node_gbps * GB
    # DDP: fp32 gradients all-reduced, nothing sharded, every rank steps the whole model on the device
    ddp = _stages("torch", 4)
    assert ddp.stage_s["all_reduce"] >= 2 * 3 / 4 * 4 * n / bw and "host_adam" not in ddp.stage_s
    assert "ddp_gradient_buckets" in ddp.memory["device"]
    # ZeRO-2 offload: reduce-scatter and all-gather in the training dtype (bf16)
    zo = _stages("zero_offload", 4)
    assert 3 / 4 * 2 * n / bw <= zo.stage_s["reduce_scatter"] < 3 / 4 * 3 * n / bw
    assert 3 / 4 * 2 * n / bw <= zo.stage_s["all_gather"] < 3 / 4 * 3 * n / bw
    # ZeRO-3 (DeepSpeed super_offload, stage-3 defaults): every layer gathered for forward and backward
    ds = _stages("ds_superoffload", 4)
    layer_ag = 3 / 4 * 2 * shape.block_params() / bw
    assert ds.stage_s["all_gather"] >= 2 * shape.layers * layer_ag
    assert ds.memory["device"]["params_bf16"] == pytest.approx(2 * n / 4)
    # FSDP2: per layer H2D of the shard and an all-gather, gradients reduce-scattered in fp32
    fs = _stages("fsdp_offload", 4)
    assert fs.stage_s["all_gather"] >= 2 * shape.layers * layer_ag
    assert fs.stage_s["reduce_scatter"] >= 3 / 4 * 4 * shape.layers * shape.block_params() / bw


def test_more_chips_fit_bigger_models() -> None:
    shape = get_shape("gpt-40b")
    w1 = Workload(shape, 2048, 1, True)
    assert not predict("zero_offload", w1, GH).fits  # 16 B/param of host state: ~650 GB on one chip
    assert predict("zero_offload", dataclasses.replace(w1, chips=4), GH).fits
    # DDP replicates everything: more chips never fit a bigger model
    small = Workload(get_shape("gpt-8b"), 2048, 1, True)
    assert not predict("torch", small, GH).fits and not predict("torch", dataclasses.replace(small, chips=16), GH).fits


def test_spec_is_inert_on_one_chip() -> None:
    for system in ("superoffload", "zero_offload", "torch"):
        a = system_spec(system, Options(), 10**9)
        b = system_spec(system, Options(), 10**9, world=1)
        assert a == b and a.grad_reduce is None


def test_make_plan_and_explain_take_chips() -> None:
    shape = get_shape("gpt-13b")
    plan = make_plan(shape, 1024, 4, GH, chips=4, ranks_per_node=1)
    assert plan.chips == 4 and plan.predicted.chips == 4
    assert any(r.startswith("Chips: 4 data-parallel ranks (1 per node, 4 nodes)") for r in plan.reasons)
    one = make_plan(shape, 1024, 4, GH)
    # the link rule's bucket is 4x larger: each rank copies a quarter of it (the priced choice may move both)
    assert one.chips == 1 and any(r.startswith("Bucket: ") and "(x4 chips: each rank copies a 1/4 shard)" in r
                                  for r in plan.reasons)
    assert plan.predicted.host_bytes < one.predicted.host_bytes / 3
    text = explain("gpt-13b", 1024, 4, "gh200", chips=4, ranks_per_node=1)
    assert "on 4 x gh200" in text and "reduce_scatter" in text and "over 4 chips" in text
    with pytest.raises(ValueError, match="chips"):
        make_plan(shape, 1024, 4, GH, chips=0)


def test_explain_cli_chips(capsys) -> None:
    from superoffload.cli.main import main

    assert main(["explain", "--model", "gpt-1b", "--seq", "1024", "--batch", "4", "--chips", "16"]) == 0
    assert "on 16 x gh200" in capsys.readouterr().out
    assert main(["explain", "--model", "gpt-1b", "--chips", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--chips must be a positive integer" in err[0]


def test_harness_plan_on_the_cpu_preset_for_two_ranks() -> None:
    plan = make_plan(get_shape("gpt-tiny"), 128, 2, get_profile("cpu"), chips=2)
    assert plan.chips == 2 and not plan.speculation and plan.device_tail_buckets == 0
    assert NET_STAGES & set(plan.predicted.stage_s)


def test_replicated_superoffload_all_reduces_and_gathers_nothing() -> None:
    """replicate: one all-reduce of each bucket's gradient (its dtype) and no weight all-gather nor norm
    all-reduce; every rank holds and steps the whole state, as on one chip."""
    opts = Options(device_tail_buckets=0, bucket_size=1 << 24)
    rep = dataclasses.replace(opts, replicate=True)
    spec = system_spec("superoffload", rep, 10**9, world=4)
    assert (spec.grad_reduce, spec.grad_reduce_bytes, spec.param_gather_bytes) == ("all_reduce", 4, 0)
    assert not spec.shard_optimizer and not spec.step_allreduce
    p, one = _stages("superoffload", 4, rep), _stages("superoffload", 1, opts)
    assert p.stage_s["all_reduce"] > 0 and "all_gather" not in p.stage_s and "reduce_scatter" not in p.stage_s
    assert p.stage_s["host_adam"] == pytest.approx(one.stage_s["host_adam"])
    sharded = _stages("superoffload", 4, opts)
    assert p.memory["host"]["master_m_v"] == pytest.approx(4 * sharded.memory["host"]["master_m_v"], rel=1e-3)
    assert p.memory["host"]["master_m_v"] == pytest.approx(one.memory["host"]["master_m_v"], rel=1e-3)


def test_the_plan_prices_sharded_against_replicated() -> None:
    """With several chips the planner plans both and says which it kept and the runner-up's step: on a
    GH200 a 13B model shards (replicated, each Grace would step the whole model); on this CPU preset at two
    ranks, where the collectives are the cost and Adam is cheap, gpt-small replicates; replicated that does
    not fit host memory is not taken; one chip has no such choice."""
    big = make_plan(get_shape("gpt-13b"), 1024, 4, GH, chips=4)
    alt = big.alternatives["replicate"]
    assert not big.replicate and alt["runner_up"] is True and alt["runner_up_step_s"] > alt["step_s"]
    assert big.engine_options()["replicate"] is False
    cpu = get_profile("cpu")
    small = make_plan(get_shape("gpt-small"), 128, 2, cpu, chips=2, precision="fp32")
    alt = small.alternatives["replicate"]
    assert small.replicate and alt["runner_up"] is False and alt["step_s"] <= alt["runner_up_step_s"] * 0.98
    assert small.engine_options("fp32")["replicate"] is True
    assert any(r.startswith("Optimizer state: replicated on every rank") for r in small.reasons)
    # host memory between what sharded and replicated need (on this preset the device's memory is the host's)
    s, r = (make_plan(get_shape("gpt-small"), 128, 2, cpu, chips=2, precision="fp32", replicate=rep).predicted
            for rep in (False, True))
    assert r.host_bytes > s.host_bytes
    device = sum(s.memory["device"].values())
    tight = dataclasses.replace(cpu, host_memory_bytes=int(device + (s.host_bytes + r.host_bytes) / 2))
    forced = make_plan(get_shape("gpt-small"), 128, 2, tight, chips=2, precision="fp32")
    assert not forced.replicate and "does not fit" in forced.alternatives["replicate"]["why"]
    assert "replicate" not in make_plan(get_shape("gpt-small"), 128, 2, cpu, precision="fp32").alternatives
