"""What a nightly measures: the metric catalog, and the values one run record contributes.

Each metric has a rule kind and a bad direction (rules.py applies them):
    relative   throughput and times: against the rolling baseline's median, allowed
               max(floor, k x robust spread) in the bad direction
    exact      memory: any change beyond a small relative bound (growth is the regression)
    identical  the loss trajectory of a fixed seed: a different hash is a correctness regression
    bounded    a rate: above the baseline's by more than an absolute bound
    status     ok -> not ok is always a regression
    recorded   kept in the history and shown, not judged (raw counters, the loss values themselves)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from superoffload.nightly.store import Sample


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    rule: str  # relative | exact | identical | bounded | status | recorded
    better: str  # higher | lower | none
    bound: float  # relative floor (relative), relative bound (exact), absolute bound (bounded)
    what: str


# Default bounds: docs/nightly.md gives the noise measurement each comes from.
TRAINING: dict[str, Metric] = {m.name: m for m in (
    Metric("status", "", "status", "none", 0.0, "run status (ok, error, oom, timeout, ...)"),
    Metric("tokens_per_s", "tokens/s", "relative", "higher", 0.10, "training throughput per device"),
    Metric("step_s_median", "s", "relative", "lower", 0.10, "median step time"),
    Metric("step_s_p90", "s", "relative", "lower", 0.20, "90th percentile step time"),
    Metric("host_step_s", "s", "relative", "lower", 0.20, "host Adam time per step (SuperOffload)"),
    Metric("peak_device_bytes", "B", "exact", "lower", 0.01, "peak device memory"),
    Metric("peak_host_bytes", "B", "exact", "lower", 0.05, "peak host RSS"),
    Metric("pinned_bytes", "B", "exact", "lower", 0.001, "pinned host memory the engine allocated"),
    Metric("loss_hash", "", "identical", "none", 0.0, "hash of the fixed-seed loss trajectory (bits)"),
    Metric("rollback_rate", "", "bounded", "lower", 0.05, "speculative steps rolled back / speculated"),
    Metric("spec_committed", "", "recorded", "none", 0.0, "speculative steps committed"),
    Metric("spec_rolled_back", "", "recorded", "none", 0.0, "speculative steps rolled back"),
    Metric("loss_final", "", "recorded", "none", 0.0, "last loss of the trajectory"),
    Metric("losses", "", "recorded", "none", 0.0, "the loss trajectory (JSON)"),
    Metric("spec", "", "recorded", "none", 0.0, "how the case ran (steps, warm-up, threads, dtype, clip; JSON)"),
    # a plan-optimality case (benchmarks/plan_optimality.py on a small grid, one case per point): the plan's tokens/s
    # over the best configuration's, per repeat of the grid (paired: the same repeat's runs sit side by side)
    Metric("planned_over_best", "", "relative", "higher", 0.10,
           "planned / best tokens/s of a small optimality grid (a planner regression lowers it)"),
    Metric("best_config", "", "recorded", "none", 0.0, "the grid's fastest configuration that night"),
)}

MICROBENCH: dict[str, Metric] = {m.name: m for m in (
    Metric("time_median_s", "s", "relative", "lower", 0.10, "median time of one call"),
    Metric("time_iqr_s", "s", "recorded", "none", 0.0, "interquartile range of the rounds"),
    Metric("time_min_s", "s", "recorded", "none", 0.0, "fastest round"),
    Metric("rounds", "", "recorded", "none", 0.0, "rounds measured"),
)}

SUITES: dict[str, dict[str, Metric]] = {"training": TRAINING, "microbench": MICROBENCH}
# how a case ran, as `bench run` flags: what `nightly bisect` needs to measure it again the same way
SPEC_KEYS = ("steps", "warmup", "threads", "dtype", "grad_clip")


def loss_hash(losses: list[Any]) -> str:
    """SHA-256 of the trajectory's exact bits (float.hex; a missing loss is 'none')."""
    parts = ["none" if v is None else float(v).hex() for v in losses]
    return hashlib.sha256(",".join(parts).encode()).hexdigest()[:16]


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


PLAN_OPTIMALITY_KIND = "plan_optimality"


def plan_optimality_case(point_id: str) -> str:
    """The nightly case of one optimality point ('gpt-tiny:s128:b2:w1:fp32' ->
    'plan_optimality_gpt-tiny_s128_b2_w1_fp32')."""
    return "plan_optimality_" + point_id.replace(":", "_")


