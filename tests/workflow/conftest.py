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
