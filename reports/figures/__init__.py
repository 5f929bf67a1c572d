"""Deterministic matplotlib figures of one results folder, one module per family:

- ``sweep``: run records and the cost model's GH200 predictions (throughput, MFU, largest model,
  predicted / paper);
- ``seqlen``: long sequences with Ulysses SP (Fig 12): measured sequence-parallel records and predictions;
- ``ablation``: the ablation runs;
- ``microbench``: the `bench adam` and `bench cast` files and the link curves;
- ``telemetry``: utilization timelines and rollback counters of the records;
- ``convergence``: the convergence check's loss curves (engine vs torch).

Every figure function takes the loaded results (reports.data.load_results) and returns a Figure; each
renders something when its data is missing (an empty-state text saying what is absent and why). SVGs are
byte-stable: fixed svg.hashsalt, no date metadata, text as text, sorted inputs.
Points are labelled by provenance: measured (our records), predicted (the cost model,
superoffload.planner), paper (the paper's value, with its status tag V/S: docs/paper_numbers.md).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import matplotlib

from reports import data as D
from reports.figures.ablation import ablation
from reports.figures.common import RC, empty, new_fig, params_of, plt
from reports.figures.convergence import caption as convergence_caption
from reports.figures.convergence import convergence
from reports.figures.microbench import adam_points, adam_rows, cast, cast_series, graceadam, link_bandwidth
from reports.figures.seqlen import seqlen
from reports.figures.sweep import largest_model, mfu_vs_seq, paper_comparison, scaling, throughput_vs_size
from reports.figures.telemetry import rollbacks, utilization, utilization_title

__all__ = ["CAPTIONS", "FIGURES", "adam_points", "adam_rows", "cast_series", "empty_note", "params_of", "render_all",
           "render_one", "svg_bytes", "title"]

FIGURES: dict[str, tuple[Callable[[dict], plt.Figure], str]] = {
    "throughput_vs_size": (
        throughput_vs_size,
        "Throughput (model TFLOPS per device) vs model size per "
        "system; measured lines, cost-model predictions for one GH200 dashed (Fig 10).",
    ),
    "mfu_vs_seq": (mfu_vs_seq, "MFU vs sequence length on one device (model FLOPs, no recompute)."),
    "seqlen": (
        seqlen,
        "Long sequences (Fig 12): MFU per device vs global sequence length with Ulysses sequence parallelism, per "
        "system and chip count; left measured here, right the cost model's GH200 predictions (dashed, OOM "
        "marked) with the paper's 55% at 1M tokens on 8 chips as the labelled reference.",
    ),
    "largest_model": (
        largest_model,
        "Largest trainable model per system on one GH200, predicted (the largest zoo model grown by whole blocks "
        "while it fits, with the memory that binds it) beside the paper's value; right: predicted against the chip "
        "count.",
    ),
    "scaling": (
        scaling,
        "Several ranks: measured tokens/s per device and aggregate of the multi-rank runs beside one rank; "
        "predicted TFLOPS per GH200 on 1, 4 and 16 chips (Fig 11).",
    ),
    "ablation": (
        ablation,
        "Ablation of the superoffload system, cumulative and leave-one-out, with the paper's per-technique factors.",
    ),
    "graceadam": (graceadam, "GraceAdam microbenchmark and its speed-ups vs the paper's table."),
    "cast": (cast, "Cast and transfer microbenchmark."),
    "link_bandwidth": (
        link_bandwidth,
        "Link bandwidth vs transfer size: calibration (measured) and the preset profile the predictions use.",
    ),
    "utilization": (utilization, "Utilization over time from the records' telemetry: the GPU's where the records "
                    "have it, else the host CPU's (one line per system, its largest configuration)."),
    "rollbacks": (rollbacks, "Speculation rollback counters from the records."),
    "paper_comparison": (paper_comparison, "Cost-model predictions divided by the paper's values."),
    "convergence": (
        convergence,
        "Convergence check: loss per step of the engine (speculation on, clipping at 1.0) and of plain torch "
        "AdamW on the same byte-tokenized text, and their difference (docs/finetune.md).",
    ),
}
# Figures whose caption ends with a sentence measured from the results: name -> fn(results) -> str
CAPTIONS: dict[str, Callable[[dict], str]] = {"convergence": convergence_caption}
# What each figure shows, as the report titles it (a function where it depends on the data)
TITLES: dict[str, str | Callable[[dict], str]] = {
    "throughput_vs_size": "Throughput vs model size", "mfu_vs_seq": "MFU vs sequence length, one device",
    "seqlen": "Long sequences (Fig 12)", "largest_model": "Largest trainable model (Fig 13)",
    "scaling": "Several ranks and chips (Fig 11)", "ablation": "Ablation", "graceadam": "GraceAdam microbenchmark",
    "cast": "Cast and transfer microbenchmark", "link_bandwidth": "Host-device link bandwidth",
    "utilization": utilization_title, "rollbacks": "Speculation rollbacks per run",
    "paper_comparison": "Cost-model prediction / paper", "convergence": "Convergence: engine vs torch",
}
EMPTY_MARK = "no data: "  # the SVG description of a figure whose every panel is empty


def title(name: str, results: dict) -> str:
    t = TITLES.get(name, name)
    return t(results) if callable(t) else t


def empty_note(svg: bytes) -> str | None:
    """The one line an all-empty figure says instead of its image (how to fill it), or None."""
    import re

    m = re.search(rb"<dc:description>" + re.escape(EMPTY_MARK.encode()) + rb"(.*?)</dc:description>", svg, re.S)
    return m[1].decode() if m else None


def svg_bytes(fig: plt.Figure) -> bytes:
    """The SVG of ``fig``; a figure whose every panel is empty says so in its description (EMPTY_MARK and the
    panels' texts), which the report shows as one line instead of the image."""
    buf = io.BytesIO()
    meta = {"Date": None, "Creator": "superoffload reports"}
    notes = [getattr(ax, "so_empty", None) for ax in fig.axes]
    if notes and all(notes):
        meta["Description"] = EMPTY_MARK + " ".join(dict.fromkeys(n for n in notes if n))
    fig.savefig(buf, format="svg", metadata=meta, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _draw(name: str, results: dict) -> plt.Figure:
    """Figure ``name``; one that raises becomes an empty-state figure saying so."""
    try:
        return FIGURES[name][0](results)
    except Exception as e:  # noqa: BLE001 - one bad figure must not sink the report
        fig, (ax,) = new_fig()
        empty(ax, f"{name}: could not draw ({type(e).__name__}: {D.first_line(str(e), 80)})")
        return fig


def render_all(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write every figure as <name>.svg; a figure that raises becomes an empty-state figure saying so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    with matplotlib.rc_context(RC):
        for name in FIGURES:
            path = out / f"{name}.svg"
            path.write_bytes(svg_bytes(_draw(name, results)))
            paths[name] = path
    return paths


def render_one(results: dict, name: str, out: str | Path) -> Path:
    """Write figure ``name`` as the SVG file ``out``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(RC):
        path.write_bytes(svg_bytes(_draw(name, results)))
    return path