def from_plan_optimality(rec: dict[str, Any]) -> list[Sample]:
    """The samples of a plan_optimality result (plan_optimality.schema.json): per point a case; per repeat of
    the grid the plan's tokens/s over the point's best configuration's (by median) in that same repeat; status
    ok when the grid finished and both ran every repeat; how it ran (its settings) as the spec."""
    out: list[Sample] = []
    settings = rec.get("settings") or {}
    spec = json.dumps({k: settings.get(k) for k in ("grid", "repeats", "steps", "warmup", "threads", "bind_cores",
                                                     "hardware", "peers") if k in settings}, sort_keys=True)
    for p in rec.get("points") or []:
        case = plan_optimality_case(p["id"])
        configs = {c["label"]: c for c in p.get("configs") or []}
        planned, best = configs.get("planned"), configs.get(p.get("best_label") or "")
        ok = bool(rec.get("complete")) and planned is not None and best is not None and not planned["errors"] \
            and not best["errors"] and len(planned["tokens_per_s"]) == len(best["tokens_per_s"]) > 0
        out += [Sample(case, 0, "status", text="ok" if ok else "error"), Sample(case, 0, "spec", text=spec)]
        if not ok:
            continue
        out.append(Sample(case, 0, "best_config", text=str(p["best_label"])))
        for i, (a, b) in enumerate(zip(planned["tokens_per_s"], best["tokens_per_s"], strict=True)):
            out.append(Sample(case, i, "planned_over_best", value=a / b))
    return out


def from_record(case: str, rep: int, rec: dict[str, Any]) -> list[Sample]:
    """The samples of one run record (a metric the record does not carry is left out, not zero); a
    plan_optimality result gives the samples of its points' cases (``from_plan_optimality``)."""
    if rec.get("kind") == PLAN_OPTIMALITY_KIND:
        return from_plan_optimality(rec)
    timing = rec.get("timing") or {}
    mem = rec.get("memory") or {}
    stats = rec.get("system_stats") or {}
    speculation = rec.get("rollbacks") or {}
    values: dict[str, float | None] = {
        "tokens_per_s": _num((rec.get("throughput") or {}).get("tokens_per_s")),
        "step_s_median": _num(timing.get("median_s")),
        "step_s_p90": _num(timing.get("p90_s")),
        "peak_device_bytes": _num(mem.get("peak_device_bytes")),
        "peak_host_bytes": _num(mem.get("peak_host_rss_bytes")),
        "pinned_bytes": _num(stats.get("pinned_bytes")),
    }
    steps = len(timing.get("step_times_s") or []) + len(timing.get("warmup_times_s") or [])
    host = _num((stats.get("time_s") or {}).get("host_step_s"))
    if host is not None and steps:
        values["host_step_s"] = host / steps
    if speculation.get("enabled") or speculation.get("speculated"):
        committed, rolled = int(speculation.get("committed", 0)), int(speculation.get("rolled_back", 0))
        values["spec_committed"], values["spec_rolled_back"] = committed, rolled
        if committed + rolled:
            values["rollback_rate"] = rolled / (committed + rolled)
    run = rec.get("run") or {}
    spec = {k: run[k] for k in SPEC_KEYS if run.get(k) is not None}
    out = [Sample(case, rep, "status", text=str(rec.get("status") or "error")),
           Sample(case, rep, "spec", text=json.dumps(spec, sort_keys=True))]
    out += [Sample(case, rep, k, value=v) for k, v in values.items() if v is not None]
    losses = rec.get("losses") or []
    if rec.get("status") == "ok" and losses:
        out.append(Sample(case, rep, "loss_hash", text=loss_hash(losses)))
        out.append(Sample(case, rep, "losses", text=json.dumps(losses)))
        last = _num(losses[-1])
        if last is not None:
            out.append(Sample(case, rep, "loss_final", value=last))
    return out


def from_pytest_benchmark(obj: dict[str, Any]) -> list[Sample]:
    """The samples of a pytest-benchmark JSON file: one case per benchmark."""
    out = []
    for b in obj.get("benchmarks", []):
        s = b.get("stats") or {}
        for metric, key in (("time_median_s", "median"), ("time_iqr_s", "iqr"), ("time_min_s", "min"),
                            ("rounds", "rounds")):
            if _num(s.get(key)) is not None:
                out.append(Sample(b["name"], 0, metric, value=float(s[key])))
        out.append(Sample(b["name"], 0, "status", text="ok"))
    return out
