"""A DeepSpeed training loop ports by changing `deepspeed.initialize` to `superoffload.initialize`."""

from __future__ import annotations

import pytest
import torch

import superoffload
from superoffload.engine import ConfigError
from superoffload.engine.deepspeed_compat import translate
from tests.engine.helpers import assert_state_equal, batches, make_model

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "sub_group_size": 40_000,
                          "offload_optimizer": {"device": "cpu", "super_offload": True, "ratio": 0.9}},
    "steps_per_print": 100,
}


def _loop(engine, data, steps=3):
    for i in range(steps):
        b = data.batch_at(i)
        for x, y in zip(b.inputs, b.targets, strict=True):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()  # DeepSpeed calls step() every micro-batch: a no-op between boundaries
    engine.synchronize()
    return engine


def test_a_deepspeed_loop_runs_unchanged_and_equals_the_native_call():
    data = batches(accum=2)
    model = make_model()
    engine, optimizer, loader, sched = superoffload.initialize(
        model=model, model_parameters=model.parameters(), config=DS_CONFIG,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    assert optimizer is engine.optimizer and loader is None and sched.optimizer is engine.optimizer
    assert engine.config.precision == "bf16" and engine.config.grad_accum == 2 and engine.config.bucket_size == 40_000
    assert engine.module is model and engine.get_lr() == [2e-3]
    _loop(engine, data)
    native = _loop(superoffload.initialize(make_model(), {
        "optimizer": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}, "precision": "bf16",
        "grad_accum": 2, "grad_clip": 1.0, "bucket_size": 40_000, "weight_decay_split": False}), data)
    assert_state_equal(engine.state_dict(), native.state_dict())
    assert engine.global_steps == 3 and engine.get_global_grad_norm() > 0


def test_deepspeed_checkpoints_round_trip(tmp_path):
    data = batches()
    model = make_model()
    engine, *_ = superoffload.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
    _loop(engine, data, 2)
    engine.save_checkpoint(str(tmp_path), client_state={"epoch": 3})
    model2 = make_model(seed=7)
    other, *_ = superoffload.initialize(model=model2, model_parameters=model2.parameters(), config=DS_CONFIG)
    path, client = other.load_checkpoint(str(tmp_path))
    assert client == {"epoch": 3} and path.endswith("rank0.pt")
    assert_state_equal(other.state_dict(), engine.state_dict())


@pytest.mark.parametrize("cfg,msg", [
    ({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}, "Adam"),
    ({"scheduler": {"type": "WarmupLR"}}, "torch LR scheduler"),
    ({"zero_optimization": {"stage": 3, "mystery": 1}}, r"zero_optimization\.mystery"),
    ({"fp16": {"enabled": True, "loss_scale": 128}}, "static fp16 loss_scale"),
    ({"gradient_clipping": 1.0, "hybrid_engine": {}}, "hybrid_engine"),
])
def test_deepspeed_keys_without_an_equivalent_are_refused(cfg, msg):
    with pytest.raises(ConfigError, match=msg):
        translate(cfg)


def test_fp16_loss_scale_keys_translate():
    out = translate({"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 500,
                              "min_loss_scale": 2}})
    assert out == {"precision": "fp16", "loss_scale": {"init_scale": 4096.0, "growth_interval": 500,
                                                       "min_scale": 2}}
