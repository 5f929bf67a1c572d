"""What every figure shares: the matplotlib style (byte-stable SVGs), system colours and point styles,
empty-state axes, and small accessors of the loaded results."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from reports import data as D  # noqa: E402
from superoffload import catalog  # noqa: E402

RC = {
    "svg.hashsalt": "superoffload-report",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "path.simplify": False,
}
COLORS = {s.name: s.color for s in catalog.SYSTEMS}  # the catalog's (superoffload/catalog.py)
STYLE = {
    "measured": dict(marker="o", linestyle="-"),
    "predicted": dict(marker="s", linestyle="--"),
    "paper": dict(marker="*", linestyle=":"),
}


def footnote(fig: plt.Figure, text: str) -> None:
    """A small grey note under the axes (sources, status labels), leaving room for it in the layout."""
    fig.text(0.01, 0.01, text, fontsize=7, color="#666666")
    fig.tight_layout(rect=(0, 0.05, 1, 1))


def legend_outside(ax, fontsize: float = 6) -> None:
    """The legend right of the axes, never over the data (the layout makes room for it)."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def system_color(system: str) -> str:
    return COLORS.get(system, "#8c564b")


def sys_key(system: str) -> tuple[int, str]:
    """The report's order of systems (the catalog's), in figures as in tables."""
    return D.system_key(system)


def sys_sorted(systems) -> list[str]:
    return sorted(systems, key=sys_key)


def empty(ax, text: str) -> None:
    """An empty-state panel: ``text`` says what is missing and how to fill it. The axes is marked, so a
    figure whose every panel is empty can be shown as that one line instead (figures.svg_bytes)."""
    ax.so_empty = " ".join(text.split())
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        wrap=True,
        transform=ax.transAxes,
        fontsize=9,
        color="#666666",
        bbox=dict(boxstyle="round", fc="#f6f6f6", ec="#cccccc"),
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def new_fig(ncols: int = 1, width: float = 6.4, height: float = 3.6):
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def status_note(records: list[dict]) -> str:
    c = D.status_counts(records)
    return f"{c['ok']} ok, {c['oom']} oom, {c['error']} error records"


def pred_rows(results: dict, figure: str) -> list[dict]:
    pc = results["paper_comparison"]
    rows = (pc.get("data") or {}).get("rows") or [] if pc["status"] == "ok" else []
    return [r for r in rows if isinstance(r, dict) and r.get("figure") == figure]


def params_of(model: str) -> float | None:
    """Parameters of a zoo label such as gpt-13b (billions in the label)."""
    tail = model.rsplit("-", 1)[-1].lower()
    if tail.endswith("b"):
        try:
            return float(tail[:-1]) * 1e9
        except ValueError:
            return None
    return None
