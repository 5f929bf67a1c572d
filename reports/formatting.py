"""How the report writes a number: significant digits with a unit, never a raw float, and one dash for
"no value" (never `None` or `nan`). Parameter counts and byte sizes are superoffload.units' (0.93M, 23.0B;
GB), the formatters the CLI and the planner print with; this module only adds the report's choices
(percentages, ratios, milliseconds) and the Jinja2 filters."""

from __future__ import annotations

import math
from typing import Any

from superoffload import units

DASH = "–"


def value(x: Any) -> float | None:
    """``x`` as a finite float, or None (None, bools, strings, nan and inf are no value)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def sig(x: Any, digits: int = 3) -> str:
    """A plain number to ``digits`` significant digits (1027, 0.0512, 3.20); large ones with separators."""
    v = value(x)
    if v is None:
        return DASH
    if isinstance(x, int) or abs(v) >= 10 ** digits:  # counts stay whole: 12, 1,024
        return f"{v:,.0f}"
    return units.sig(v, digits)


def params(x: Any) -> str:
    """A parameter count: 0.93M, 21.0M, 32.6B."""
    v = value(x)
    return DASH if v is None or v <= 0 else units.count(v)


def nbytes(x: Any) -> str:
    """A byte size in decimal units: 34.0 MB, 1.20 GB, 489 GB."""
    v = value(x)
    return DASH if v is None else units.nbytes(v)


def pct(x: Any, digits: int = 3) -> str:
    """A fraction as a percentage to ``digits`` significant digits (0.0352 -> 3.52%)."""
    v = value(x)
    return DASH if v is None else f"{sig(100 * v, digits)}%"


def signed_pct(x: Any) -> str:
    """A relative error as a signed percentage (+45.2%, -3.1%)."""
    v = value(x)
    return DASH if v is None else f"{100 * v:+.1f}%"


def ratio(x: Any) -> str:
    """A speed-up or ratio: 1.23x, 0.870x, 12.0x."""
    v = value(x)
    return DASH if v is None else f"{units.sig(v)}x"


def ms(x: Any) -> str:
    """Seconds as milliseconds, 3 significant digits (0.1204 -> 120)."""
    v = value(x)
    return DASH if v is None else sig(1000 * v)


def text(x: Any) -> str:
    """Any cell: a number to significant digits, a string as it is, no value as a dash."""
    if x is None or x == "":
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return sig(x) if value(x) is not None else DASH
    return str(x)


FILTERS = {"sig": sig, "params": params, "nbytes": nbytes, "pct": pct, "signed_pct": signed_pct,
           "ratio": ratio, "ms": ms, "text": text}
