"""The number-argument factory every `bench run` number flag is parsed by (harness/arguments.py)."""

from __future__ import annotations

import argparse
import math

import pytest

from superoffload.harness.arguments import number


@pytest.mark.parametrize("kind,low,strict,text,want", [
    (int, 1, False, "3", 3), (int, 0, False, "0", 0), (float, 0, False, "0", 0.0), (float, 0, True, "1e-3", 1e-3),
])
def test_numbers_in_range_parse(kind, low, strict, text, want) -> None:
    v = number(kind, low, strict=strict)(text)
    assert v == want and type(v) is kind


@pytest.mark.parametrize("kind,low,strict,text,says", [
    (int, 1, False, "0", "expected a positive integer, got 0"),
    (int, 1, False, "1.5", "expected a positive integer, got '1.5'"),
    (int, 0, False, "-1", "expected an integer >= 0, got -1"),
    (float, 0, False, "-1", "expected a number >= 0, got -1.0"),
    (float, 0, False, "nan", "expected a number >= 0, got nan"),
    (float, 0, True, "0", "expected a number > 0, got 0.0"),
    (float, 0, True, "x", "expected a number > 0, got 'x'"),
])
def test_numbers_out_of_range_say_what_was_expected(kind, low, strict, text, says) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{says.replace('.', '[.]')}$"):
        number(kind, low, strict=strict)(text)
    assert math.isinf(number(float, 0)("inf"))
