"""Long sequences in the cost model and the planner (docs/cost_model.md, "Long sequences"): Ulysses sequence
parallelism (per-rank tokens, attention 1/sp, all-to-alls per block on the SP group's link class),
activation checkpoints in host memory (a pinned host category, a two-block device window, a D2H per block in
forward and an H2D in backward), the tiled loss (its transient and its extra backward work), the `ulysses`
baseline, the planner's choices and reasons, `explain --sp`, and Fig 12. With sp = 1 and the flags off
nothing changes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from superoffload.planner.costmodel import Workload, _Builder, predict, ulysses_block_seconds
from superoffload.planner.flops import layer_forward_flops, model_flops_per_token, step_model_flops
from superoffload.planner.hardware import GB
from superoffload.planner.memory import (
    BF16,
    FP32,
    activation_memory,
    checkpoint_host_bytes,
    loss_tile_rows,
    loss_transient,
    ulysses_kv_repeat,
)
from superoffload.planner.plan import Plan, PlanInfeasible, check_feasible, make_plan, positions_for
from superoffload.planner.presets import get_profile
from superoffload.planner.schedule import D2H, H2D
from superoffload.planner.systems import Options, system_spec
from superoffload.shapes import get_shape

GH = get_profile("gh200")
G13 = get_shape("gpt-13b")
M1 = 1 << 20


@pytest.fixture(scope="module")
def plan_1m() -> Plan:
    return make_plan(G13, M1, 1, GH, chips=8)


# ------------------------------------------------------------------------------------------ workload
def test_workload_checks_the_sequence_parallel_degree() -> None:
    w = Workload(G13, 8192, 1, chips=8, sp=4)
    assert (w.dp, w.local_seq, w.local_tokens) == (2, 2048, 2048)
    with pytest.raises(ValueError, match="sp=3 must divide chips=8"):
        Workload(G13, 8192, 1, chips=8, sp=3)
    with pytest.raises(ValueError, match="heads"):  # 32 heads over 3 ranks
        Workload(G13, 8190, 1, chips=6, sp=3)
    with pytest.raises(ValueError, match="seq=8191 must be divisible by sp=2"):
        Workload(G13, 8191, 1, chips=2, sp=2)
    with pytest.raises(ValueError, match="needs activation checkpointing"):
        Workload(G13, 8192, 1, False, offload_checkpoints=True)
    with pytest.raises(ValueError, match="loss_tile"):
        Workload(G13, 8192, 1, loss_tile=0)
    with pytest.raises(ValueError, match="positive integer"):
        Workload(G13, 8192, 1, sp=0)


def test_gqa_heads_follow_ulysses_rules() -> None:
    """KV heads are sharded when SP divides them and repeated when they divide SP (sequence/ulysses.py)."""
    assert ulysses_kv_repeat(32, 8, 4) == 1 and ulysses_kv_repeat(32, 8, 16) == 2
    with pytest.raises(ValueError, match="KV heads"):
        ulysses_kv_repeat(40, 8, 20)  # qwen3-14b's 40 heads / 8 KV heads over 20 ranks
    qwen = get_shape("qwen3-14b")
    with pytest.raises(ValueError, match="KV heads"):
        Workload(qwen, 8000, 1, chips=20, sp=20)


# ------------------------------------------------------------------------------------------ FLOPs, time
def test_per_rank_flops_and_honest_model_flops() -> None:
    """A rank computes 1/sp of the matmuls and 1/sp of the full-sequence attention (heads/sp heads over the
    whole sequence); model FLOPs per chip are 6N + causal attention over the global sequence for its tokens."""
    full, part = layer_forward_flops(G13, 65536, 1), layer_forward_flops(G13, 65536, 1, sp=8)
    assert part.matmul == pytest.approx(full.matmul / 8) and part.attention == pytest.approx(full.attention / 8)
    assert part.attention == pytest.approx(2.0 * 65536**2 * (G13.heads // 8) * G13.head_dim)
    w = Workload(G13, 65536, 1, chips=8, sp=8, offload_checkpoints=True)
    p = predict("superoffload", w, GH, Options(flow_layers=tuple(range(G13.layers))))
    per_chip = model_flops_per_token(G13, 65536) * 65536 / 8
    assert p.tflops * 1e12 * p.step_time_s == pytest.approx(per_chip)
    assert per_chip == pytest.approx(step_model_flops(G13, 65536, 8192))
    assert p.tokens_per_s == pytest.approx(8192 / p.step_time_s)
    assert p.aggregate_tokens_per_s == pytest.approx(65536 / p.step_time_s)  # one sequence over 8 chips
    assert p.options["sp"] == 8 and p.hfu > p.mfu


def test_nothing_changes_with_sp_1_and_the_flags_off() -> None:
    shape = get_shape("gpt-1b")
    for chips in (1, 4):
        a = predict("superoffload", Workload(shape, 1024, 4, chips=chips), GH)
        b = predict("superoffload", Workload(shape, 1024, 4, chips=chips, sp=1, offload_checkpoints=False,
                                             loss_tile=None), GH)
        assert a == b
        assert not {"all_to_all", "ckpt_d2h", "ckpt_h2d"} & set(a.stage_s)
        assert "activation_checkpoints" not in a.memory["host"] and "sp" not in a.options


def _a2a_expected(w: Workload, per_node: int) -> float:
    sh = w.shape
    nbytes = BF16 * w.local_tokens * (2 * sh.hidden + 2 * sh.n_kv_heads * sh.head_dim)  # q, out, k, v
    if per_node >= w.sp:
        return 4 * GH.intra_node_latency_s + (w.sp - 1) / w.sp * nbytes / (GH.intra_node_gbps * GB)
    intra = (per_node - 1) / w.sp * nbytes / (GH.intra_node_gbps * GB)
    inter = (w.sp - per_node) / w.sp * nbytes / (GH.inter_node_gbps * GB)
    return 4 * GH.inter_node_latency_s + max(intra, inter)


def test_all_to_alls_per_block_on_the_link_class_of_the_sp_group() -> None:
    """Forward: q, k, v in and the output back; recompute again; backward their transposes: 3 x 4 calls per
    block, alpha + bytes (sp-1)/sp over NVLink inside a node; across nodes the off-node share leaves through
    each chip's NIC while the on-node share takes NVLink."""
    inside = Workload(G13, 65536, 1, chips=4, sp=4)
    across = Workload(G13, 65536, 1, chips=8, sp=8, ranks_per_node=2)
    assert ulysses_block_seconds(inside, GH) == pytest.approx(_a2a_expected(inside, 4))
    assert ulysses_block_seconds(across, GH) == pytest.approx(_a2a_expected(across, 2))
    # the same bytes per rank over the network cost far more than over NVLink
    assert ulysses_block_seconds(dataclasses.replace(inside, ranks_per_node=1), GH) > 5 * ulysses_block_seconds(
        inside, GH)
    flow = Options(flow_layers=tuple(range(G13.layers)))
    p = predict("superoffload", inside, GH, flow)
    assert p.stage_s["all_to_all"] == pytest.approx(3 * G13.layers * _a2a_expected(inside, 4))
    nock = predict("superoffload", dataclasses.replace(inside, activation_checkpointing=False), GH, flow)
    assert nock.stage_s["all_to_all"] == pytest.approx(2 * G13.layers * _a2a_expected(inside, 4))
    assert ulysses_block_seconds(Workload(G13, 65536, 1, chips=8), GH) == 0.0


