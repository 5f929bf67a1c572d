"""The verdict for each case and metric of a night: rolling baseline, robust spread, persistence, labels.

For one case and metric the nights of one fingerprint are judged in order, oldest first:
  * the baseline of a night is the last ``window`` earlier nights that were themselves unremarkable
    (a violating night never enters the baseline: a regression keeps alerting until it is fixed,
    accepted or annotated), counted from the newest reset (an ``accept`` or an ``intended`` annotation);
  * with fewer than ``min_baseline`` such nights the label is ``insufficient data`` (never regression);
  * a night's value is the median of its repeats; a relative metric (throughput, times) violates when
    it is worse than the median of the baseline nights by more than max(floor, k x robust sd), on a log
    scale (a halving and a doubling are the same distance); the robust sd is the larger of 1.4826 x the
    MAD of the baseline nights and what the pooled repeats' MAD gives a median of n (`_spread`): the
    MAD, not the standard deviation, so one wild night does not widen the band for weeks;
  * memory violates beyond a small relative bound, a rate beyond an absolute bound, the loss hash on
    any difference (``correctness regression``, at once: a fixed seed is not noise), status on ok -> not ok
    (``regression``, at once);
  * any other violation must persist: ``persist`` consecutive violating nights make a ``regression``
    (or ``improvement``); fewer are ``suspicious`` (or ``possible improvement``).
"""

from __future__ import annotations

import math
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from superoffload.nightly.metrics import SUITES, Metric
from superoffload.nightly.store import Annotation, History, Night, Sample

# labels, in the order a reader should see them
CORRECTNESS, REGRESSION, SUSPICIOUS = "correctness regression", "regression", "suspicious"
IMPROVEMENT, POSSIBLE_IMPROVEMENT, RECOVERED = "improvement", "possible improvement", "recovered"
OK, INSUFFICIENT, NONDETERMINISTIC, MISSING, INTENDED = "ok", "insufficient data", "nondeterministic", \
    "missing", "baseline reset"
ALERTS = (CORRECTNESS, REGRESSION)
SEVERITY = [CORRECTNESS, REGRESSION, SUSPICIOUS, IMPROVEMENT, POSSIBLE_IMPROVEMENT, RECOVERED, NONDETERMINISTIC,
            MISSING, INSUFFICIENT, INTENDED, OK]
MAD_TO_SIGMA = 1.4826  # the MAD of a normal sample times this estimates its standard deviation


@dataclass(frozen=True)
class RuleConfig:
    window: int = 10  # baseline: the last `window` unremarkable nights
    min_baseline: int = 4  # fewer earlier nights than this: insufficient data
    persist: int = 2  # consecutive violations before a regression
    k: float = 3.0  # allowed robust sigmas (the config's `sigma`)
    floors: dict[str, float] = field(default_factory=dict)  # per-metric bound overrides
    min_change: float = 0.05  # the smallest change point reported on a relative metric (asv's default)

    def bound(self, m: Metric) -> float:
        return float(self.floors.get(m.name, m.bound))


@dataclass
class Judgement:
    night: Night
    case: str
    metric: str
    label: str
    value: float | str | None = None  # this night's median (or hash / status)
    baseline: float | str | None = None  # the baseline's median (or its hash / status)
    change: float | None = None  # relative change, value / baseline - 1 (absolute for a rate)
    allowed: float | None = None  # the bound that applied, in the same units as change
    direction: int = 0  # -1 worse, +1 better, 0 neither
    baseline_nights: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def alert(self) -> bool:
        return self.label in ALERTS

    def as_dict(self) -> dict[str, Any]:
        return {
            "night": self.night.id, "utc": self.night.utc, "commit": self.night.commit, "case": self.case,
            "metric": self.metric, "label": self.label, "value": self.value, "baseline": self.baseline,
            "change": self.change, "allowed": self.allowed, "baseline_nights": self.baseline_nights,
            "note": self.note,
        }


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _mad(xs: list[float]) -> float:
    m = _median(xs)
    return _median([abs(x - m) for x in xs])


def night_value(samples: list[Sample], metric: Metric) -> float | str | None:
    """One night's value of a metric: the median over repeats (numbers), the common text (hash, status)."""
    if metric.rule == "status":
        texts = [s.text or "error" for s in samples]
        return "ok" if texts and all(t == "ok" for t in texts) else next((t for t in texts if t != "ok"), None)
    if metric.rule == "identical":
        texts = sorted({s.text for s in samples if s.text})
        return texts[0] if len(texts) == 1 else ("|".join(texts) if texts else None)
    nums = [s.value for s in samples if s.value is not None]
    return _median(nums) if nums else None


