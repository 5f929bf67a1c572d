"""Ulysses sequence parallelism on gloo ranks (127.0.0.1) against one process on the same global batch.

The ranks run ``_worker.py`` once per SP degree (every scenario in one launch, to keep the module fast)
and report what they measured; these tests assert on it. Gradients are summed over the ranks (no
averaging) with the token-normalized loss; "mean" compares with the model's own mean loss at SP=1,
"normalized" with the same token-normalized loss at SP=1.
"""

from __future__ import annotations

import pytest

from superoffload.sequence import kv_repeat_factor
from tests.sequence._launch import run_ranks
from tests.sequence._worker import ATTENTION_CASES, ERROR_CASES, SCENARIOS

MODEL_SCENARIOS = [s for s in SCENARIOS if s != "attention"]


@pytest.fixture(scope="module")
def sp2(tmp_path_factory) -> list[dict]:
    return run_ranks(2, list(SCENARIOS), tmp_path_factory.mktemp("sp2"))


def _check_attention(results: list[dict], world: int) -> None:
    for rank, res in enumerate(results):
        att = res["attention"]
        for heads, kv in ATTENTION_CASES[world]:
            case = att[f"h{heads}kv{kv}"]
            where = f"SP={world} rank {rank} heads={heads} kv_heads={kv}: {case}"
            assert case["forward_equal"], where                 # fp32 forward: bit-exact
            for g in ("dq_rel", "dk_rel", "dv_rel"):
                assert case[g] <= 1e-6, where
        for heads, kv in ERROR_CASES[world]:
            msg = att["errors"][f"h{heads}kv{kv}"]
            assert f"heads={heads}" in msg and f"kv_heads={kv}" in msg and f"SP={world}" in msg, msg


def _check_models(results: list[dict], world: int) -> None:
    for rank, res in enumerate(results):
        for scenario in MODEL_SCENARIOS:
            for ref in ("mean", "normalized"):
                c = res[scenario][ref]
                where = f"SP={world} rank {rank} {scenario} vs SP=1 {ref}: {c}"
                assert c["same_params"], where
                assert c["loss_rel"] <= 1e-5, where
                assert c["grad_rel"] <= 1e-5, where
    assert all(res["llama_bare"]["labels_refused"] for res in results)


def test_ulysses_attention_sp2(sp2) -> None:
    _check_attention(sp2, 2)


def test_models_sp2_match_sp1(sp2) -> None:
    _check_models(sp2, 2)


@pytest.mark.slow
def test_sp4(tmp_path) -> None:
    """Four ranks on two cores: the longest test of this folder (39 s beside other jobs, the two-rank launch 17 s),
    so the slow variant of the SP=2 tests, which run the same scenarios, head layouts (a KV head repeated for
    two ranks among them) and refusals at two ranks."""
    results = run_ranks(4, list(SCENARIOS), tmp_path)
    _check_attention(results, 4)
    _check_models(results, 4)


def test_head_split_rules() -> None:
    assert kv_repeat_factor(8, 8, 4) == 1      # MHA
    assert kv_repeat_factor(8, 4, 4) == 1      # GQA, KV heads sharded directly
    assert kv_repeat_factor(8, 2, 4) == 2      # GQA, each KV head repeated for 2 ranks
    assert kv_repeat_factor(8, 1, 8) == 8      # MQA
    with pytest.raises(ValueError, match=r"heads=6, kv_heads=6, SP=4"):
        kv_repeat_factor(6, 6, 4)
    with pytest.raises(ValueError, match=r"heads=12, kv_heads=3, SP=4"):
        kv_repeat_factor(12, 3, 4)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_sp1_without_torch_distributed_and_disable(name: str) -> None:
    """Without torch.distributed the same setup runs one process; disable() restores the model exactly."""
    import torch

    from superoffload.models import build_model, get_shape
    from superoffload.sequence import enable_sequence_parallel

    shape = get_shape(name)
    model = build_model(shape, seq=32, seed=0)
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randint(0, shape.vocab, (2, 32), generator=g) for _ in range(2))
    before = model(x, y)
    sp = enable_sequence_parallel(model, loss_tile=16)
    assert (sp.sp, sp.rank, sp.position_offset(32)) == (1, 0, 0)
    assert torch.equal(sp.shard(x), x)
    normalized = model(x, y)
    assert abs(normalized.item() - before.item()) <= 1e-6 * before.item()
    assert torch.equal(sp.global_loss(normalized), normalized.detach())
    sp.disable()
    assert torch.equal(model(x, y), before)


def test_enable_twice_is_an_error() -> None:
    from superoffload.models import build_model, get_shape
    from superoffload.sequence import enable_sequence_parallel

    model = build_model(get_shape("gpt-tiny"), seq=16, seed=0)
    sp = enable_sequence_parallel(model)
    with pytest.raises(RuntimeError, match="already enabled"):
        enable_sequence_parallel(model)
    sp.disable()
    enable_sequence_parallel(model).disable()
