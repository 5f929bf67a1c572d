"""SuperOffloadTrainer against transformers.Trainer(optim="adamw_torch") on the same model, data and seed,
and TRL's SFTTrainer through superoffload_trainer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
from transformers import Trainer, TrainerCallback  # noqa: E402

import superoffload  # noqa: E402
from superoffload.integrations.transformers import SuperOffloadTrainer, superoffload_trainer  # noqa: E402
from tests.integrations.scenarios import Rows, recording, trainer_arguments, trainer_run  # noqa: E402
from tests.integrations.tiny import decay_groups, max_rel, tiny_llama  # noqa: E402


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True


def run(cls, out, **kw):
    return trainer_run(out, cls=cls, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(Trainer, tmp_path_factory.mktemp("ref"))


@pytest.mark.parametrize("speculate", [False, True], ids=["planned", "speculating"])
def test_the_trainer_trains_as_with_adamw_torch(tmp_path, reference, speculate):
    """max_grad_norm clips some of the steps; with speculation forced on (the CPU plan may turn it
    off) the engine still overlaps under clipping, exactly."""
    ref = reference
    so = run(SuperOffloadTrainer, tmp_path / "so", config={"speculation": True, "speculation_policy": {
        "max_rollback_rate": 1.0}} if speculate else None)
    assert max_rel(ref.recorded, so.recorded) < 1e-5
    opt = so.optimizer.optimizer  # Accelerate's wrapper around superoffload.AdamW
    spec = opt.stats["speculation"]
    assert opt.engine.config.grad_clip == 2.0 and 0 < spec["clipped"] < spec["steps"]
    assert not speculate or spec["speculated"] == 5  # every step after the first (which measures the layout)
    ref_norms = [h["grad_norm"] for h in ref.state.log_history if "grad_norm" in h]
    so_norms = [h["grad_norm"] for h in so.state.log_history if "grad_norm" in h]
    assert len(so_norms) == 6 and max_rel(ref_norms, so_norms) < 1e-4  # the logged norm is the engine's
    assert [h["learning_rate"] for h in ref.state.log_history if "learning_rate" in h] == \
        [h["learning_rate"] for h in so.state.log_history if "learning_rate" in h]


def test_resume_from_checkpoint_continues_bit_for_bit(tmp_path):
    full = run(SuperOffloadTrainer, tmp_path / "full", save_strategy="steps", save_steps=3)
    part = run(SuperOffloadTrainer, tmp_path / "part", save_strategy="steps", save_steps=3, callbacks=[StopAt(3)])
    assert part.state.global_step == 3
    resumed = run(SuperOffloadTrainer, tmp_path / "part", save_strategy="steps", save_steps=3,
                  resume=str(tmp_path / "part" / "checkpoint-3"))
    assert resumed.recorded == full.recorded[len(part.recorded):]
    for a, b in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # the load-after-create trap: an optimizer passed in was built before the Trainer loaded the checkpoint's
    # weights (here on other weights altogether); its masters must come from the checkpoint anyway
    model = tiny_llama(seed=9)
    opt = superoffload.AdamW(decay_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), max_grad_norm=2.0, model=model,
                             bucket_size=20_000)
    passed = recording(SuperOffloadTrainer)(model=model, args=trainer_arguments(tmp_path / "part", save_steps=3,
                                                                                save_strategy="steps"),
                                            train_dataset=Rows(), optimizers=(opt, None))
    passed.train(resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-3"))
    assert passed.recorded == resumed.recorded


def test_bf16_and_save_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    so = run(SuperOffloadTrainer, tmp_path / "bf16", bf16=True, max_steps=3)
    assert so.optimizer.optimizer.engine.config.precision == "bf16"
    assert next(so.model.parameters()).dtype == torch.bfloat16
    so.save_model(str(tmp_path / "final"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    for (n, a), b in zip(so.model.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a.float(), b.float()), n


def test_other_engines_and_optimizers_are_refused(tmp_path):
    with pytest.raises(ValueError, match="optim='adafactor'"):
        SuperOffloadTrainer(model=tiny_llama(), args=trainer_arguments(tmp_path, optim="adafactor"),
                            train_dataset=Rows())
    model = tiny_llama()
    with pytest.raises(ValueError, match="not a superoffload.AdamW"):
        SuperOffloadTrainer(model=model, args=trainer_arguments(tmp_path), train_dataset=Rows(),
                            optimizers=(torch.optim.AdamW(model.parameters()), None))
    with pytest.raises(TypeError, match="Trainer subclass"):
        superoffload_trainer(dict)


def test_trl_sft_trainer_through_superoffload_trainer(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    words = "the cat sat on a mat and the dog ran to the park while birds sang in trees".split()  # noqa: SIM905
    vocab = {"<pad>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 2
    data = datasets.Dataset.from_dict({"text": texts})
    cls = recording(superoffload_trainer(trl.SFTTrainer))
    cfg = trl.SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=12, learning_rate=5e-3,
                        logging_steps=1, report_to=[], use_cpu=True, max_length=24, disable_tqdm=True,
                        save_strategy="no", dataloader_num_workers=0, seed=0)
    trainer = cls(model=tiny_llama(), args=cfg, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    losses = trainer.recorded
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3  # it learns the text
    trainer.save_model(str(tmp_path / "final"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    assert torch.equal(next(loaded.parameters()), next(trainer.model.parameters()))


UPSTREAM_STYLE = {  # a DeepSpeed SuperOffload config written for the Trainer: "auto" where it fills values
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto", "warmup_type": "linear"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "sub_group_size": 20_000,
                          "offload_optimizer": {"device": "cpu", "super_offload": True, "ratio": 0.9}},
}


def test_a_deepspeed_config_with_auto_values_is_filled_from_the_training_arguments(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(__import__("json").dumps(UPSTREAM_STYLE))
    args = trainer_arguments(tmp_path, max_steps=3, warmup_steps=2)
    trainer = recording(SuperOffloadTrainer)(model=tiny_llama(), args=args, train_dataset=Rows(),
                                             superoffload_config=str(path))
    trainer.train()
    opt = trainer.optimizer.optimizer
    assert opt.engine.config.bucket_size == 20_000 and opt.engine.config.grad_clip == 2.0
    from superoffload.integrations.lr_schedules import WarmupLR

    assert isinstance(trainer.lr_scheduler, WarmupLR)
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert lrs == [0.0, 0.0, 3e-3 / 2]  # DeepSpeed's linear warm-up over 2 steps: iteration -1, 0, 1
    with pytest.raises(Exception, match="disagrees with the TrainingArguments: gradient_clipping=0.5"):
        SuperOffloadTrainer(model=tiny_llama(), args=trainer_arguments(tmp_path), train_dataset=Rows(),
                            superoffload_config={**UPSTREAM_STYLE, "gradient_clipping": 0.5}).train()
