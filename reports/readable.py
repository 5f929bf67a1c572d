"""Machine files made readable: the calibrated hardware profile, the microbenchmark files, the planner's
plans (`explain`) and the environment, each as a short table of quantities with units instead of a dump of
15-digit floats, `None` cells and every point of every curve. The files themselves stay beside the report
for whoever needs the raw values; the report says where."""

from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any

from reports import formatting as fm
from reports import tables as T


def seconds(x: Any) -> str:
    """A duration with a unit that fits: 45.2 µs, 12.3 ms, 2.11 s."""
    v = fm.value(x)
    if v is None:
        return fm.DASH
    if abs(v) < 1e-3:
        return f"{fm.sig(v * 1e6)} µs"
    if abs(v) < 1:
        return f"{fm.sig(v * 1e3)} ms"
    return f"{fm.sig(v)} s"


def gbps(x: Any) -> str:
    v = fm.value(x)
    return fm.DASH if v is None else f"{fm.sig(v)} GB/s"


def flops(x: Any) -> str:
    """FLOP/s: 836 GFLOP/s, 989 TFLOP/s."""
    v = fm.value(x)
    if v is None:
        return fm.DASH
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if abs(v) >= scale:
            return f"{fm.sig(v / scale)} {unit}"
    return f"{fm.sig(v)} FLOP/s"


def curve(c: Any) -> str:
    """A link curve {sizes, gbps} in one line: its peak and where (the figure draws the points)."""
    if not isinstance(c, dict) or not c.get("sizes") or not c.get("gbps"):
        return fm.DASH
    pts = [(s, g) for s, g in zip(c["sizes"], c["gbps"], strict=False) if fm.value(g) is not None]
    if not pts:
        return fm.DASH
    size, peak = max(pts, key=lambda p: p[1])
    return (f"peak {gbps(peak)} at {fm.nbytes(size)} ({len(pts)} sizes, {fm.nbytes(pts[0][0])}–"
            f"{fm.nbytes(pts[-1][0])})")


def _per_key(d: Any, fmt: Callable[[Any], str]) -> str:
    if not isinstance(d, dict) or not d:
        return fm.DASH
    return ", ".join(f"{k} {fmt(v)}" for k, v in sorted(d.items()) if fm.value(v) is not None) or fm.DASH


def _collectives(d: Any) -> str:
    if not isinstance(d, dict) or not d:
        return fm.DASH
    parts = []
    for link, c in sorted(d.items()):
        if isinstance(c, dict):
            parts.append(f"{link} ({c.get('backend', '?')}): {_per_key(c.get('gbps'), gbps)}")
    return "; ".join(parts) or fm.DASH


def _keys(d: Any) -> str:
    if not isinstance(d, dict) or not d:
        return fm.DASH
    return f"{len(d)}: " + ", ".join(sorted(d))


# A profile field -> how it reads (fields not named here go by their suffix: _bytes, _gbps, _flops, _s)
PROFILE_FIELDS: dict[str, Callable[[Any], str]] = {
    "h2d_pinned": curve, "d2h_pinned": curve, "h2d_pageable": curve, "d2h_pageable": curve,
    "matmul_curve": curve, "attention_curve": curve, "host_adam_gbps": lambda d: _per_key(d, gbps),
    "collectives": _collectives, "compute_profiles": _keys, "system_step_s": _keys,
    "gelu_elems_per_s": lambda x: f"{fm.params(x)}/s" if fm.value(x) else fm.DASH,
}
SKIP = {"notes", "name", "source"}  # said in the section's text


def _by_suffix(key: str) -> Callable[[Any], str]:
    if key in PROFILE_FIELDS:
        return PROFILE_FIELDS[key]
    if key.endswith("_bytes"):
        return fm.nbytes
    if key.endswith("_gbps"):
        return gbps
    if key.endswith("_flops"):
        return flops
    if key.endswith("_s"):
        return seconds
    return fm.text


def profile_table(profile: dict[str, Any] | None) -> T.Table | None:
    """A HardwareProfile (calibrated or preset) as quantity / value rows with units; fields without a
    value are left out and counted."""
    if not isinstance(profile, dict):
        return None
    rows = [{"quantity": k.replace("_", " "), "value": v, "_key": k} for k, v in sorted(profile.items())
            if k not in SKIP]
    cols = [T.Column("quantity", "quantity", left=True, key_column=True),
            T.Column("value", "value", left=True)]
    # the value column's text depends on the field: format it before the table builder sees it
    for r in rows:
        r["value"] = _by_suffix(r["_key"])(r["value"]) if r["value"] is not None else None
    return T.build(rows, cols, row_noun="fields")


# --- `bench adam` --------------------------------------------------------------------------------------
def adam_table(rows: list[dict[str, Any]]) -> T.Table:
    """The GraceAdam microbenchmark's rows (reports.figures.microbench.adam_rows) with units."""
    for r in rows:
        r["spread"] = f"{fm.ms(r['p10_s'])}–{fm.ms(r['p90_s'])}" if r.get("p10_s") is not None else None
    cols = [T.Column("phase", "phase", left=True, key_column=True),
            T.Column("impl", "implementation", left=True, key_column=True),
            T.Column("threads", "threads", key_column=True),
            T.Column("numel", "params", fm.params, key_column=True),
            T.Column("median_s", "median ms", fm.ms), T.Column("spread", "p10–p90 ms"),
            T.Column("ns_per_param", "ns/param", fm.sig), T.Column("gbps", "GB/s", fm.sig)]
    return T.build(rows, cols)


