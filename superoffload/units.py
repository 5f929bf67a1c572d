"""Numbers for people: counts, byte sizes and rates to three significant digits with a unit that fits.

A plan for a 1M-parameter model printed "0.00B params" and "model TFLOPS 0"; these scale to the number
instead. No torch import (the planner, the CLI and the reports all use it).
"""

from __future__ import annotations

import math


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits, fixed point (23.0, 0.930, 512, 0.0512)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def count(n: float) -> str:
    """A parameter or token count: 512, 93.4K, 0.93M (a model under a million), 23.0B, 1.20T."""
    a = abs(n)
    if a < 10_000:
        return f"{n:,.0f}"
    if a < 1e6:
        return f"{n / 1e6:.2f}M"
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if a >= scale:
            return f"{sig(n / scale)}{unit}"
    return f"{n:,.0f}"


def nbytes(b: float) -> str:
    """A byte size in decimal units: 512 B, 34.0 MB, 1.20 GB, 414 GB."""
    a = abs(b)
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if a >= scale:
            return f"{sig(b / scale)} {unit}"
    return f"{b:,.0f} B"


def rate(x: float) -> str:
    """A rate such as TFLOPS or GB/s, to three significant digits (0.0512, 3.20, 412)."""
    return sig(x)
