"""The torch baseline and the engine split weight decay alike, so a comparison between them is fair.

The engine's default groups (superoffload/engine/params.py, ``weight_decay_split``) and the harness's
(``torch_system.split_decay_groups``, also used by the DeepSpeed and FSDP baselines; finetune's convergence
check builds the same groups) both split by ``engine.params.decay_split``; this test keeps the groups they
hand their optimizers one rule: matrices decay, biases, norms and other 1-D parameters do not, tied weights
count once and frozen parameters are left out."""

from __future__ import annotations

import pytest

from superoffload.engine.config import SuperOffloadConfig
from superoffload.engine.params import build_param_groups
from superoffload.harness.systems.torch_system import split_decay_groups
from superoffload.models import build_model, get_shape


def _partition(groups: list[dict]) -> list[tuple[float, list[int]]]:
    return [(g["weight_decay"], [id(p) for p in g["params"]]) for g in groups if g["params"]]


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_the_torch_baseline_and_the_engine_split_weight_decay_alike(name: str) -> None:
    model = build_model(get_shape(name), seq=32, seed=0)
    frozen = [p for p in model.parameters() if p.dim() < 2][0]
    frozen.requires_grad_(False)   # left out by both
    cfg = SuperOffloadConfig.from_any({"optimizer": {"weight_decay": 0.1}})
    engine = _partition(build_param_groups(model, cfg, None))
    baseline = _partition(split_decay_groups(model, 0.1))
    assert engine == baseline
    assert [wd for wd, _ in engine] == [0.1, 0.0] and id(frozen) not in engine[1][1]