# --- `bench cast` --------------------------------------------------------------------------------------
def cast_tables(cast: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per path of a valid `bench cast` file, one row per (path, policy): the median time over the sizes
    measured and the speed-up of casting on the device, instead of one row per size (the figure draws
    every size)."""
    if not cast:
        return []
    out = []
    for name, what in (("grad_path", "gradients to the host"), ("param_path", "parameters to the device")):
        groups: dict[tuple[str, str], list[dict]] = {}
        for r in cast.get(name) or []:
            groups.setdefault((r["path"], r["policy"]), []).append(r)
        rows = []
        for (path, policy), rs in sorted(groups.items()):
            sizes = sorted(r["size_bytes"] for r in rs)
            big = max(rs, key=lambda r: r["size_bytes"])
            rows.append({"path": path, "policy": policy, "sizes": f"{len(rs)}: {fm.nbytes(sizes[0])}–"
                         f"{fm.nbytes(sizes[-1])}", "largest": seconds(big["median_s"]),
                         "rate": f"{fm.params(big['elems_per_s'])}/s" if fm.value(big.get("elems_per_s")) else None,
                         "speedup": median([r["device_cast_speedup"] for r in rs
                                            if fm.value(r.get("device_cast_speedup")) is not None] or [0]) or None})
        cols = [T.Column("path", "path", left=True, key_column=True),
                T.Column("policy", "policy", left=True, key_column=True),
                T.Column("sizes", "sizes measured", left=True, key_column=True),
                T.Column("largest", "median at the largest size"), T.Column("rate", "elements/s at it"),
                T.Column("speedup", "device cast speed-up (median over sizes)", fm.ratio)]
        if rows:
            out.append({"name": name, "what": what, "table": T.build(rows, cols)})
    links = [r for r in cast.get("link") or []]
    if links:
        rows = []
        for (direction, memory) in sorted({(r["direction"], r["memory"]) for r in links}):
            rs = [r for r in links if (r["direction"], r["memory"]) == (direction, memory)]
            rows.append({"link": f"{direction} {memory}",
                         "curve": curve({"sizes": [r["size_bytes"] for r in rs], "gbps": [r["gbps"] for r in rs]})})
        out.append({"name": "link", "what": "host-device copies",
                    "table": T.build(rows, [T.Column("link", "copy", left=True, key_column=True),
                                            T.Column("curve", "bandwidth", left=True)])})
    return out


# --- `superoffload explain` plans ------------------------------------------------------------------------
PLAN_CHOICES = ("bucket_size", "device_tail_buckets", "grad_cast", "param_cast", "speculation", "rollback_mode",
                "upload_slots", "flow_layers", "host_optimizer", "loss_tile")


def plan_row(name: str, plan: dict[str, Any]) -> dict[str, Any]:
    """One plan's predicted step and its choices, for the plans table."""
    p = plan.get("predicted") or {}
    choices = []
    for k in PLAN_CHOICES:
        v = plan.get(k)
        if v in (None, [], ()):
            continue
        if k == "bucket_size":
            v = fm.params(v)
        elif k == "flow_layers":
            v = f"{len(v)} layers"
        choices.append(f"{k.replace('_', ' ')} {v}")
    return {"point": f"{plan.get('model', name)} seq {plan.get('seq')} batch {plan.get('batch')}"
            + (f" on {plan['chips']} chips" if (plan.get("chips") or 1) > 1 else ""),
            "status": "ok", "step": seconds(p.get("step_time_s")), "tokens": fm.sig(p.get("tokens_per_s")),
            "tflops": fm.sig(p.get("tflops")), "mfu": fm.pct(p.get("mfu")), "hbm": fm.nbytes(p.get("peak_hbm_bytes")),
            "host": fm.nbytes(p.get("host_bytes")), "choices": "; ".join(choices),
            "reasons": [str(x) for x in plan.get("reasons") or []]}


PLAN_COLUMNS = [T.Column("point", "point", left=True, key_column=True),
                T.Column("status", "status", badge=True, key_column=True),
                T.Column("step", "step"), T.Column("tokens", "tokens/s"), T.Column("tflops", "TFLOPS"),
                T.Column("mfu", "MFU"), T.Column("hbm", "peak HBM"), T.Column("host", "host memory"),
                T.Column("choices", "choices", left=True)]


# --- provenance ------------------------------------------------------------------------------------------
def provenance_fields(prov: dict[str, Any]) -> list[tuple[str, str]]:
    """The environment's scalar fields, readable (no `None`: a field without a value is left out)."""
    out = []
    for k, v in sorted(prov.items()):
        if isinstance(v, (dict, list)) or v is None or v == "":
            continue
        out.append((k.replace("_", " "), fm.text(v)))
    return out
