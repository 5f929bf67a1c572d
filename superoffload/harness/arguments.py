"""Command-line value parsers that the harness's own commands share with ``superoffload bench run``.

They live here, not in ``superoffload.cli``, because the harness's microbenchmarks have command lines of
their own and the harness sits below the CLI: it must not import upward for a parser.
"""

from __future__ import annotations

import argparse
import json


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
