"""The convergence check (`snakemake convergence`): loss per step of the engine and of plain torch on the
same text, and their difference.

The file is ``<results>/convergence/convergence.json``, read as ``superoffload/harness/convergence.schema.json``
defines it (reports.data.load_result): a missing, failed or invalid file is an empty state saying so,
never guessed at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports import data as D
from reports.figures.common import empty, footnote, new_fig, plt, system_color

FILE = Path("convergence") / "convergence.json"


def convergence_item(results: dict) -> dict[str, Any]:
    """{"status", "data", "error", "path"} of the results folder's convergence file."""
    return D.load_result(Path(results["dir"]) / FILE, "convergence")


def caption(results: dict) -> str:
    """The measured sentence for the figure's caption (the maximum difference), or why there is none."""
    item = convergence_item(results)
    if item["status"] != "ok":
        return f"Not available ({item['status']}): run `snakemake convergence`."
    d = item["data"]
    c, s = d["comparison"], d["settings"]
    return (f"Measured: max |Δloss| = {c['max_abs_diff']:.3g} at step {c['max_abs_diff_step']} of {s['steps']} "
            f"(relative {c['max_rel_diff']:.3g}; tolerance {c['tolerance_rel']:g}: "
            f"{'within' if c['within_tolerance'] else 'EXCEEDED'}), {s['model']} on "
            f"{d['corpus']['tokens']:,} byte tokens of Python {d['corpus']['python']} standard library source.")


def convergence(results: dict) -> plt.Figure:
    fig, (ax1, ax2) = new_fig(2, width=9.0, height=3.6)
    item = convergence_item(results)
    ax1.set_title("Loss per step: engine vs torch AdamW", fontsize=9)
    ax2.set_title("|Δloss| per step", fontsize=9)
    if item["status"] != "ok":
        hint = ("run `snakemake convergence`, then re-render the report" if item["status"] == "missing"
                else D.first_line(item.get("error"), 200))
        text = f"Convergence check not available ({item['status']}): {hint}."
        empty(ax1, text)
        empty(ax2, text)
        return fig
    d = item["data"]
    curves, c, s = d["curves"], d["comparison"], d["settings"]
    steps = range(1, len(curves["torch"]) + 1)
    ax1.plot(steps, curves["torch"], color=system_color("torch"), lw=2.2, label="torch AdamW + clip_grad_norm_")
    ax1.plot(steps, curves["superoffload"], color=system_color("superoffload"), lw=0.9, ls="--",
             label="superoffload (speculation on)")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("cross-entropy (nats / token)")
    ax1.legend(fontsize=7)
    diffs = [abs(a - b) for a, b in zip(curves["superoffload"], curves["torch"], strict=True)]
    shown = [(i, x) for i, x in zip(steps, diffs, strict=True) if x > 0]
    if shown:
        ax2.semilogy([i for i, _ in shown], [x for _, x in shown], color=system_color("superoffload"), lw=0.8)
    ax2.axhline(c["max_abs_diff"], color="#999999", lw=0.6, ls=":")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("|loss(superoffload) - loss(torch)|")
    sp = d["speculation"]
    footnote(fig, f"max |Δloss| {c['max_abs_diff']:.3g} at step {c['max_abs_diff_step']} (relative "
                  f"{c['max_rel_diff']:.3g}); {c['identical_steps']} of {s['steps']} steps identical; "
                  f"{s['dtype']}, clip {s['grad_clip']}, lr {s['lr']:g}; engine: {sp['speculated']} steps "
                  f"speculated, {sp['rolled_back']} rolled back (clipping).")
    return fig
