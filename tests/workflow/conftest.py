"""Fixtures of the workflow tests; helpers are in wf_helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for p in (str(ROOT), str(Path(__file__).parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `snakemake all` of the shrunken smoke sweep (smoke.yaml) per test session (about a minute on 2 quiet
    cores, ~2 min on the slowest machine seen), shared by the end-to-end test and the browser test of its
    report. No time limit but the watchdog's (wf_helpers.snakemake): a loaded machine only makes it slower.
    Returns the results root (the sweep's folder is ``cpu_smoke`` under it)."""
    import torch
    from wf_helpers import SMOKE_ARGS, snakemake

    if torch.cuda.is_available():
        pytest.skip("the end-to-end smoke run is the CPU sweep; a GPU machine would run its real sweep")
    results = tmp_path_factory.mktemp("smoke") / "results"
    snakemake("all", "--cores", "2", *SMOKE_ARGS, f"results_dir={results}")
    return results