def _ancestry(repo: str | None) -> Callable[[str, str], bool]:
    def is_ancestor(a: str, b: str) -> bool:
        if b.startswith(a) or a.startswith(b):
            return True
        if not repo:
            return False
        r = subprocess.run(["git", "-C", repo, "merge-base", "--is-ancestor", a, b], capture_output=True)
        return r.returncode == 0

    return is_ancestor


def _reset_index(nights: list[Night], notes: list[Annotation], case: str, metric: str,
                 is_ancestor: Callable[[str, str], bool]) -> list[tuple[int, Annotation]]:
    """(index of the first night of the new baseline, annotation) for each reset of this case and metric."""
    out = []
    for a in notes:
        if not a.covers(case, metric):
            continue
        idx = None
        if a.from_night is not None:
            idx = next((i for i, n in enumerate(nights) if n.id >= a.from_night), None)
        elif a.commit:
            idx = next((i for i, n in enumerate(nights) if n.commit and is_ancestor(a.commit, n.commit)), None)
        if idx is not None:
            out.append((idx, a))
    return out


def judge_series(
    nights: list[Night],
    per_night: list[list[Sample]],
    metric: Metric,
    case: str,
    cfg: RuleConfig,
    resets: list[tuple[int, Annotation]] | None = None,
) -> list[Judgement]:
    """Judge every night of one case and metric (``per_night[i]``: night i's samples of it)."""
    out: list[Judgement] = []
    usable: list[int] = []  # indices of unremarkable nights since the newest reset
    run_worse = run_better = 0
    reset_at = {i: a for i, a in (resets or [])}
    bound = cfg.bound(metric)
    for i, (night, samples) in enumerate(zip(nights, per_night, strict=True)):
        if i in reset_at:
            usable, run_worse, run_better = [], 0, 0
        value = night_value(samples, metric)
        j = Judgement(night, case, metric.name, OK, value=value)
        if i in reset_at:
            j.note = f"{reset_at[i].kind}: {reset_at[i].note}"
        if value is None:
            j.label = MISSING
            out.append(j)
            continue
        base_idx = usable[-cfg.window:]
        j.baseline_nights = [nights[b].id for b in base_idx]
        if len(base_idx) < cfg.min_baseline:
            j.label = INTENDED if i in reset_at else INSUFFICIENT
            j.note = j.note or f"{len(base_idx)} of {cfg.min_baseline} baseline nights on this fingerprint"
            if metric.rule != "status" or value == "ok":
                usable.append(i)
            out.append(j)
            continue
        base_samples = [s for b in base_idx for s in per_night[b]]
        direction, immediate = _violation(j, metric, base_samples, [per_night[b] for b in base_idx], bound, cfg)
        if metric.rule == "status" and direction == 0 and i and value == "ok" \
                and night_value(per_night[i - 1], metric) not in ("ok", None):
            direction = 1  # the night after a failing one
        if j.label == NONDETERMINISTIC:
            out.append(j)
            continue
        if direction < 0:
            run_worse, run_better = run_worse + 1, 0
            j.direction = -1
            j.label = (CORRECTNESS if metric.rule == "identical" else REGRESSION) if immediate or \
                run_worse >= cfg.persist else SUSPICIOUS
        elif direction > 0:
            run_better, run_worse = run_better + 1, 0
            j.direction = 1
            j.label = RECOVERED if metric.rule == "status" else (
                IMPROVEMENT if run_better >= cfg.persist else POSSIBLE_IMPROVEMENT)
            if metric.rule == "status":
                usable.append(i)
        else:
            run_worse = run_better = 0
            usable.append(i)
        out.append(j)
    return out


def _violation(j: Judgement, metric: Metric, base: list[Sample], base_nights: list[list[Sample]], bound: float,
               cfg: RuleConfig) -> tuple[int, bool]:
    """Fill j's baseline / change / allowed; (-1 worse, +1 better, 0 within), and whether it is immediate."""
    if metric.rule == "status":
        prev = night_value(base_nights[-1], metric)
        j.baseline = prev
        return (-1 if prev == "ok" and j.value != "ok" else 0), True
    if metric.rule == "identical":
        hashes = {s.text for s in base if s.text}
        if len(hashes) != 1 or "|" in str(j.value):
            j.label = NONDETERMINISTIC
            j.note = "the repeats' loss trajectories differ among themselves: not a fixed-seed check here"
            return 0, False
        j.baseline = hashes.pop()
        return (-1 if j.value != j.baseline else 0), True
    medians = [v for v in (night_value(n, metric) for n in base_nights) if isinstance(v, float)]
    if not medians or not isinstance(j.value, float):
        j.label = MISSING
        return 0, False
    center = _median(medians)
    j.baseline = center
    if metric.rule == "bounded":
        j.change, j.allowed = j.value - center, bound
        worse = j.change > bound if metric.better == "lower" else -j.change > bound
        better = -j.change > bound if metric.better == "lower" else j.change > bound
        return (-1 if worse else 1 if better else 0), False
    if center <= 0 or j.value <= 0:
        j.change = 0.0 if j.value == center else float("inf")
        j.allowed = bound
        worse = j.value > center if metric.better == "lower" else j.value < center
        return (-1 if worse and j.value != center else 0), False
    j.change = j.value / center - 1.0
    if metric.rule == "exact":
        j.allowed = bound
        signed = j.change if metric.better == "higher" else -j.change  # > 0: better
        return (-1 if signed < -bound else 1 if signed > bound else 0), False
    # relative: on a log scale, so a halving and a doubling are the same distance and no bound is
    # unreachable (-100 % is); the spread is that of the baseline's night medians (what a night median is
    # compared with: a repeat is noisier than a median of repeats, and nights also differ among themselves)
    logs = [math.log(v) for v in medians if v > 0]
    allowed_log = max(math.log1p(bound), cfg.k * _spread(logs, base_nights, metric))
    j.allowed = math.expm1(allowed_log)
    signed = math.log(j.value / center) * (1 if metric.better == "higher" else -1)  # > 0: better
    return (-1 if signed < -allowed_log else 1 if signed > allowed_log else 0), False


