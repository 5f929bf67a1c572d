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

A checkpoint directory is written under a temporary name, its files fsynced, then its ``manifest.json``
(every file's size and sha256, the step, the world size, the run id; superoffload/engine/files.py), then
renamed; ``latest.json`` is replaced atomically after that, so an interruption at any moment leaves the
previous checkpoint intact and ``latest.json`` pointing at a complete one. Only the newest ``keep``
checkpoints are kept. A resume takes the newest checkpoint whose files match its manifest (a damaged or
mixed newest one is skipped with a note saying what is wrong), and checks that the engine state and the
trainer state are at the checkpoint's step. Temporaries of killed or failed saves are removed when a run
starts, and a failed save removes its own and says in one line which path and why (a full disk, a
read-only directory). Every file loads with ``torch.load(weights_only=True)``: the states hold tensors and
plain Python values only (the RNG states are converted to tensors and lists).
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

from superoffload.engine import files
from superoffload.engine.files import CheckpointError
from superoffload.finetune.model import ZOO_WEIGHTS, LoadedModel, save_zoo_config
from superoffload.harness.record import write_json_atomic

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
FINAL = "final"
ENGINE_FILE, TRAINER_FILE = "engine.pt", "trainer.pt"


_fsync_dir = files.fsync_dir


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
                    keep: int = 2, rank: int = 0, world: int = 1, barrier: Any = None, gather: Any = None,
                    run_id: str = "") -> Path:
    """Write the checkpoint of ``step`` atomically, point ``latest.json`` at it, prune older ones. With
    several ranks every rank calls it (``barrier``: torch.distributed.barrier; ``gather(obj)``: every rank's
    ``obj`` in rank order, for the manifest): each writes its engine shard into the temporary directory,
    rank 0 the trainer state and the manifest, then renames and updates latest.json. CheckpointError (one
    line: which path, why) when a file cannot be written; the temporary directory is removed then."""
    root = Path(out) / CHECKPOINTS
    final = root / step_dir_name(step)
    tmp = root / (f".{final.name}.tmp-{os.getpid()}" if world == 1 else f".{final.name}.tmp")
    try:
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        if barrier is not None:
            barrier()
        name = engine_file(rank, world)
        mine = {name: files.save_hashed(engine_state, tmp / name)}
        written = gather(mine) if gather is not None else [mine]
        if barrier is not None:
            barrier()
        if rank != 0:
            if barrier is not None:
                barrier()
            return final
        listed = {k: v for part in written for k, v in part.items()}
        listed[TRAINER_FILE] = files.save_hashed(trainer_state, tmp / TRAINER_FILE)
        # world_size: the manifest's key, as existing checkpoints hold it
        files.write_manifest(tmp, listed, step=step, world_size=world, run_id=run_id,
                             engine_global_step=int(engine_state.get("global_step", step)))
        _fsync_dir(tmp)
        _replace_dir(tmp, final)
        write_json_atomic(root / LATEST, {"step": step, "dir": final.name})
    except (OSError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"checkpoint of step {step} not written to {tmp}: {files.why_write_failed(e, root)}") \
            from None
    if keep > 0:
        done = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in done[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    if barrier is not None:
        barrier()
    return final


def remove_stale_temporaries(out: str | Path) -> list[Path]:
    """Leftovers of saves that were killed or failed (a whole checkpoint each, at worst): removed when a run
    starts (rank 0, before its first save). Returns what was removed."""
    out = Path(out)
    root = out / CHECKPOINTS
    found = [*root.glob(".step-*.tmp*"), *root.glob(".step-*.old-*"), *root.glob(f".{LATEST}.*.tmp"),
             *out.glob(f".{FINAL}.tmp-*"), *out.glob(f".{FINAL}.old-*"), *out.glob(".record.json.*.tmp")]
    for p in found:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()
    return found


def latest_checkpoint(out: str | Path) -> tuple[Path | None, list[str]]:
    """(the newest intact checkpoint, notes on the newer ones passed over). ``latest.json``'s directory
    first, then every other ``step-*`` directory, newest first; intact: every file its manifest lists is
    there with the listed size and sha256 (a checkpoint written before manifests existed: its files are
    there). The notes say why each skipped one is not usable."""
    import json

    root = Path(out) / CHECKPOINTS
    notes: list[str] = []
    named = None
    try:
        latest = json.loads((root / LATEST).read_text())
        named = root / str(latest["dir"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as e:
        notes.append(f"{root / LATEST} is not readable ({type(e).__name__}); looking for checkpoints beside it")
    steps = sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: p.name, reverse=True)
    order = ([named] if named is not None else []) + [p for p in steps if p != named]
    for path in order:
        why = _why_unusable(path)
        if why is None:
            return path, notes
        notes.append(f"{path.name}: {why}")
    return None, notes


def _why_unusable(path: Path) -> str | None:
    if not path.is_dir():
        return f"{path} does not exist"
    try:
        manifest = files.read_manifest(path)
    except CheckpointError as e:
        return str(e)
    if manifest is None:  # a checkpoint of a version before manifests (trainer.pt version 1) still loads
        missing = [f.name for f in [*engine_files(path), path / TRAINER_FILE] if not f.is_file()]
        if missing:
            return f"{', '.join(missing)} missing and no {files.MANIFEST}"
        try:
            version = files.load_file(path / TRAINER_FILE).get("version", 1)
        except CheckpointError as e:
            return str(e)
        return f"{path / files.MANIFEST} is missing" if version >= 2 else None
    return files.verify(path)


def engine_files(path: str | Path) -> list[Path]:
    """The engine files of a checkpoint, in rank order (one ``engine.pt`` when one rank wrote it)."""
    path = Path(path)
    ranks = sorted(path.glob("engine-rank*.pt"), key=lambda f: int(f.stem.removeprefix("engine-rank")))
    return ranks or [path / ENGINE_FILE]


def load_checkpoint(path: str | Path, rank: int = 0, world: int = 1) -> tuple[Any, dict[str, Any]]:
    """(engine state, trainer state): this rank's engine file when the checkpoint was written by ``world``
    ranks, else the list of every rank's engine states (the engine re-shards them). CheckpointError naming the
    file when one cannot be read or is at another step than the checkpoint."""
    path = Path(path)
    trainer = files.load_file(path / TRAINER_FILE)
    manifest = files.read_manifest(path) or {}
    step = int(manifest.get("step", trainer["step"]))
    if int(trainer["step"]) != step:
        raise CheckpointError(f"{path / TRAINER_FILE} is at step {trainer['step']}, the checkpoint at step {step}")
    names = engine_files(path)
    if manifest.get("world_size") is not None and len(names) != int(manifest["world_size"]):
        raise CheckpointError(f"{path} holds {len(names)} engine file(s), its manifest says it was written by "
                              f"{manifest['world_size']} rank(s)")
    wanted = [names[rank]] if len(names) == world else names
    states = [files.load_file(f) for f in wanted]
    for f, st in zip(wanted, states, strict=True):
        if int(st.get("global_step", step)) != step:
            raise CheckpointError(f"{f} is at optimizer step {st.get('global_step')}, the checkpoint at step {step} "
                                  f"(a file of another checkpoint)")
    return (states[0] if len(names) == world else states), trainer


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
