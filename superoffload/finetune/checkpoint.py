"""Checkpoints and the final model of a fine-tuning run, each written atomically.

Layout of ``--out DIR``::

    DIR/checkpoints/step-0000100/engine.pt     engine.state_dict(): fp32 master, Adam m and v, step counts,
                                                loss scale, bucket order (torch.save); with several ranks
                                                engine-rank{r}.pt, each rank's shard
    DIR/checkpoints/step-0000100/trainer.pt    step, LR scheduler, RNG states, per-step losses, the settings
                                                that must match on resume, data fingerprint, model buffers
    DIR/checkpoints/latest.json                {"step": 100, "dir": "step-0000100"}
    DIR/final/                                 save_pretrained weights + tokenizer (Hugging Face models), or
                                                model.safetensors + config.json + tokenizer (zoo GPT)
    DIR/record.json                            the run record (superoffload/harness/record.schema.json)

A checkpoint directory is written under a temporary name, its files fsynced, then renamed; ``latest.json``
is replaced atomically after that, so an interruption at any moment leaves the previous checkpoint
intact and ``latest.json`` pointing at a complete one. Only the newest ``keep`` checkpoints are kept.
Every file loads with ``torch.load(weights_only=True)``: the states hold tensors and plain Python values
only (the RNG states are converted to tensors and lists).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from superoffload.finetune.model import ZOO_WEIGHTS, LoadedModel, save_zoo_config
from superoffload.harness.record import write_json_atomic

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
FINAL = "final"
ENGINE_FILE, TRAINER_FILE = "engine.pt", "trainer.pt"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished temporary directory into place (an existing one is moved aside, then removed)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------ RNG
def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    return {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------ checkpoints
def step_dir_name(step: int) -> str:
    return f"step-{step:07d}"


def engine_file(rank: int, world: int) -> str:
    return ENGINE_FILE if world == 1 else f"engine-rank{rank}.pt"


def save_checkpoint(out: str | Path, step: int, engine_state: dict[str, Any], trainer_state: dict[str, Any],
                    keep: int = 2, rank: int = 0, world: int = 1, barrier: Any = None) -> Path:
    """Write the checkpoint of ``step`` atomically, point ``latest.json`` at it, prune older ones. With
    several ranks every rank calls it (``barrier``: torch.distributed.barrier): each writes its engine shard
    into the temporary directory, rank 0 the trainer state, then rank 0 renames and updates latest.json."""
    root = Path(out) / CHECKPOINTS
    final = root / step_dir_name(step)
    tmp = root / (f".{final.name}.tmp-{os.getpid()}" if world == 1 else f".{final.name}.tmp")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if barrier is not None:
        barrier()
    _save(engine_state, tmp / engine_file(rank, world))
    if barrier is not None:
        barrier()
    if rank != 0:
        if barrier is not None:
            barrier()
        return final
    _save(trainer_state, tmp / TRAINER_FILE)
    _fsync_dir(tmp)
    _replace_dir(tmp, final)
    write_json_atomic(root / LATEST, {"step": step, "dir": final.name})
    if keep > 0:
        done = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in done[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    if barrier is not None:
        barrier()
    return final


def latest_checkpoint(out: str | Path) -> Path | None:
    """The directory ``latest.json`` names, or None when there is no complete checkpoint."""
    import json

    root = Path(out) / CHECKPOINTS
    try:
        latest = json.loads((root / LATEST).read_text())
    except (OSError, ValueError):
        return None
    path = root / str(latest.get("dir", ""))
    engines = all(f.is_file() for f in engine_files(path))
    return path if engines and (path / TRAINER_FILE).is_file() else None


def engine_files(path: str | Path) -> list[Path]:
    """The engine files of a checkpoint, in rank order (one ``engine.pt`` when one rank wrote it)."""
    path = Path(path)
    ranks = sorted(path.glob("engine-rank*.pt"), key=lambda f: int(f.stem.removeprefix("engine-rank")))
    return ranks or [path / ENGINE_FILE]


def load_checkpoint(path: str | Path, rank: int = 0, world: int = 1) -> tuple[Any, dict[str, Any]]:
    """(engine state, trainer state): this rank's engine file when the checkpoint was written by ``world``
    ranks, else the list of every rank's engine states (the engine re-shards them)."""
    path = Path(path)
    trainer = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=True)
    files = engine_files(path)
    if len(files) == world:
        return torch.load(files[rank], map_location="cpu", weights_only=True), trainer
    return [torch.load(f, map_location="cpu", weights_only=True) for f in files], trainer


def model_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().cpu().clone() for n, b in module.named_buffers()}


def load_model_buffers(module: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, b in module.named_buffers():
            if n in buffers:
                b.copy_(buffers[n].to(b.device, b.dtype))


# ------------------------------------------------------------------------------------------ final model
def final_state_dict(module: nn.Module, engine_state: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The module's state dict with every parameter taken from the engine's fp32 master, cast to ``dtype``
    (round to nearest even, as the engine casts its device copy). Tied names share one tensor.
    ``engine_state``: one rank's state_dict, or the list of every rank's."""
    from superoffload.engine.checkpoint import param_state

    masters = {n: e["master"] for n, e in param_state(engine_state).items()}
    canonical = {id(p): n for n, p in module.named_parameters()}
    cast: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        if isinstance(t, nn.Parameter):
            c = canonical.get(id(t), name)
            if c not in cast:
                src = masters[c] if c in masters else t.detach().cpu().float()
                cast[c] = src.reshape(t.shape).to(dtype).contiguous()
            out[name] = cast[c]
        else:
            out[name] = t.detach().cpu().clone()
    return out


def save_final(loaded: LoadedModel, engine_state: dict[str, Any], out: str | Path, dtype: torch.dtype,
               dtype_name: str) -> Path:
    """``DIR/final``: the trained weights in ``dtype`` and the tokenizer, written to a temporary directory
    and renamed. Call after ``engine.synchronize()`` (``engine.state_dict()`` does it)."""
    final = Path(out) / FINAL
    sd = final_state_dict(loaded.module, engine_state, dtype)
    bad = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(f"{final} not written: the trained weights hold NaN/Inf in {', '.join(bad[:3])}"
                         f"{' and more' if len(bad) > 3 else ''} (the last checkpoint holds the fp32 masters)")
    tmp = Path(out) / f".{FINAL}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if loaded.kind == "hf":
        cfg = loaded.module.config
        attr = "dtype" if hasattr(cfg, "dtype") else "torch_dtype"
        before = getattr(cfg, attr, None)
        setattr(cfg, attr, dtype)
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar in logs
        try:
            loaded.module.save_pretrained(str(tmp), state_dict=sd)
        finally:
            setattr(cfg, attr, before)
            if bars:
                hf_logging.enable_progress_bar()
    else:
        from safetensors.torch import save_file

        tied = loaded.shape.tied_embeddings and "lm_head.weight" in sd
        save_file({k: v for k, v in sd.items() if not (tied and k == "lm_head.weight")}, str(tmp / ZOO_WEIGHTS))
        save_zoo_config(tmp, loaded.shape, dtype_name)
    loaded.tokenizer.save(tmp)
    for f in tmp.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(tmp)
    _replace_dir(tmp, final)
    return final
