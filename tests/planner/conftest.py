"""Planner results several test files read, computed once per session: the paper's multi-chip rows (Fig 11
and Fig 13 at 4 and 16 chips on the GH200 preset; 30 s of CPU on a 2-core machine beside other jobs), which
both the test of those rows (test_planner_chips.py) and the test of the whole comparison (test_paper.py) need.
(Fig 12's rows are cached by superoffload.planner.paper itself.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from superoffload.planner.paper import multi_chip_rows
from superoffload.planner.presets import get_profile


@pytest.fixture(scope="session")
def _gh200_multi_chip_rows() -> list[dict[str, Any]]:
    return multi_chip_rows(get_profile("gh200"))


@pytest.fixture
def gh200_multi_chip_rows(_gh200_multi_chip_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """multi_chip_rows(gh200): a copy per test, so no test sees another's edits."""
    return copy.deepcopy(_gh200_multi_chip_rows)
