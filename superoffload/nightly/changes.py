"""Change points over the whole history of a case and metric, with the commit range each falls in.

The detector is ruptures' PELT (exact segmentation under a penalty; Killick et al. 2012) with the L2
cost on the nightly medians, standardised by a robust noise estimate: 1.4826 x the MAD of consecutive
differences / sqrt 2, which a step does not inflate (a step is one large difference among many small
ones). The penalty is BIC-like (``penalty x ln n`` per change). A detected change is kept only when the
segments' medians differ by at least ``min_change`` (5 %, asv's default) on a throughput or time, or the
metric's bound on memory and rates, so a statistically clear but practically nil shift is not reported.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from superoffload.nightly.metrics import Metric
from superoffload.nightly.rules import MAD_TO_SIGMA, RuleConfig, night_value
from superoffload.nightly.store import Night, Sample

PENALTY = 4.0  # x ln(n) per change point (docs/nightly.md: the false and true detection rates behind it)
MIN_SIZE = 2  # nights per segment


@dataclass(frozen=True)
class ChangePoint:
    case: str
    metric: str
    index: int  # the first night of the new segment
    before: float  # median of the segment before
    after: float  # median of the segment after
    good: Night  # the last night before the change
    bad: Night  # the first night after it

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0 if self.before else float("inf")

    @property
    def commit_range(self) -> str:
        """``good..bad`` as git log and ``nightly bisect`` take it."""
        return f"{(self.good.commit or 'unknown')[:12]}..{(self.bad.commit or 'unknown')[:12]}"


def noise_sigma(xs: list[float]) -> float:
    diffs = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    if len(diffs) < 2:
        return 0.0
    m = statistics.median(diffs)
    return MAD_TO_SIGMA * statistics.median(abs(d - m) for d in diffs) / math.sqrt(2.0)


def segments(xs: list[float], penalty: float = PENALTY, min_size: int = MIN_SIZE) -> list[int]:
    """Indices where a new segment starts (ruptures PELT, L2 cost, on the standardised series)."""
    import numpy as np
    import ruptures

    n = len(xs)
    if n < 2 * min_size:
        return []
    center = statistics.median(xs)
    sigma = max(noise_sigma(xs), 1e-6 * abs(center), 1e-12)
    z = (np.asarray(xs, dtype=float) - center) / sigma
    ends = ruptures.Pelt(model="l2", min_size=min_size, jump=1).fit(z.reshape(-1, 1)).predict(
        pen=penalty * math.log(n))
    return [e for e in ends if e < n]


def detect(case: str, metric: Metric, nights: list[Night], per_night: list[list[Sample]],
           cfg: RuleConfig, penalty: float = PENALTY) -> list[ChangePoint]:
    """Change points of one numeric series (nights without a value are left out)."""
    if metric.rule not in ("relative", "exact", "bounded"):
        return []
    pts = [(n, v) for n, s in zip(nights, per_night, strict=True)
           if isinstance(v := night_value(s, metric), float)]
    xs = [v for _, v in pts]
    bounds = [0, *segments(xs, penalty), len(xs)]
    out = []
    for a, b, c in zip(bounds, bounds[1:], bounds[2:], strict=False):
        before, after = statistics.median(xs[a:b]), statistics.median(xs[b:c])
        size = abs(after - before) if metric.rule == "bounded" else (
            abs(after / before - 1.0) if before else float("inf"))
        if size >= (cfg.min_change if metric.rule == "relative" else cfg.bound(metric)):
            out.append(ChangePoint(case, metric.name, b, before, after, pts[b - 1][0], pts[b][0]))
    return out
