"""How often the nightly rules and change points raise a false alarm, and how often they find a real step,
at a given noise: simulated histories judged by superoffload.nightly exactly as `nightly check` judges.

    python benchmarks/nightly_power.py                       # this machine's measured noise and a quiet node's
    python benchmarks/nightly_power.py --night-sd 0.08 --repeat-sd 0.15 --histories 300

A history is `--nights` nights of 3 repeats; a night's repeats share a night effect (sd `--night-sd`, log
scale) and scatter around it (sd `--repeat-sd`). With a step, the level drops by STEP from night 17 on.
Printed per noise: the share of unchanged histories with a false regression / a false change point, and
the share of stepped ones flagged a regression within 4 nights of the step / given a change point within
one night of it.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from superoffload.nightly import rules as R
from superoffload.nightly.changes import segments
from superoffload.nightly.metrics import TRAINING
from superoffload.nightly.store import Night, Sample

STEP_AT = 17


def simulate(rng: random.Random, nights: int, night_sd: float, repeat_sd: float, step: float) -> list[list[Sample]]:
    out = []
    for i in range(nights):
        level = 1000 * math.exp(rng.gauss(0, night_sd)) * ((1 - step) if i >= STEP_AT else 1)
        out.append([Sample("c", r, "tokens_per_s", value=level * math.exp(rng.gauss(0, repeat_sd))) for r in range(3)])
    return out


def rates(histories: int, nights: int, night_sd: float, repeat_sd: float, step: float,
          cfg: R.RuleConfig) -> tuple[float, float]:
    """(share flagged a regression, share with a change point) - within reach of the step when there is one."""
    rng = random.Random(0)
    metric = TRAINING["tokens_per_s"]
    ns = [Night(i, "training", f"{i:04d}", None, None, "fp", {}, str(i)) for i in range(nights)]
    flagged = changed = 0
    for _ in range(histories):
        per = simulate(rng, nights, night_sd, repeat_sd, step)
        labels = [j.label for j in R.judge_series(ns, per, metric, "c", cfg)]
        medians = [statistics.median(s.value for s in night) for night in per]
        bounds = [0, *segments(medians), nights]
        cps = [b for a, b, c in zip(bounds, bounds[1:], bounds[2:], strict=False)
               if abs(statistics.median(medians[b:c]) / statistics.median(medians[a:b]) - 1) >= cfg.min_change]
        if step:
            flagged += R.REGRESSION in labels[STEP_AT:STEP_AT + 4]
            changed += any(abs(b - STEP_AT) <= 1 for b in cps)
        else:
            flagged += R.REGRESSION in labels
            changed += bool(cps)
    return flagged / histories, changed / histories


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--night-sd", type=float, action="append")
    p.add_argument("--repeat-sd", type=float, action="append")
    p.add_argument("--histories", type=int, default=200)
    p.add_argument("--nights", type=int, default=30)
    a = p.parse_args()
    noises = list(zip(a.night_sd or [0.08, 0.01], a.repeat_sd or [0.15, 0.02], strict=True))
    cfg = R.RuleConfig()
    print(f"defaults: window {cfg.window}, min_baseline {cfg.min_baseline}, persist {cfg.persist}, k {cfg.k}, "
          f"floor {TRAINING['tokens_per_s'].bound:.0%}; {a.histories} histories of {a.nights} nights each")
    print(f"{'night sd':>8}  {'repeat sd':>9}  {'step':>5}  {'regression':>10}  {'change point':>12}")
    for night_sd, repeat_sd in noises:
        for step in (0.0, 0.15, 0.30):
            reg, cp = rates(a.histories, a.nights, night_sd, repeat_sd, step, cfg)
            print(f"{night_sd:8.0%}  {repeat_sd:9.0%}  {step:5.0%}  {reg:10.1%}  {cp:12.1%}")


if __name__ == "__main__":
    main()