def test_checkpoint_offload_traffic_on_the_link_resources() -> None:
    """Each block's input goes D2H in forward and comes back H2D in backward (the last block's on demand, after
    the forward's copies; every other one prefetched when the next block's recompute starts)."""
    w = Workload(G13, 32768, 1, offload_checkpoints=True)
    opts = Options(flow_layers=tuple(range(40, G13.layers)))
    p = predict("superoffload", w, GH, opts)
    one = BF16 * G13.hidden * 32768
    assert p.stage_s["ckpt_d2h"] == pytest.approx(G13.layers * GH.link("d2h").seconds(one))
    assert p.stage_s["ckpt_h2d"] == pytest.approx(G13.layers * GH.link("h2d").seconds(one))
    b = _Builder(w, GH, system_spec("superoffload", opts, G13.total_params()))
    g = b.build(iterations=1)
    ops = {op.name: (i, op) for i, op in enumerate(g.ops)}
    last = G13.layers - 1
    assert ops[f"it0.ckpt_d2h{last}"][1].resource == D2H and ops[f"it0.ckpt_h2d{last}"][1].resource == H2D
    assert ops[f"it0.ckpt_d2h{last}"][0] in ops[f"it0.ckpt_h2d{last}"][1].deps  # one side stream, in order
    assert ops[f"it0.ckpt_h2d{last}"][0] in ops[f"it0.rec{last}"][1].deps
    assert ops[f"it0.ckpt_h2d{last - 1}"][0] in ops[f"it0.rec{last - 1}"][1].deps
    # the weight fetches of flowed layers share the H2D resource with the checkpoints
    assert ops[f"it0.fetch_b{last}"][1].resource == H2D
    # the copies hide under compute at this length
    base = predict("superoffload", dataclasses.replace(w, offload_checkpoints=False), GH, opts)
    assert p.step_time_s == pytest.approx(base.step_time_s, rel=1e-3)


