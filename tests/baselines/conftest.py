"""Shared set-up for the baseline tests (CPU-only; DeepSpeed builds its ops once, then caches them)."""

from __future__ import annotations

import os

import pytest

from superoffload import ds_build

# the Makefile exports the same default; set it here too so a bare `pytest` reuses the cached
# DeepSpeed op builds (cpu_adam ~50 s, shm comm ~25 s on 2 cores the first time)
os.environ.setdefault(ds_build.EXTENSIONS_ENV, str(ds_build.default_extensions_dir()))

BASELINES = ("zero_offload", "zero_infinity", "ds_superoffload", "fsdp_offload")
DEEPSPEED_BASELINES = ("zero_offload", "zero_infinity", "ds_superoffload")


@pytest.fixture(scope="session")
def needs_deepspeed() -> None:
    pytest.importorskip("deepspeed")
