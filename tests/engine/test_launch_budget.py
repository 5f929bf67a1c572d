"""The launch within its budget, counted on the simulated device with the CUDA backend's kernels (counts are
deterministic; times here are not): what the engine adds over plain torch (foreach AdamW after
`clip_grad_norm_`) on the same bf16 model, per bucket, in forward + backward and in the step.

Budget (docs/engine.md, "The launch budget"): at most 6 extra aten ops per host bucket and 3 per tail bucket
in forward + backward, whatever a bucket's bytes; the step no more ops than torch's; at most 25 engine
Python calls per bucket on the training thread."""

from __future__ import annotations

import pytest
import torch

import superoffload
from superoffload.harness.launch_counts import compare, count_engine_step, count_torch_step
from superoffload.harness.models import build_model, get_shape

OPT = {"lr": 1e-3, "weight_decay": 0.1}


def _model() -> torch.nn.Module:
    # checkpointed, as the sweep trains: the recompute runs the modules' forward hooks again
    model = build_model(get_shape("gpt-tiny"), seq=64, seed=0, activation_checkpointing=True)
    return model.to(torch.bfloat16)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 1024, (2, 64), generator=g)
    return x, torch.roll(x, -1, 1)


def _counts(bucket_size: int, tail: int) -> dict:
    model = _model()
    engine = superoffload.initialize(model, {"optimizer": OPT, "device": "sim", "precision": "bf16",
                                             "bucket_size": bucket_size, "device_tail_buckets": tail,
                                             "grad_clip": 1.0, "speculation": True})
    try:
        mine = count_engine_step(engine, model, _batch())
    finally:
        engine.close()
    ref = _model()
    opt = torch.optim.AdamW(ref.parameters(), foreach=True, **OPT)
    return compare(mine, count_torch_step(ref, opt, _batch(), clip=1.0))


@pytest.fixture(scope="module")
def host_small() -> dict:
    return _counts(bucket_size=20_000, tail=0)


@pytest.fixture(scope="module")
def host_large() -> dict:
    return _counts(bucket_size=200_000, tail=0)


@pytest.fixture(scope="module")
def all_tail() -> dict:
    return _counts(bucket_size=20_000, tail=10_000)


def test_host_buckets_add_at_most_six_ops_each_whatever_their_bytes(host_small, host_large):
    for c in (host_small, host_large):
        assert c["buckets_device"] == 0 and c["buckets_host"] > 1
        assert c["forward_backward"]["extra_per_host_bucket"]["aten_ops"] <= 6, c["forward_backward"]["extra"]
    # ten times the bytes per bucket: no more ops per bucket
    assert host_small["buckets_host"] > 2 * host_large["buckets_host"]
    small = host_small["forward_backward"]["extra_per_host_bucket"]["aten_ops"]
    large = host_large["forward_backward"]["extra_per_host_bucket"]["aten_ops"]
    assert large <= small + 1


def test_tail_buckets_add_at_most_three_ops_each(all_tail):
    assert all_tail["buckets_host"] == 0 and all_tail["buckets_device"] > 1
    assert all_tail["forward_backward"]["extra_per_tail_bucket"]["aten_ops"] <= 3, all_tail["forward_backward"]


def test_the_tail_step_issues_no_more_ops_than_torchs_step(all_tail):
    step = all_tail["step"]
    assert step["engine"]["aten_ops"] <= step["torch"]["aten_ops"], step


def test_engine_python_calls_per_bucket_on_the_training_thread(host_small, all_tail):
    for c in (host_small, all_tail):
        buckets = c["buckets_host"] + c["buckets_device"]
        calls = c["total"]["engine"]["py_engine"]
        assert calls / buckets <= 25, (calls, buckets)


def test_no_host_synchronization_during_backward(host_small):
    assert host_small["forward_backward"]["engine"]["host_syncs"] == 0
