"""The model to fine-tune: a Hugging Face causal LM from a local directory, or a zoo model.

``--model`` is one of

- a local directory written by ``save_pretrained`` (``config.json`` + weights): loaded with
  ``AutoModelForCausalLM.from_pretrained(..., local_files_only=True)`` in fp32 (the engine's fp32 master
  copy comes from these values; the device copy is cast to the training precision). Nothing is
  downloaded: a hub id such as ``meta-llama/Llama-3.1-8B`` that is not a local directory is an error;
- a directory written by a previous ``finetune`` of a zoo GPT (``config.json`` with ``superoffload_zoo``);
- a zoo name (``superoffload.models``, e.g. ``gpt-tiny``, ``llama-tiny``), built from its config
  with seeded initial weights.

The planner and the FLOPs accounting need a ``ModelShape``: zoo models have one; for a Hugging Face
model it is read from the config (layers, hidden, heads, key/value heads, MLP width, vocabulary,
positions; a gated MLP when the model has ``gate_proj`` weights), in the Llama layout that
``ModelShape`` counts. The record keeps both that shape's parameter count and the model's real one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from superoffload.finetune.errors import FinetuneInputError
from superoffload.finetune.tokenizer import ByteTokenizer, TextTokenizer, load_tokenizer
from superoffload.models import MODELS, build_model, count_params
from superoffload.options import precision_of
from superoffload.shapes import ModelShape, shape_from_hf

ZOO_MARKER = "superoffload_zoo"
ZOO_WEIGHTS = "model.safetensors"


@dataclass
class LoadedModel:
    module: nn.Module  # fp32, on the host, in train mode
    shape: ModelShape
    kind: str  # "hf" (a transformers PreTrainedModel) or "gpt" (the zoo's GPT)
    source: str  # the directory or the zoo name given
    tokenizer: TextTokenizer
    source_dtype: str | None  # dtype the weights were stored in (Hugging Face config), if known

    @property
    def max_positions(self) -> int:
        return self.shape.max_seq

    @property
    def params(self) -> int:
        return count_params(self.module)

    def logits(self, call: Any, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [batch, seq, vocab] of ``call`` (the engine, or the module itself) on ``input_ids``."""
        if self.kind == "hf":
            return call(input_ids=input_ids, use_cache=False).logits
        return call(input_ids)


def _torch_dtype_name(value: Any) -> str | None:
    """The precision name of a config's torch dtype (or its name, e.g. "bfloat16"); None for any other."""
    if isinstance(value, str):
        value = getattr(torch, value, None)
    if not isinstance(value, torch.dtype):
        return None
    try:
        return precision_of(value)
    except ValueError:
        return None


def enable_hf_checkpointing(module: nn.Module) -> None:
    """Per-layer activation checkpointing with non-reentrant torch.utils.checkpoint (transformers renamed
    ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable`` in v5)."""
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _from_pretrained_dtype_kwarg() -> str:
    """transformers renamed ``torch_dtype`` to ``dtype`` in 4.56."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _load_hf(path: Path) -> tuple[nn.Module, str | None]:
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as e:  # pragma: no cover - depends on the install
        raise FinetuneInputError(f"--model {path}: loading a Hugging Face model needs the `transformers` "
                                 f"package (pip install -e '.[bench]')") from e
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar: stderr is for progress and errors
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        source_dtype = _torch_dtype_name(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None))
        module = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                      **{_from_pretrained_dtype_kwarg(): torch.float32})
    except (OSError, ValueError, KeyError) as e:
        raise FinetuneInputError(f"--model {path}: not a loadable Hugging Face causal LM directory "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return module, source_dtype


def _zoo_shape(name: str) -> ModelShape:
    return MODELS[name]


def save_zoo_config(directory: Path, shape: ModelShape, dtype: str) -> None:
    (directory / "config.json").write_text(json.dumps(
        {ZOO_MARKER: True, "zoo_model": shape.name, "shape": shape.to_dict(), "dtype": dtype},
        indent=2, sort_keys=True) + "\n")


def _build_zoo(shape: ModelShape, seed: int, activation_checkpointing: bool) -> tuple[nn.Module, str]:
    model = build_model(shape, seq=shape.max_seq, seed=seed, activation_checkpointing=activation_checkpointing)
    if shape.family == "hf":
        return model.model, "hf"  # the transformers model inside the zoo adapter
    return model, "gpt"


def load_model(spec: str, *, seed: int = 0, activation_checkpointing: bool = True) -> LoadedModel:
    """Load or build the model named by ``spec`` (see the module docstring); FinetuneInputError when it
    cannot be found. Activation checkpointing: transformers' ``activation_checkpointing_enable``
    (``gradient_checkpointing_enable`` before v5) with ``use_reentrant=False``, or the zoo GPT's own per-block flag."""
    path = Path(spec)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FinetuneInputError(f"--model {spec}: the directory has no config.json (expected a model "
                                     f"saved with save_pretrained; nothing is downloaded)")
        cfg = json.loads(cfg_file.read_text())
        if cfg.get(ZOO_MARKER):
            return _load_zoo_dir(path, cfg, activation_checkpointing)
        module, source_dtype = _load_hf(path)
        if activation_checkpointing:
            enable_hf_checkpointing(module)
        module.train()
        return LoadedModel(module, shape_from_hf(module, path.resolve().name), "hf", str(path),
                           load_tokenizer(path), source_dtype)
    if spec in MODELS:
        module, kind = _build_zoo(_zoo_shape(spec), seed, activation_checkpointing)
        module.train()
        return LoadedModel(module, _zoo_shape(spec), kind, spec, ByteTokenizer(), None)
    raise FinetuneInputError(f"--model {spec!r} is neither a local model directory nor a zoo model; nothing is "
                             f"downloaded (save the model with save_pretrained first, or use one of "
                             f"{', '.join(m for m in MODELS if 'tiny' in m or 'small' in m)}, ...)")


def _load_zoo_dir(path: Path, cfg: dict, activation_checkpointing: bool) -> LoadedModel:
    from safetensors.torch import load_file

    name = cfg.get("zoo_model")
    if name not in MODELS:
        raise FinetuneInputError(f"--model {path}: unknown zoo model {name!r} in config.json")
    shape = _zoo_shape(name)
    module, kind = _build_zoo(shape, 0, activation_checkpointing)
    weights = load_file(str(path / ZOO_WEIGHTS))
    missing, unexpected = module.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise FinetuneInputError(f"--model {path}: weights do not match {name} (missing {missing[:3]}, "
                                 f"unexpected {unexpected[:3]})")
    module.train()
    return LoadedModel(module, shape, kind, str(path), load_tokenizer(path), cfg.get("dtype"))


def snapshot_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the module's floating-point buffers, before the engine casts the model."""
    return {n: b.detach().clone() for n, b in module.named_buffers() if b.is_floating_point()}


def restore_buffer_dtypes(module: nn.Module, before: dict[str, torch.Tensor]) -> list[str]:
    """Give back the dtype the model was built with to floating buffers the engine's cast changed.

    The engine casts the whole module to the training precision, buffers included; it manages only the
    parameters. A Llama-style model's RoPE ``inv_freq`` would then be bf16, while ``from_pretrained(...,
    dtype=torch.bfloat16)`` keeps it fp32: the model trained would not be the model saved and loaded
    back. Restored buffers stay on the device the engine chose. Returns the names restored."""
    restored = []
    for name, buf in list(module.named_buffers()):
        orig = before.get(name)
        if orig is None or buf.dtype == orig.dtype:
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        owner._buffers[attr] = orig.to(buf.device)
        restored.append(name)
    return restored