def _spread(logs: list[float], base_nights: list[list[Sample]], metric: Metric) -> float:
    """Robust sd of a night median, on a log scale: the larger of the nights' own spread (1.4826 x MAD of
    their medians) and what the repeats' spread alone gives a median of n (1.2533 x sd / sqrt n, with the
    repeats' sd pooled over every baseline night). A handful of nights can agree by chance (their MAD
    then says 2 % on a machine whose repeats scatter by 15 %); the pooled repeats are many and do not."""
    between = MAD_TO_SIGMA * _mad(logs) if len(logs) > 1 else 0.0
    devs, sizes = [], []
    for night in base_nights:
        xs = [math.log(s.value) for s in night if s.value is not None and s.value > 0]
        if len(xs) > 1:
            m = _median(xs)
            devs += [abs(x - m) for x in xs]
            sizes.append(len(xs))
    if not devs:
        return between
    # the MAD of deviations from a median of n understates the repeats' spread (one of n is the median
    # itself, deviation 0): n / (n - 1) corrects it for the odd n a nightly uses
    n = _median([float(k) for k in sizes])
    within = MAD_TO_SIGMA * _median(devs) * (n / (n - 1) if n > 1 else 1.0)
    return max(between, 1.2533 * within / math.sqrt(n))


def judge(
    history: History,
    suite: str,
    fingerprint: str,
    cfg: RuleConfig,
    repo: str | None = None,
    metrics: dict[str, Metric] | None = None,
) -> dict[tuple[str, str], list[Judgement]]:
    """Every (case, metric) series of a suite on one fingerprint, judged night by night."""
    nights = history.nights(suite, fingerprint)
    if not nights:
        return {}
    catalog = metrics or SUITES[suite]
    values = history.values(nights)
    notes = history.annotations(suite, fingerprint)
    is_ancestor = _ancestry(repo)
    cases = sorted({c for per in values.values() for (c, _) in per})
    out: dict[tuple[str, str], list[Judgement]] = {}
    for case in cases:
        present = [n for n in nights if any(c == case for (c, _) in values[n.id])]
        for m in catalog.values():
            if m.rule == "recorded" or not any((case, m.name) in values[n.id] for n in present):
                continue
            per = [values[n.id].get((case, m.name), []) for n in present]
            resets = _reset_index(present, notes, case, m.name, is_ancestor)
            out[(case, m.name)] = judge_series(present, per, m, case, cfg, resets)
    return out


def latest(judged: dict[tuple[str, str], list[Judgement]], night: int | None = None) -> list[Judgement]:
    """The judgement of the newest night (or of night id ``night``) in each series, most severe first. A case
    the night lacks but an earlier night ran is a ``missing`` status row."""
    if not judged:
        return []
    target = night if night is not None else max(s[-1].night.id for s in judged.values())
    rows = []
    for (case, metric), series in judged.items():
        pick = next((j for j in series if j.night.id == target), None)
        if pick is not None:
            rows.append(pick)
        elif metric == "status" and series[-1].night.id < target:
            rows.append(Judgement(series[-1].night, case, metric, MISSING, baseline=series[-1].value,
                                  note="run before, absent from this night"))
    return sorted(rows, key=lambda j: (SEVERITY.index(j.label), j.case, j.metric))


def violation_start(series: list[Judgement], upto: Judgement) -> Judgement:
    """The first night of the run of violations in the same direction that ends at ``upto``."""
    i = series.index(upto)
    while i > 0 and series[i - 1].direction == upto.direction and series[i - 1].direction != 0:
        i -= 1
    return series[i]
