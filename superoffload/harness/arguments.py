"""Command-line value parsers that the harness's own commands share with ``superoffload bench run``.

They live here, not in ``superoffload.cli``, because the harness's microbenchmarks have command lines of
their own and the harness sits below the CLI: it must not import upward for a parser.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def key_value(s: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``-o/--option``: the value as JSON when it parses (``true``, ``4``, ``[1, 2]``),
    else the plain string."""
    key, sep, value = s.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {s!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def number(kind: type[int] | type[float], low: float, *, strict: bool = False) -> Callable[[str], int | float]:
    """An argparse ``type=`` for a number argument: a ``kind`` (int or float) of at least ``low`` (above it with
    ``strict``); anything else is an error that says what was expected and what was given
    ("expected a positive integer, got '0.5'", "expected a number >= 0, got -1.0")."""
    if kind is int and low == 1 and not strict:
        expected = "a positive integer"
    else:
        expected = f"{'an integer' if kind is int else 'a number'} {'>' if strict else '>='} {low:g}"

    def parse(s: str) -> int | float:
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}") from None
        if not (v > low if strict else v >= low):  # NaN fails both
            raise argparse.ArgumentTypeError(f"expected {expected}, got {v}")
        return v

    return parse
