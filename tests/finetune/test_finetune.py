"""`superoffload finetune` end to end on a tiny Llama (hidden 64, 2 layers) with a locally trained BPE
tokenizer and 50 Alpaca-style examples: the loss falls, resume is bit-exact, DIR/final loads with
from_pretrained and gives the engine model's logits, and every bad input fails before training."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from superoffload.cli import finetune as cli
from superoffload.finetune import FinetuneConfig, prepare, run_finetune, train
from superoffload.harness import record

COMMON = dict(max_length=64, batch=2, lr=3e-3, warmup_steps=2, progress=False, print_plan=False, threads=2)


def _cfg(model: Path, data: Path, out: Path, steps: int, **kw) -> FinetuneConfig:
    return FinetuneConfig(model=str(model), data=str(data), steps=steps, out=str(out), **{**COMMON, **kw})


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="superoffload")
    cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["finetune", *argv])
    return args.func(args)


def test_loss_falls_and_record_follows_the_schema(tiny, tmp_path, capsys):
    model, data = tiny
    out = tmp_path / "run"
    rc = _cli(["--model", str(model), "--data", str(data), "--steps", "24", "--out", str(out), "--max-length",
               "64", "--batch", "2", "--lr", "3e-3", "--threads", "2", "--log-every", "8"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "Plan for model" in captured.out and "Why:" in captured.out  # the plan, printed once
    assert captured.out.count("Plan for") == 1
    assert "step 8/24: loss" in captured.err and "MFU" in captured.err  # log lines: not a terminal
    rec = record.read_result(out / "record.json", "run")
    assert rec["status"] == "ok" and len(rec["losses"]) == 24
    first, last = rec["losses"][0], sum(rec["losses"][-4:]) / 4
    assert last < 0.7 * first, rec["losses"]  # 6.0 -> about 3.4 in 24 steps
    assert rec["throughput"]["mfu"] > 0 and rec["plan"]["model"] == "model"
    assert rec["run"]["dtype"] == "bf16" and rec["run"]["activation_checkpointing"] is True
    ft = rec["system_stats"]["finetune"]
    assert ft["data"]["format"] == "alpaca+text" and ft["data"]["examples"] == 50
    assert ft["tokenizer"].endswith(f"from {model}") and ft["tokenizer_vocab"] == 400
    assert (out / "final" / "tokenizer.json").is_file()
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 24


def test_resume_is_bit_exact(tiny, tmp_path):
    """2N steps in one go == N steps, stop, --resume for N more: equal losses, torch.equal weights.
    With gradient accumulation and a mid-run checkpoint."""
    model, data = tiny
    kw = dict(grad_accum=2, save_every=2, save_dtype="fp32")
    full = run_finetune(_cfg(model, data, tmp_path / "full", 8, **kw))
    part = run_finetune(_cfg(model, data, tmp_path / "split", 8, stop_after=4, **kw))
    assert part["losses"] == full["losses"][:4]
    assert not (tmp_path / "split" / "final").exists()
    resumed = run_finetune(_cfg(model, data, tmp_path / "split", 8, resume=True, **kw))
    assert resumed["losses"] == full["losses"]
    assert resumed["system_stats"]["finetune"]["resumed_from_step"] == 4
    a = load_file(str(tmp_path / "full" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["model.embed_tokens.weight"].dtype == torch.float32
    kept = sorted(p.name for p in (tmp_path / "split" / "checkpoints").glob("step-*"))
    assert kept == ["step-0000006", "step-0000008"]  # --keep-checkpoints 2


def test_final_loads_with_from_pretrained_and_matches_the_engine_model(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    model, data = tiny
    prep = prepare(_cfg(model, data, tmp_path / "run", 4, save_dtype="bf16"))
    rec = train(prep)
    assert rec["status"] == "ok"
    engine_model = prep.loaded.module.eval()  # the engine's model: bf16 weights = master cast to bf16
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "final"), local_files_only=True,
                                                  dtype=torch.bfloat16).eval()
    assert loaded.config.dtype == torch.bfloat16
    ids = torch.tensor([[1, 5, 9, 17, 33, 2]])
    with torch.no_grad():
        want = engine_model(input_ids=ids, use_cache=False).logits
        got = loaded(input_ids=ids, use_cache=False).logits
    assert torch.equal(want, got)


BAD = {
    "missing model": (["--model", "/nonexistent/llama"], "nothing is downloaded"),
    "hub id": (["--model", "meta-llama/Llama-3.1-8B"], "nothing is downloaded"),
    "missing data": (["--data", "/nonexistent/data.jsonl"], "does not exist"),
    "no fields": ("nofields", "expected 'instruction' and 'output'"),
    "max length": (["--max-length", "512"], "exceeds the model's max positions 256"),
    "zero steps": (["--steps", "0"], "--steps must be a positive integer"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_before_training_with_one_line(case, tiny, tmp_path, capsys):
    model, data = tiny
    change, expect = BAD[case]
    if change == "nofields":
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
        change = ["--data", str(bad)]
    args = {"--model": str(model), "--data": str(data), "--steps": "3", "--out": str(tmp_path / "out"),
            "--max-length": "64"}
    args.update(dict(zip(change[::2], change[1::2], strict=True)))
    rc = _cli([x for kv in args.items() for x in kv] + ["--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("superoffload finetune: error:"), err
    assert expect in lines[0]
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_out_dir_with_checkpoints_needs_resume(tiny, tmp_path, capsys):
    model, data = tiny
    argv = ["--model", str(model), "--data", str(data), "--out", str(tmp_path / "run"), "--max-length", "64",
            "--no-progress"]
    assert _cli([*argv, "--steps", "2"]) == 0
    capsys.readouterr()
    assert _cli([*argv, "--steps", "2"]) == 2  # would overwrite a run
    assert "pass --resume" in capsys.readouterr().err
    assert _cli([*argv, "--steps", "4", "--resume"]) == 2  # a different schedule: not the same run
    assert "--resume: steps is 4 but the checkpoint step-0000002 was written with 2" in capsys.readouterr().err
    assert _cli([*argv, "--steps", "2", "--resume"]) == 2
    assert "nothing left to train" in capsys.readouterr().err
