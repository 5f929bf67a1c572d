"""Robust step-time statistics: medians and percentiles, never means alone."""

from __future__ import annotations

import math
import statistics


def percentile(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an already sorted list, q in [0, 100]."""
    if not sorted_vals:
        raise ValueError("percentile of an empty list")
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(times: list[float]) -> dict[str, float]:
    s = sorted(times)
    return {
        "median_s": statistics.median(s),
        "mean_s": statistics.fmean(s),
        "std_s": statistics.stdev(s) if len(s) > 1 else 0.0,
        "p10_s": percentile(s, 10),
        "p90_s": percentile(s, 90),
        "iqr_s": percentile(s, 75) - percentile(s, 25),
        "min_s": s[0],
        "max_s": s[-1],
    }