def test_tiled_loss_recomputes_the_logits_and_forms_the_weight_gradient_in_fp32() -> None:
    w = Workload(G13, 32768, 1)
    tiled = dataclasses.replace(w, loss_tile=4096)
    a, b = predict("torch", w, GH), predict("torch", tiled, GH)
    gemm = 2.0 * G13.head_params() * 32768
    extra = gemm / GH.device_matmul_flops + gemm / GH.fp32_matmul_flops() - gemm / GH.device_matmul_flops
    assert b.stage_s["backward"] - a.stage_s["backward"] == pytest.approx(extra)
    assert GH.fp32_matmul_flops() < GH.device_matmul_flops / 10  # Hopper: 67 vs 989 TFLOP/s peak


# ------------------------------------------------------------------------------------------ memory
def test_offloaded_checkpoints_leave_a_two_block_window() -> None:
    sh, seq, p = G13, 32768, BF16
    one = p * sh.hidden * seq
    on, off = (activation_memory(sh, seq, 1, True, offload_checkpoints=o) for o in (True, False))
    assert off["activations"] == sh.layers * one and on["activations"] == 2 * one
    assert on["backward_transients"] == off["backward_transients"]
    assert checkpoint_host_bytes(sh, seq, 1) == sh.layers * one
    m = predict("superoffload", Workload(sh, seq, 1, offload_checkpoints=True), GH).memory
    assert m["host"]["activation_checkpoints"] == sh.layers * one and "activation_checkpoints" in m["pinned_keys"]
    peer = predict("zero_offload", Workload(sh, seq, 1, offload_checkpoints=True), GH).memory
    assert peer["host"]["activation_checkpoints"] == sh.layers * one


