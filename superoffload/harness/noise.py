"""How quiet the machine was during a run, and a flag where it was not.

A run record's `noise` block: the 1-minute load average before and after the run, the share of the
machine's CPUs that other processes used while it ran (from /proc/stat less this process's own CPU time;
Linux only, else None), and the spread of the timed steps (p90 / p10). A busy machine moves a CPU
benchmark by whole factors (docs/measurement.md), so a run is flagged where:
- `spread`: p90 / p10 of its timed steps exceeds SPREAD_BOUND;
- `loaded`: other processes used more than OTHERS_BOUND of the CPUs during it (where /proc/stat cannot
  say: the load average before it exceeds LOAD_BOUND per usable CPU). The load average alone is not
  used where the share is known: it is a one-minute average that counts a sweep's previous run (measured
  here: 1.8-1.9 on 2 CPUs right after a run, with others at 0-1 %).
`bench compare` shows the spread and the flags; a flagged run's throughput is not a measurement of the
code alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from superoffload.planner.presets import usable_cpus

# bounds are judgments, not fits. Quiet gpt-tiny runs here (10-30 ms steps) spread 1.24-1.46; the same loop's
# steps varying 2x, or a quarter of the machine used by others, is not the code's doing
SPREAD_BOUND = 2.0  # p90/p10 of the timed steps
LOAD_BOUND = 1.5  # runnable processes per usable CPU in the minute before the run (without /proc/stat)
OTHERS_BOUND = 0.25  # share of all CPUs other processes used during the run


def _proc_stat_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs since boot, or None where /proc/stat is not readable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    vals = [int(v) for v in fields[1:8]]  # user nice system idle iowait irq softirq
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def _own_cpu_s(children: bool = False) -> float:
    t = os.times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


@dataclass
class NoiseSampler:
    """Sample at the start of a run (`start`) and assess at its end (`assess`)."""

    load_before: tuple[float, float, float] | None = None
    jiffies_before: tuple[int, int] | None = None
    own_before: float = 0.0
    wall_before: float = 0.0
    children: bool = False  # count the CPU time of the children it waited for as its own (calibrate's ranks)

    def _own(self) -> float:
        return _own_cpu_s(True) if self.children else _own_cpu_s()

    def start(self) -> NoiseSampler:
        self.load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
        self.jiffies_before = _proc_stat_jiffies()
        self.own_before = self._own()
        self.wall_before = time.perf_counter()
        return self

    def others_share(self, ranks: int = 1) -> float | None:
        """Other processes' share of all CPUs since `start`. With several ranks on the machine each is taken
        to use what this one did (they run the same loop), so they do not count as others."""
        after = _proc_stat_jiffies()
        if self.jiffies_before is None or after is None:
            return None
        busy, total = after[0] - self.jiffies_before[0], after[1] - self.jiffies_before[1]
        if total <= 0:
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        ncpu = os.cpu_count() or 1
        own = (self._own() - self.own_before) * tick * max(1, ranks)
        return max(0.0, min(1.0, (busy - own) / total)) if total >= ncpu else None

    def assess(self, step_times: list[float], ranks: int = 1) -> dict[str, Any]:
        load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
        cpus = usable_cpus()
        s = sorted(step_times)
        spread = None
        if len(s) >= 2:
            p10, p90 = _pct(s, 10), _pct(s, 90)
            spread = p90 / p10 if p10 > 0 else None
        others = self.others_share(ranks)
        flags = []
        if spread is not None and spread > SPREAD_BOUND:
            flags.append("spread")
        if others is not None:
            if others > OTHERS_BOUND:
                flags.append("loaded")
        elif self.load_before is not None and self.load_before[0] / cpus > LOAD_BOUND:
            flags.append("loaded")
        return {"loadavg_before": list(self.load_before) if self.load_before else None,
                "loadavg_after": list(load_after) if load_after else None, "usable_cpus": cpus,
                "others_cpu_share": others, "p90_over_p10": spread, "flags": flags,
                "bounds": {"p90_over_p10": SPREAD_BOUND, "load_per_cpu": LOAD_BOUND, "others_cpu_share": OTHERS_BOUND}}


def _pct(sorted_vals: list[float], q: float) -> float:
    from superoffload.harness.stats import percentile

    return percentile(sorted_vals, q)


def flags_of(rec: dict[str, Any]) -> list[str]:
    """A record's noise flags ([] for a quiet run or a record written before the block existed)."""
    noise = rec.get("noise") or {}
    return list(noise.get("flags") or [])
