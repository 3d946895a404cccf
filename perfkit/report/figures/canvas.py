"""What every report figure is drawn with: a figure of fixed margins on matplotlib's Agg canvas (the
object API, no pyplot: no global state, no display), its PNG bytes, Okabe & Ito's colour-blind-safe
palette (as model_analyzer's detailed report uses), the load axis, legends under the axes (inside,
they cover points and the y axis's ticks), labels placed clear of the points and lines, and an axis
limit robust to a far outlier.

The figure modules call these through the module (`canvas.png(fig)`), so that a test can replace
one for all of them.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from perfkit.results.model import SweepResult

__all__ = [
    "PALETTE", "Run", "centred_note", "clip_right", "legend_below", "load_axis_label", "new_figure",
    "place_labels", "png", "robust_upper", "set_load_axis", "top_legend",
]  # fmt: skip


# Okabe & Ito (2008), "Color Universal Design".
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_GRID = "#d9d9d9"
_SIZE = (6.4, 3.7)
_DPI = 110

Run = tuple[str, SweepResult]  # (label, result)


def new_figure(
    size: tuple[float, float] = _SIZE, *, right: float = 0.2, bottom: float = 0.55, top: float = 0.35
) -> tuple[Figure, Any]:
    """A figure with one axes and fixed margins in inches (`right` wider for a twin axis). Fixed
    margins rather than constrained layout, which lays out by drawing twice: half the time."""
    fig = Figure(figsize=size, dpi=_DPI)
    FigureCanvasAgg(fig)
    width, height = size
    fig.subplots_adjust(left=0.75 / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)
    ax = fig.add_subplot()
    ax.grid(True, color=_GRID, linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes, on white."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI, facecolor="white")
    return buffer.getvalue()


def load_axis_label(mode: str) -> str:
    return {"concurrency": "concurrency (requests in flight)", "request_rate": "offered rate (requests/s)"}.get(
        mode, "offered rate (requests/s)"
    )


def set_load_axis(ax: Any, levels: Sequence[float], mode: str) -> None:
    """The x axis of load: labelled by mode, logarithmic (base 2) when the levels span 16× or more,
    whole numbers for concurrency."""
    ax.set_xlabel(load_axis_label(mode))
    positive = [v for v in levels if v > 0]
    if positive and max(positive) / min(positive) >= 16:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    elif mode == "concurrency":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def centred_note(ax: Any, text: str) -> None:
    """`text` in the middle of the axes: why a figure has nothing to draw."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555", fontsize=10)


