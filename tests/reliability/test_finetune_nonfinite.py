"""`superoffload finetune` never reports a run that did not train as ok, never starts from NaN weights, and
never writes final/ with non-finite weights without saying so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from superoffload.finetune import FinetuneConfig, FinetuneInputError, run_finetune
from superoffload.harness import record

sys.path.insert(0, str(Path(__file__).parents[1] / "finetune"))
from helpers import make_dataset, make_tiny_llama  # noqa: E402

COMMON = dict(max_length=48, batch=2, warmup_steps=0, progress=False, print_plan=False, threads=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    data = make_dataset(root / "data.jsonl", n=20)
    return make_tiny_llama(root / "model", data), data


def test_a_model_with_an_inf_weight_is_an_input_error(tiny, tmp_path):
    model, data = tiny
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(model, bad)
    w = load_file(bad / "model.safetensors")
    name = next(k for k in w if k.endswith("q_proj.weight"))
    w[name].view(-1)[0] = float("inf")
    save_file(w, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(FinetuneInputError, match=r"non-finite weights \(NaN/Inf\) in .*q_proj\.weight \(1 values\)"):
        run_finetune(FinetuneConfig(model=str(bad), data=str(data), steps=2, out=str(tmp_path / "o"), **COMMON))


def test_fp16_at_a_huge_learning_rate_ends_non_ok_and_says_why(tiny, tmp_path):
    model, data = tiny
    out = tmp_path / "run"
    rec = run_finetune(FinetuneConfig(model=str(model), data=str(data), steps=12, out=str(out), lr=10.0,
                                      grad_clip=0.0, dtype="fp16", **COMMON))
    saved = record.read_result(out / "record.json", "run")
    assert rec["status"] == saved["status"] == "error"
    assert "non-finite" in saved["error"] or "NonFiniteError" in saved["error"], saved["error"]
    assert sum(saved["step_skipped"]) > 6 and len(saved["step_skipped"]) == len(saved["losses"])


def test_final_is_not_written_with_non_finite_weights(tiny, tmp_path):
    model, data = tiny
    out = tmp_path / "run"
    # commit non-finite steps instead of skipping them: the weights turn NaN
    rec = run_finetune(FinetuneConfig(model=str(model), data=str(data), steps=4, out=str(out), lr=1e8, grad_clip=0.0,
                                      dtype="fp32", config={"skip_nonfinite": False}, **COMMON))
    assert rec["status"] == "error" and "final not written: the trained weights hold NaN/Inf" in rec["error"]
    assert not (out / "final").exists()
    assert rec["loss_nonfinite"][-1] and rec["losses"][-1] is None  # a NaN loss, marked as one
    trainer = torch.load(out / "checkpoints" / "step-0000004" / "trainer.pt", weights_only=True)
    assert trainer["step"] == 4  # the masters are kept in the last checkpoint
