"""DeepSpeed training scripts with only the import changed (`import superoffload as deepspeed`): the call
shape, the config through `args`, a DeepSpeed optimizer object, `training_data=`, schedulers, batch sizes,
checkpoints and DeepSpeed's engine names."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import superoffload
from superoffload.engine import ConfigError
from superoffload.integrations.deepspeed import batch_sizes, translate
from tests.engine.helpers import assert_state_equal, batches, make_model
from tests.integrations.tiny import tiny_llama, token_batches

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
    ({"zero_optimization": {"stage": 3, "mystery": 1}}, r"zero_optimization\.mystery"),
    ({"fp16": {"enabled": True, "loss_scale": 128}}, "static fp16 loss_scale"),
    ({"gradient_clipping": 1.0, "hybrid_engine": {}}, "hybrid_engine"),
])
def test_deepspeed_keys_without_an_equivalent_are_refused(cfg, msg):
    with pytest.raises(ConfigError, match=msg):
        translate(cfg)


def test_fp16_loss_scale_keys_translate():
    out = translate({"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 500,
                              "min_loss_scale": 2}}).engine
    assert out == {"precision": "fp16", "loss_scale": {"init_scale": 4096.0, "growth_interval": 500,
                                                       "min_scale": 2}}


# --- the shape of DeepSpeed's own SuperOffload fine-tuning example -------------------------------------
EXAMPLE_CONFIG = {  # DeepSpeedExamples training/DeepSpeed-SuperOffload: the 1-GPU SuperOffload config
    "train_batch_size": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "overlap_comm": False, "reduce_bucket_size": 4e8, "sub_group_size": 4e8,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.90,
                                                "super_offload": True, "cpuadam_cores_perc": 0.90}},
    "wall_clock_breakdown": True,
}


class Alpaca(torch.utils.data.Dataset):
    """Tokenized rows as the example's dataset holds them (input_ids, attention_mask, labels)."""

    def __init__(self, n: int = 16) -> None:
        self.ids = torch.cat(token_batches(n, batch=1, seq=16, seed=11))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def example_script(argv: list[str], steps: int, model=None, load_dir: str | None = None, save_dir: str | None = None):
    """The example's main(), unchanged but for its first import."""
    import argparse

    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from transformers import default_data_collator

    import superoffload as deepspeed
    from superoffload import comm as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    model = model or tiny_llama()
    optimizer = DeepSpeedCPUAdam(model.parameters(), lr=args.lr, betas=(0.9, 0.999))
    model_engine, optimizer, train_dataloader, _ = deepspeed.initialize(
        args=args, model=model, optimizer=optimizer, training_data=Alpaca(), collate_fn=default_data_collator)
    if load_dir:
        model_engine.load_checkpoint(load_dir)
    model_engine.train()
    losses, start = [], model_engine.global_steps
    for i, batch in enumerate(train_dataloader):
        if i < start:
            continue  # resumed: the batches the checkpointed steps used
        if model_engine.global_steps >= steps:
            break
        batch = {k: v.to(model_engine.device) for k, v in batch.items()}
        loss = model_engine(**batch).loss
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())
    if save_dir and dist.get_rank() == 0:
        model_engine.save_checkpoint(save_dir)
    return model_engine, losses


def test_the_superoffload_example_script_runs_with_only_the_import_changed(tmp_path, caplog):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(EXAMPLE_CONFIG))
    with caplog.at_level(logging.WARNING, logger="superoffload.integrations.deepspeed"):
        engine, losses = example_script(["--deepspeed", "--deepspeed_config", str(path)], steps=4)
    assert engine.config.precision == "bf16" and next(engine.module.parameters()).dtype == torch.bfloat16
    assert isinstance(engine.device, torch.device) and engine.train_micro_batch_size_per_gpu() == 4
    assert engine.config.bucket_size == 400_000_000 and engine.config.host_threads >= 1
    assert engine.config.optimizer.adamw and engine.get_lr() == [1e-3]  # from the DeepSpeedCPUAdam given
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(lines) == 1 and "ratio (the planner chooses" in lines[0] and "wall_clock_breakdown" in lines[0]
    assert len(losses) == 4 and engine.global_steps == 4