def top_legend(fig: Figure, *axes: Any) -> None:
    """One legend for all axes, in the figure's top right corner, clear of the data."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        fig.legend(handles, labels, loc="upper right", ncols=len(handles), frameon=False, fontsize=8)


def legend_below(fig: Figure, *axes: Any, fontsize: float = 8, **kwargs: Any) -> None:
    """One legend for `axes`, under the x axis's label, outside the data: a legend inside the axes
    covers points and the y axis's ticks, most of all with several runs. The figure grows by the
    legend's rows, in as many columns as the longest label lets fit across. `kwargs` go to the
    legend (markerscale for a scatter's small dots)."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if not handles:
        return
    width, height = fig.get_size_inches()
    column = 0.5 + max(len(label) for label in labels) * fontsize * 0.6 / 72  # the handle, then ~0.6 em a letter
    rows = math.ceil(len(labels) / max(1, min(len(labels), int((width - 0.3) // column))))
    ncols = math.ceil(len(labels) / rows)  # the rows balanced: 3 + 3, not 5 + 1
    extra = rows * fontsize * 1.7 / 72 + 0.06
    params = fig.subplotpars
    bottom, top = params.bottom * height, (1 - params.top) * height
    fig.set_size_inches(width, height + extra)
    fig.subplots_adjust(bottom=(bottom + extra) / (height + extra), top=1 - top / (height + extra))
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.01), ncols=ncols, frameon=False,
               fontsize=fontsize, **kwargs)  # fmt: skip


def robust_upper(values: Sequence[float], keep: Sequence[float] = ()) -> float | None:
    """An upper axis limit that leaves out the far outliers of `values` (all positive): sorted, the
    first jump of more than 3× between neighbours with at most a quarter of the points (one of
    fewer than eight) above it; the limit then covers the points below the jump and every value of
    `keep` (a constraint, the best and the default). None when no point is that far out, or with
    fewer than three points, too few to tell an outlier."""
    xs = sorted(v for v in values if v > 0 and math.isfinite(v))
    if len(xs) < 3:
        return None
    allowed = max(1, len(xs) // 4)
    for i in range(max(len(xs) - allowed, 1), len(xs)):
        if xs[i] > 3 * xs[i - 1]:
            limit = max([xs[i - 1], *(k for k in keep if k is not None and math.isfinite(k))]) * 1.12
            return limit if limit < xs[-1] else None
    return None


def clip_right(ax: Any, points: Sequence[tuple[float, float, str]], keep: Sequence[float]) -> None:
    """Set the x axis to `robust_upper`'s limit over `points` (x, y, colour), and draw each point
    beyond it at the right edge as a ▸ with its value, so the region that matters keeps its room
    and no point is lost."""
    limit = robust_upper([x for x, _, _ in points], keep)
    if limit is None:
        return
    ax.set_xlim(right=limit)
    for x, y, color in points:
        if x > limit:
            ax.scatter([limit], [y], marker=">", s=40, color=color, clip_on=False, zorder=4)
            ax.annotate(f"{x:.3g} ms →", (limit, y), textcoords="offset points", xytext=(-7, 0), ha="right",
                        va="center", fontsize=7, color=color)  # fmt: skip


def place_labels(
    ax: Any, labels: Sequence[tuple[str, float, float, str]], fontsize: float = 7, others: Sequence[Any] = ()
) -> None:
    """Label points (text, x, y, colour), each at the first of eight spots around its point that
    covers no drawn point or line (of `ax` and of `others`, a twin axes drawn over it), no label
    already placed, and stays inside the axes; the least crowded spot when none is free. Call it
    last: it reads the final layout."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    points = []
    for axes in (ax, *others):
        obstacles: list[tuple[float, float]] = []
        for line in axes.get_lines():
            path = line.get_xydata()
            for (x0, y0), (x1, y1) in zip(path[:-1], path[1:]):
                obstacles += [(x0 + (x1 - x0) * t / 12, y0 + (y1 - y0) * t / 12) for t in range(13)]
            if len(path) == 1:
                obstacles.append(tuple(path[0]))
        for collection in axes.collections:
            obstacles += [tuple(xy) for xy in collection.get_offsets()]
        points += [axes.transData.transform(xy) for xy in obstacles if all(map(math.isfinite, xy))]
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    spots = ((5, 4, "left", "bottom"), (5, -4, "left", "top"), (-5, 4, "right", "bottom"), (-5, -4, "right", "top"),
             (0, 9, "center", "bottom"), (0, -9, "center", "top"), (12, 12, "left", "bottom"),
             (-12, -12, "right", "top"))  # fmt: skip
    for text, x, y, color in labels:
        own = to_px((x, y))
        note = ax.annotate(
            text, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=fontsize, color=color, zorder=5
        )
        best: tuple[int, tuple[int, int, str, str]] | None = None
        for spot in spots:
            dx, dy, ha, va = spot
            note.set_position((dx, dy))
            note.set_ha(ha)
            note.set_va(va)
            box = note.get_window_extent(renderer).expanded(1.0, 1.0)
            hits = sum(box.x0 - 3 <= px <= box.x1 + 3 and box.y0 - 3 <= py <= box.y1 + 3
                       for px, py in points if abs(px - own[0]) + abs(py - own[1]) > 1)  # fmt: skip
            hits += 3 * sum(box.overlaps(other) for other in placed)
            hits += 5 * (box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1)
            if best is None or hits < best[0]:
                best = (hits, spot)
            if hits == 0:
                break
        assert best is not None
        dx, dy, ha, va = best[1]
        note.set_position((dx, dy))
        note.set_ha(ha)
        note.set_va(va)
        placed.append(note.get_window_extent(renderer))