def test_per_rank_memory_scales_with_sp() -> None:
    """A rank's activations, checkpoints and loss are those of seq/sp tokens; a block adds its all-to-all
    buffers (two copies of the widest of q, k, v, output)."""
    sh, seq = G13, 65536
    one, eight = activation_memory(sh, seq, 1, True), activation_memory(sh, seq, 1, True, sp=8)
    assert eight["activations"] * 8 == one["activations"]
    assert checkpoint_host_bytes(sh, seq, 1, sp=8) * 8 == checkpoint_host_bytes(sh, seq, 1)
    assert loss_transient(sh, seq // 8) * 8 == loss_transient(sh, seq)
    local = activation_memory(sh, seq // 8, 1, True)
    a2a = 2 * BF16 * (seq // 8) * sh.hidden
    assert max(eight["backward_transients"] - local["backward_transients"], 0) <= a2a
    # the block dominates once the loss is tiled: its transient is the local block's plus the buffers
    t = activation_memory(sh, seq, 1, True, sp=8, loss_tile=1024)
    assert t["backward_transients"] == activation_memory(sh, seq // 8, 1, True, loss_tile=1024)[
        "backward_transients"] + a2a


def test_tiled_loss_transient() -> None:
    sh, tokens = G13, 131072
    plain = loss_transient(sh, tokens)
    assert plain == 3 * FP32 * tokens * sh.vocab
    tiled = loss_transient(sh, tokens, BF16, 4096)
    assert tiled == 16 * 4096 * sh.vocab + FP32 * sh.hidden * sh.vocab + BF16 * tokens * sh.hidden
    assert tiled < plain / 10
    assert loss_tile_rows(1000, 300) == 250  # 4 near-equal tiles, no remainder tile


def test_tiled_loss_transient_against_the_simulated_devices_ledger() -> None:
    """The loss function alone on `sim` (every allocation measured): the plain backward peaks at three fp32
    [tokens, vocab] tensors; the tiled one at 16 B per tile row and vocab entry (bf16 logits) plus the fp32
    weight-gradient accumulator and the hidden-state gradient (`loss_transient`)."""
    torch = pytest.importorskip("torch")
    from superoffload.device import get_device
    from superoffload.sequence.loss import tiled_token_losses, token_losses
    from superoffload.shapes import ModelShape

    def peak(t: int, h: int, v: int, tile: int | None) -> int:
        dev = get_device("sim")
        with dev.tracking():
            hid = torch.randn(t, h).to(torch.bfloat16).requires_grad_()
            w = torch.randn(v, h).to(torch.bfloat16).requires_grad_()
            y = torch.randint(0, v, (t,))
        base = dev.ledger.report()["device_live"]["activations"]
        dev.reset_peak_memory()
        with dev.tracking():
            losses = token_losses(hid, w, y) if tile is None else tiled_token_losses(hid, w, y, tile=tile)
            losses.sum().backward()
        return dev.ledger.report()["device_peak_bytes"] - base

    for t, h, v in ((256, 32, 2048), (512, 128, 1024)):
        sh = ModelShape(name="loss", layers=1, hidden=h, heads=1, vocab=v, ffn_hidden=4 * h)
        assert peak(t, h, v, None) == pytest.approx(loss_transient(sh, t), rel=1e-3)
        for tile in (64, 100):
            assert peak(t, h, v, tile) == pytest.approx(loss_transient(sh, t, BF16, tile), rel=0.01)


def test_ulysses_baseline_is_zero3_on_the_device() -> None:
    """DeepSpeed-Ulysses on ZeRO-3 without offload: 16 B/param over the world on the device, the layer in use
    and the next gathered, per-layer all-gathers in forward and backward, a reduce-scatter per bucket, Adam
    on the device; nothing on the host but the offloaded checkpoints."""
    shape = positions_for(G13, 131072)
    w = Workload(shape, 131072, 1, chips=8, ranks_per_node=2, sp=8, offload_checkpoints=True)
    p = predict("ulysses", w, GH)
    n = shape.total_params()
    dev = p.memory["device"]
    assert dev["params_bf16"] + dev["grads_bf16"] + dev["optimizer_state"] == pytest.approx(16 * n / 8)
    assert dev["gathered_params"] == BF16 * (131072 * shape.hidden + shape.block_params())  # position table + a layer
    assert set(p.memory["host"]) == {"reserve", "activation_checkpoints"}
    assert {"all_gather", "reduce_scatter", "device_adam", "all_to_all"} <= set(p.stage_s)
    assert not {"host_adam", "d2h", "h2d"} & set(p.stage_s)
    layer_ag = GH.all_to_all_seconds(1, 1) + 7 / 8 * BF16 * shape.block_params() / (GH.inter_node_gbps * GB)
    assert p.stage_s["all_gather"] >= 2 * G13.layers * layer_ag
    with pytest.raises(ValueError, match="unknown system"):
        predict("megatron", w, GH)


# ------------------------------------------------------------------------------------------ planner
def test_a_request_that_fits_turns_nothing_on() -> None:
    plan = make_plan(get_shape("gpt-1b"), 1024, 4, GH, chips=4)
    assert (plan.sp, plan.offload_checkpoints, plan.loss_tile) == (1, False, None)
    # weight flow alone fits: the model-side pieces stay off (existing plans are unchanged)
    flowed = make_plan(G13, 16384, 1, GH, hbm_budget=40e9)
    assert flowed.flow_layers and (flowed.sp, flowed.offload_checkpoints, flowed.loss_tile) == (1, False, None)


def test_one_million_tokens_on_eight_chips(plan_1m: Plan) -> None:
    """The paper's headline point: the planner raises SP to the smallest degree that fits (4: at 2 nothing
    fits), keeps the checkpoints in host memory, tiles the loss, and flows what weights it still must;
    every choice has a reason. The 1M-row position table (4.29B elements) is split over buckets, so the
    staging ring follows the bucket size (it was two slots of the whole table, 19.3 GB, when a bucket
    held whole tensors; sp=4 did not fit then)."""
    p = plan_1m
    assert (p.sp, p.offload_checkpoints) == (4, True) and p.loss_tile and p.loss_tile < M1 // p.sp
    # replicated state would plan sp=8 (its checkpoints no longer fit the host at 4): half the step, half the
    # tokens; priced per token it is slower, so the optimizer state stays sharded
    assert not p.replicate and p.alternatives["replicate"]["runner_up"] is True
    assert any(r.startswith("Optimizer state: sharded") and "which plans sp=8" in r for r in p.reasons)
    pred = p.predicted
    assert pred.fits and pred.peak_hbm_bytes <= p.hbm_budget_bytes
    assert pred.memory["host"]["activation_checkpoints"] == checkpoint_host_bytes(positions_for(G13, M1), M1, 1, sp=4)
    assert pred.memory["device"]["staging"] < 1e9  # bucket-sized, not table-sized
    text = "\n".join(p.reasons)
    for needle in ("Positions: gpt-13b learns absolute positions", "Sequence parallelism: sp=4",
                   "Loss: tiled", "Checkpoints: in host memory", "Chips: 8 ranks = 2 data-parallel groups x sp 4"):
        assert needle in text
    with pytest.raises(PlanInfeasible):
        check_feasible(G13, M1, 1, GH, chips=8, sp=2)
    check_feasible(G13, M1, 1, GH, chips=8)
    check_feasible(G13, M1, 1, GH, chips=8, sp=8)


def test_given_pieces_are_kept() -> None:
    plan = make_plan(G13, 65536, 1, GH, chips=8, ranks_per_node=2, sp=4, offload_checkpoints=True, loss_tile=8192)
    assert (plan.sp, plan.offload_checkpoints, plan.loss_tile) == (4, True, 8192)
    assert any(r.startswith("Sequence parallelism: sp=4 (Ulysses; as requested)") for r in plan.reasons)
    assert any("tokens per tile, as requested" for r in plan.reasons)
    with pytest.raises(PlanInfeasible):  # checkpoints kept on the device and the plain loss: no SP helps
        make_plan(G13, M1, 1, GH, chips=8, offload_checkpoints=False, loss_tile=0)
    with pytest.raises(ValueError, match="sp=3 must divide chips=8"):
        make_plan(G13, 65536, 1, GH, chips=8, sp=3)
    with pytest.raises(ValueError, match="loss_tile"):
        make_plan(G13, 65536, 1, GH, loss_tile=-1)


def test_one_chip_offloads_checkpoints_where_flow_is_not_enough() -> None:
    plan = make_plan(G13, 131072, 1, GH)
    assert plan.sp == 1 and plan.offload_checkpoints
    with pytest.raises(PlanInfeasible, match="activation checkpoints in host memory"):
        make_plan(G13, 131072, 1, GH, offload_checkpoints=False)


def test_plan_round_trips_and_old_plans_still_read(plan_1m: Plan) -> None:
    d = json.loads(json.dumps(plan_1m.to_dict()))
    back = Plan.from_dict(d)
    assert (back.sp, back.offload_checkpoints, back.loss_tile) == (plan_1m.sp, True, plan_1m.loss_tile)
    assert back.workload(G13).sp == plan_1m.sp > 1
    old = {k: v for k, v in d.items() if k not in ("sp", "offload_checkpoints", "loss_tile")}
    legacy = Plan.from_dict(old)
    assert (legacy.sp, legacy.offload_checkpoints, legacy.loss_tile) == (1, False, None)


# ------------------------------------------------------------------------------------------ explain
def test_explain_one_million_tokens_prints_memory_by_category(capsys) -> None:
    from superoffload.cli.main import main

    assert main(["explain", "--seq", str(M1), "--chips", "8", "--model", "gpt-13b", "--hardware", "gh200"]) == 0
    out = capsys.readouterr().out
    for needle in ("sp                 4", "offload_checkpoints true", "Memory by category (per rank):",
                   "activation_checkpoints", "backward_transients", "master_m_v", "pinned"):
        assert needle in out
    assert main(["explain", "--seq", "65536", "--chips", "8", "--sp", "4", "--ranks-per-node", "2"]) == 0
    assert "sp                 4" in capsys.readouterr().out


@pytest.mark.parametrize("argv,says", [
    (["--chips", "8", "--sp", "3"], "--sp 3 must divide --chips 8"),
    (["--chips", "6", "--sp", "3", "--seq", "8190"], "sp=3 must divide the attention heads (32)"),
    (["--chips", "4", "--sp", "4", "--seq", "8190"], "--seq 8190 must be divisible by --sp 4"),
    (["--sp", "0"], "--sp must be a positive integer"),
    (["--loss-tile", "-5"], "--loss-tile must be >= 0"),
])
def test_explain_bad_long_sequence_input_is_one_line(capsys, argv, says) -> None:
    from superoffload.cli.main import main

    assert main(["explain", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err


def test_one_kv_repeat_rule_for_the_planner_and_the_sequence_package() -> None:
    """The planner prices the rule the sequence package runs: one function (superoffload.shapes), which checks
    the heads against the KV heads on both sides."""
    from superoffload import shapes
    from superoffload.planner import memory
    from superoffload.sequence import kv_repeat_factor

    assert memory.ulysses_kv_repeat is shapes.ulysses_kv_repeat is kv_repeat_factor
    with pytest.raises(ValueError, match="not a multiple of the KV heads: heads=6, kv_heads=4, SP=2"):
        shapes.ulysses_kv_repeat(6, 4, 2)