def test_the_example_script_saves_and_resumes_bit_for_bit(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**EXAMPLE_CONFIG, "train_batch_size": 2}))
    argv = ["--deepspeed_config", str(path)]
    full, _ = example_script(argv, steps=6)
    half, _ = example_script(argv, steps=3, save_dir=str(tmp_path / "ck"))
    assert (tmp_path / "ck" / "latest").read_text() == "global_step3"
    # a fresh model: the checkpoint carries the fp32 masters, moments and steps
    resumed, _ = example_script(argv, steps=6, model=tiny_llama(seed=9), load_dir=str(tmp_path / "ck"))
    assert resumed.global_steps == 6
    assert_state_equal(resumed.state_dict(), full.state_dict())


def test_a_client_optimizer_gives_groups_and_adam_w_mode_and_its_scheduler_drives_the_engine():
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    model = tiny_llama()
    opt = DeepSpeedCPUAdam([{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                            {"params": [p for p in model.parameters() if p.dim() < 2], "lr": 5e-4}],
                           lr=2e-3, adamw_mode=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # built on the script's optimizer
    engine, eopt, _, esched = superoffload.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                                      config={"train_micro_batch_size_per_gpu": 2})
    assert esched is sched and not engine.config.optimizer.adamw
    assert eopt.param_groups[0] is opt.param_groups[0]  # the very dicts: a change to either takes effect
    for ids in token_batches(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    assert engine.get_lr() == [2e-3 / 4, 5e-4 / 4]  # the engine stepped the scheduler after each step
    with pytest.raises(ConfigError, match="trains with Adam"):
        superoffload.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                config={"train_batch_size": 2})


@pytest.mark.parametrize("name,params", [
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 7}),
    ("WarmupLR", {"warmup_num_steps": 5, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_num_steps": 5}),
    ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 6, "warmup_min_ratio": 0.1}),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5, "cycle_second_step_size": 7,
                  "decay_step_size": 3, "decay_lr_rate": 0.1, "decay_mom_rate": 0.05}),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 6,
                  "cycle_first_stair_count": 3}),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 3, "lr_range_test_staircase": True}),
])
def test_scheduler_blocks_equal_deepspeeds_own_schedules(name, params):
    from deepspeed.runtime import lr_schedules as ds

    from superoffload.integrations import lr_schedules

    def opt():
        ps = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))]
        return torch.optim.AdamW([{"params": [ps[0]], "lr": 1e-3}, {"params": [ps[1]], "lr": 3e-3}])

    a, b = opt(), opt()
    theirs = getattr(ds, name)(a, **params)
    ours = lr_schedules.from_config({"type": name, "params": params}, b)
    for _ in range(30):
        assert [(g["lr"], tuple(g["betas"])) for g in a.param_groups] == \
            [(g["lr"], tuple(g["betas"])) for g in b.param_groups]
        a.step(), b.step(), theirs.step(), ours.step()


def test_a_config_scheduler_is_built_and_stepped_by_the_engine():
    model = make_model()
    cfg = {**DS_CONFIG, "gradient_accumulation_steps": 1,
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}}}
    engine, _, _, sched = superoffload.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    seen = []
    data = batches()
    for i in range(5):
        seen.append(engine.get_lr()[0])
        b = data.batch_at(i)
        engine.backward(engine(b.inputs[0], b.targets[0]))
        engine.step()
    assert seen == [0.0, 0.0, 2e-3 / 4, 2e-3 / 2, 2e-3 * 3 / 4]  # DeepSpeed's: iteration -1, then 0, 1, ...


