"""What binds: the largest model per system and chip count (the paper's Fig 13) with the memory one more
block would overflow, and for each predicted point that does not fit (Figs 10-12) the memory it overflows.
The report says "does not fit: host memory needs 489 GB of 480 GB" instead of a bare OOM, and explains why
SuperOffload fits 32.6B where ZeRO-Offload fits 28.6B: the bytes per parameter each asks of the memory that
binds it.

Everything comes from the planner's public functions (superoffload.planner.paper.largest_model and
largest_params for the sizes; plan.check_feasible for SuperOffload's plan, costmodel.estimate_memory for the
other systems' itemised memory), at each figure's settings (paper.FIG10_*, FIG11_SETTINGS, FIG12_*,
FIG13_*). Nothing here is fitted or tuned.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

# The systems of Fig 13 that the cost model knows, in the order the paper's figure lists them
SYSTEMS = ("superoffload", "ds_superoffload", "zero_offload", "zero_infinity", "fsdp_offload", "torch")


def _grown_layers(base: Any, params: int) -> int:
    """Layers of ``base`` grown by whole blocks to ``params`` (largest_params keeps hidden, heads and
    vocabulary, so the difference is a whole number of blocks)."""
    return base.layers + round((params - base.total_params()) / base.block_params())


def binding(system: str, shape: Any, hw: Any, seq: int, batch: int, chips: int = 1,
            ranks_per_node: int | None = None, sp: int = 1) -> dict[str, Any]:
    """Which memory ``system`` training ``shape`` overflows, with need and capacity in bytes and the need
    per parameter; memory "none" when it fits. ``sp`` > 1: the Fig 12 setting (Ulysses degree sp,
    checkpoints in host memory)."""
    from superoffload.planner.costmodel import Workload, estimate_memory
    from superoffload.planner.plan import PlanInfeasible, check_feasible, positions_for
    from superoffload.planner.systems import Options, system_spec

    n = shape.total_params()
    long_seq = {"sp": sp, "offload_checkpoints": True} if sp > 1 else {}
    if system == "superoffload":
        try:
            check_feasible(shape, seq, batch, hw, chips=chips, ranks_per_node=ranks_per_node, **long_seq)
        except PlanInfeasible as e:  # the planner's leanest configuration, with its own reason
            return {"memory": e.memory or "?", "need_bytes": e.need_bytes, "capacity_bytes": e.available_bytes,
                    "bytes_per_param": e.need_bytes / n if n else None}
        return {"memory": "none", "need_bytes": None, "capacity_bytes": None, "bytes_per_param": None}
    shape = positions_for(shape, seq)  # as the harness builds it (and paper.fig12 predicts it)
    n = shape.total_params()
    w = Workload(shape, seq, batch, True, chips=chips, ranks_per_node=ranks_per_node, **long_seq)
    mem = estimate_memory(w, hw, system_spec(system, Options(), n, world=chips), Options())
    if hw.device_is_host:  # one memory holds both (as costmodel.fits_memory counts it)
        need = mem.device_total + mem.host_total
        return {"memory": "host" if need > hw.host_memory_bytes else "none", "need_bytes": need,
                "capacity_bytes": hw.host_memory_bytes, "bytes_per_param": need / n}
    device_over = mem.device_total / hw.device_hbm_bytes
    host_over = mem.host_total / hw.host_memory_bytes
    if max(device_over, host_over) <= 1.0:
        return {"memory": "none", "need_bytes": None, "capacity_bytes": None, "bytes_per_param": None}
    # the memory over its limit by the larger share binds (both over: the worse one)
    if device_over >= host_over:
        return {"memory": "device", "need_bytes": mem.device_total, "capacity_bytes": hw.device_hbm_bytes,
                "bytes_per_param": mem.device_total / n}
    return {"memory": "host", "need_bytes": mem.host_total, "capacity_bytes": hw.host_memory_bytes,
            "bytes_per_param": mem.host_total / n}


def largest_rows(hardware: str = "gh200", chip_counts: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """One row per system and chip count: the largest zoo model that fits, the largest by whole blocks
    (params), and ``binding``: the memory one more block overflows (need, capacity, bytes per parameter)."""
    from superoffload.planner import paper as PP
    from superoffload.planner.presets import get_profile
    from superoffload.shapes import MODELS

    hw = get_profile(hardware)
    rows = []
    for chips in chip_counts or PP.CHIP_COUNTS:
        for system in SYSTEMS:
            zoo, _ = PP.largest_model(system, hw, chips)
            if zoo is None:
                rows.append({"system": system, "chips": chips, "zoo_model": None, "params": None, "layers": None,
                             "binding": None, "hardware": hw.name})
                continue
            _, params = PP.largest_params(system, hw, chips)
            base = MODELS[zoo]
            layers = _grown_layers(base, params)
            nxt = replace(base, layers=layers + 1)
            per_node = PP.FIG13_LAYOUT.get(chips) if chips > 1 else None
            b = binding(system, nxt, hw, PP.FIG13_SEQ, PP.FIG13_BATCH, chips, per_node)
            rows.append({"system": system, "chips": chips, "zoo_model": zoo, "zoo_layers": base.layers,
                         "params": params, "layers": layers, "binding": {**b, "at_params": nxt.total_params()},
                         "hardware": hw.name})
    return rows


def does_not_fit(rows: list[dict[str, Any]], hardware: str = "gh200") -> list[dict[str, Any]]:
    """For each paper_comparison row predicted not to fit (a Fig 10 / 11 model TFLOPS or Fig 12 MFU point
    without a value, noted "OOM"): {figure, point, chips, binding} at that figure's settings."""
    from superoffload.planner import paper as PP
    from superoffload.planner.presets import get_profile
    from superoffload.shapes import get_shape

    hw = get_profile(hardware)
    out = []
    for r in rows:
        if r.get("predicted") is not None or r.get("note") != "OOM" or r.get("paper") is not None:
            continue
        chips = r.get("chips") or 1
        parts = str(r.get("point", "")).split()
        if r.get("figure") == "fig10" and r.get("metric") == "model_tflops" and len(parts) == 2:
            b = binding(parts[1], get_shape(parts[0]), hw, PP.FIG10_SEQ, PP.FIG10_BATCH)
        elif r.get("figure") == "fig11" and r.get("metric") == "model_tflops" and len(parts) == 2:
            seq, batch, per_node = PP.FIG11_SETTINGS[chips]
            b = binding(parts[1], get_shape(parts[0]), hw, seq, batch, chips, per_node)
        elif r.get("figure") == "fig12" and r.get("metric") == "mfu" and len(parts) == 4:
            b = binding(parts[3], get_shape(parts[0]), hw, int(parts[2]), 1, chips, PP.FIG12_LAYOUT.get(chips),
                        sp=chips)
        else:
            continue
        out.append({"figure": r["figure"], "point": r["point"], "chips": chips, "binding": b})
    return out