@pytest.mark.parametrize("given,world,expect", [
    ({"train_batch_size": 8}, 2, (8, 4, 1)),
    ({"train_micro_batch_size_per_gpu": 2}, 2, (4, 2, 1)),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, 2, (16, 2, 4)),
    ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, 2, (16, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 2, (12, 2, 3)),
])
def test_batch_sizes_are_derived_as_deepspeed_derives_them(given, world, expect):
    assert batch_sizes(given.get("train_batch_size"), given.get("train_micro_batch_size_per_gpu"),
                       given.get("gradient_accumulation_steps"), world) == expect


def test_inconsistent_or_missing_batch_sizes_a_missing_config_or_optimizer_are_errors():
    with pytest.raises(ConfigError, match="do not agree"):
        batch_sizes(10, 2, 2, 2)
    with pytest.raises(ConfigError, match="neither train_batch_size"):
        batch_sizes(None, None, 2, 1)
    import argparse

    with pytest.raises(ConfigError, match="no DeepSpeed config"):
        superoffload.initialize(args=argparse.Namespace(deepspeed_config=None), model=make_model())
    with pytest.raises(ConfigError, match="no optimizer"):  # DeepSpeed would build none: not the defaults
        superoffload.initialize(model=make_model(), config={"train_batch_size": 2})


def test_auto_values_are_filled_where_the_trainer_would_fill_them_and_refused_elsewhere():
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}
    st = translate(cfg, fill={"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "bf16.enabled": True,
                              "optimizer.params.lr": 3e-4, "optimizer.params.weight_decay": 0.0})
    assert st.micro_batch == 2 and st.engine["grad_clip"] == 1.0 and st.engine["precision"] == "bf16"
    assert st.engine["optimizer"]["lr"] == 3e-4
    with pytest.raises(ConfigError, match="gradient_clipping: 'auto' is filled by the Hugging Face Trainer"):
        translate({"gradient_clipping": "auto"})


def test_training_data_becomes_a_loader_with_the_micro_batch_and_the_collate_fn():
    calls = []

    def collate(rows):
        calls.append(len(rows))
        return torch.stack([r["input_ids"] for r in rows])

    model = tiny_llama()
    _, _, loader, _ = superoffload.initialize(model=model, model_parameters=model.parameters(),
                                              training_data=Alpaca(10), collate_fn=collate,
                                              config={"train_batch_size": 4, "dataloader_drop_last": True,
                                                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    shapes = [b.shape for b in loader]
    assert shapes == [torch.Size([4, 16])] * 2 and calls == [4, 4]
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)


def test_load_checkpoint_without_latest_and_module_only(tmp_path, caplog):
    model = make_model()
    engine, *_ = superoffload.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
    with caplog.at_level(logging.WARNING):
        assert engine.load_checkpoint(str(tmp_path / "none")) == (None, None)
    assert "no 'latest'" in caplog.text
    _loop(engine, batches(accum=2), 2)
    engine.save_checkpoint(str(tmp_path), client_state={"k": 1})
    other, *_ = superoffload.initialize(model=make_model(seed=3), model_parameters=None, config=DS_CONFIG)
    path, client = other.load_checkpoint(str(tmp_path), load_module_only=True)
    assert client == {"k": 1} and other.global_steps == 0  # weights only: no optimizer state, no steps
    for a, b in zip(other.module.parameters(), engine.module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_native_call_returns_the_engine_and_the_boundary_can_be_set():
    model = make_model()
    engine = superoffload.initialize(model, {"grad_accum": 4}, model_parameters=model.parameters())
    assert isinstance(engine, superoffload.SuperOffloadEngine) and engine.world_size == 1 and engine.global_rank == 0
    data = batches(accum=2)
    b = data.batch_at(0)
    for k, (x, y) in enumerate(zip(b.inputs, b.targets, strict=True)):
        engine.set_gradient_accumulation_boundary(k == 1)  # a window of 2 though grad_accum is 4
        engine.backward(engine(x, y))
        assert engine.step() is (k == 1)
    assert engine.global_steps == 1
