"""The report's figures: pure functions from results to PNG bytes.

matplotlib's object API on the Agg canvas (no pyplot, so no global state and no display needed).
Colours are Okabe & Ito's colour-blind-safe palette, as model_analyzer's detailed report uses.
Each function draws one figure and returns its PNG; `report.py` inlines them as data URIs.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from perfkit.analysis.metrics import metric, ms, throughput_unit
from perfkit.report.tidy import TIDY_COLUMNS
from perfkit.results.model import LevelResult, SweepResult

__all__ = [
    "PALETTE",
    "Point",
    "errors_and_late_sends",
    "has_errors_or_late_sends",
    "has_memory",
    "latency_breakdown",
    "latency_vs_load",
    "pareto",
    "throughput_unit",
    "throughput_vs_load",
    "throughput_vs_p99",
    "utilisation_title",
    "utilization_over_run",
    "windows_over_run",
]

# Okabe & Ito (2008), "Color Universal Design".
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
_GRID = "#d9d9d9"
_SIZE = (6.4, 3.7)
_DPI = 110

Run = tuple[str, SweepResult]  # (label, result)


def _figure(
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


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI, facecolor="white")
    return buffer.getvalue()


def _runs_unit(runs: Sequence[Run]) -> str:
    return throughput_unit(*(run for _, run in runs))


def _load_axis_label(mode: str) -> str:
    return {"concurrency": "concurrency (requests in flight)", "request_rate": "offered rate (requests/s)"}.get(
        mode, "offered rate (requests/s)"
    )


def _set_load_axis(ax: Any, levels: Sequence[float], mode: str) -> None:
    ax.set_xlabel(_load_axis_label(mode))
    positive = [v for v in levels if v > 0]
    if positive and max(positive) / min(positive) >= 16:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    elif mode == "concurrency":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _note(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555", fontsize=10)


def _top_legend(fig: Figure, *axes: Any) -> None:
    """One legend for all axes, in the figure's top right corner, clear of the data."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        fig.legend(handles, labels, loc="upper right", ncols=len(handles), frameon=False, fontsize=8)


def _legend_below(fig: Figure, *axes: Any, fontsize: float = 8, **kwargs: Any) -> None:
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


def _clip_right(ax: Any, points: Sequence[tuple[float, float, str]], keep: Sequence[float]) -> None:
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


def _place_labels(
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


def _measured(levels: Sequence[LevelResult]) -> list[LevelResult]:
    return [lv for lv in levels if lv.latency.count > 0]


def throughput_vs_load(runs: Sequence[Run]) -> bytes:
    """Throughput against concurrency or offered rate, with the 95 % CI of each level; in rate
    modes the offered load is drawn as the line a keeping-up server would follow."""
    fig, ax = _figure()
    all_levels: list[float] = []
    for i, (label, run) in enumerate(runs):
        levels = sorted(run.levels, key=lambda lv: lv.level)
        xs = [lv.level for lv in levels]
        ys = [lv.throughput_infer_per_s for lv in levels]
        low = [max(y - lv.throughput_ci_low, 0.0) for y, lv in zip(ys, levels)]
        high = [max(lv.throughput_ci_high - y, 0.0) for y, lv in zip(ys, levels)]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", markersize=4, capsize=3, color=PALETTE[i % 8],
                    label=label if len(runs) > 1 else "measured")  # fmt: skip
        all_levels += xs
        if run.mode != "concurrency" and i == 0 and levels:
            batch = levels[0].batch_size
            ax.plot(xs, [x * batch for x in xs], linestyle="--", color="#888888", linewidth=1, label="offered")
    _set_load_axis(ax, all_levels, runs[0][1].mode if runs else "concurrency")
    ax.set_ylabel(f"throughput ({_runs_unit(runs)})")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs load", fontsize=11)
    _legend_below(fig, ax)
    return _png(fig)


def latency_vs_load(runs: Sequence[Run], slo_ms: float | None = None) -> bytes:
    """Latency percentiles against load. One run: p50 to p99.9, the p99 95 % CI as a band and, in
    rate modes, p99 from the intended send time. Several runs: p50 (dotted) and p99 of each."""
    fig, ax = _figure()
    all_levels: list[float] = []
    for i, (label, run) in enumerate(runs):
        levels = sorted(_measured(run.levels), key=lambda lv: lv.level)
        xs = [lv.level for lv in levels]
        all_levels += xs
        if len(runs) == 1:
            for j, (name, key) in enumerate((("p50", "p50_ms"), ("p90", "p90_ms"), ("p95", "p95_ms"),
                                             ("p99", "p99_ms"), ("p99.9", "p999_ms"))):  # fmt: skip
                ax.plot(xs, [metric(key).value(lv) for lv in levels], marker="o", markersize=3,
                        color=PALETTE[j], label=name)  # fmt: skip
            ax.fill_between(xs, [ms(lv.latency.p99_ci_low_us) for lv in levels],
                            [ms(lv.latency.p99_ci_high_us) for lv in levels], color=PALETTE[3], alpha=0.15,
                            linewidth=0, label="p99 95% CI")  # fmt: skip
            if run.mode != "concurrency":
                ax.plot(xs, [ms(lv.latency_from_intended.p99_us) for lv in levels], linestyle="--",
                        color=PALETTE[7], label="p99 from intended send")  # fmt: skip
        else:
            color = PALETTE[i % 8]
            ax.plot(xs, [ms(lv.latency.p99_us) for lv in levels], marker="o", markersize=3, color=color,
                    label=f"{label} p99")  # fmt: skip
            ax.plot(xs, [ms(lv.latency.p50_us) for lv in levels], linestyle=":", color=color, label=f"{label} p50")
    if slo_ms:
        ax.axhline(slo_ms, color=PALETTE[3], linestyle="-.", linewidth=1, label=f"p99 ≤ {slo_ms:g} ms")
    _set_load_axis(ax, all_levels, runs[0][1].mode if runs else "concurrency")
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency percentiles vs load", fontsize=11)
    _legend_below(fig, ax)
    return _png(fig)


def throughput_vs_p99(runs: Sequence[Run], slo_ms: float | None = None) -> bytes:
    """The throughput–latency curve: each level is a point (p99, throughput), joined in load order
    and labelled with its level."""
    fig, ax = _figure()
    points: list[tuple[float, float, str]] = []
    labels: list[tuple[str, float, float, str]] = []
    for i, (label, run) in enumerate(runs):
        levels = sorted(_measured(run.levels), key=lambda lv: lv.level)
        xs = [ms(lv.latency.p99_us) for lv in levels]
        ys = [lv.throughput_infer_per_s for lv in levels]
        ax.plot(xs, ys, marker="o", markersize=4, color=PALETTE[i % 8], label=label if len(runs) > 1 else None)
        points += [(x, y, PALETTE[i % 8]) for x, y in zip(xs, ys)]
        if len(runs) <= 2:
            labels += [(f"{lv.level:g}", x, y, PALETTE[i % 8]) for x, y, lv in zip(xs, ys, levels)]
    _throughput_p99_axes(ax, "Throughput vs p99 latency", slo_ms, points, unit=_runs_unit(runs))
    _place_labels(ax, [label for label in labels if label[1] <= ax.get_xlim()[1]])
    return _png(fig)


def _throughput_p99_axes(
    ax: Any,
    title: str,
    bound_ms: float | None,
    points: Sequence[tuple[float, float, str]],
    keep: Sequence[float] = (),
    unit: str = "infer/s",
) -> None:
    """Labels, limits (robust to a far outlier: `_clip_right`), the latency bound and the legend of
    a throughput (y) against p99 (x) figure."""
    if bound_ms:
        ax.axvline(bound_ms, color=PALETTE[3], linestyle="-.", linewidth=1, label=f"p99 ≤ {bound_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    _clip_right(ax, points, [*keep, *([bound_ms] if bound_ms else [])])
    ax.set_title(title, fontsize=11)
    _legend_below(ax.figure, ax)


#: perf_analyzer's latency decomposition (report_writer.cc), client side first.
BREAKDOWN: tuple[tuple[str, Callable[[LevelResult], float]], ...] = (
    ("client send", lambda lv: lv.client_send_us),
    ("network + server send/recv", lambda lv: lv.network_server_us),
    ("server queue", lambda lv: lv.server.queue_us if lv.server else 0.0),
    ("compute input", lambda lv: lv.server.compute_input_us if lv.server else 0.0),
    ("compute infer", lambda lv: lv.server.compute_infer_us if lv.server else 0.0),
    ("compute output", lambda lv: lv.server.compute_output_us if lv.server else 0.0),
    ("client recv", lambda lv: lv.client_recv_us),
)


def latency_breakdown(run: SweepResult) -> bytes:
    """Where the average request's time went at each level, as stacked bars (model_analyzer's
    latency_breakdown.png, with perf_analyzer's client-side terms added), throughput on the right."""
    fig, ax = _figure((6.4, 4.3), right=0.75, bottom=1.15)
    levels = sorted(run.levels, key=lambda lv: lv.level)
    positions = list(range(len(levels)))
    bottoms = [0.0] * len(levels)
    for i, (name, get) in enumerate(BREAKDOWN):
        heights = [ms(get(lv)) for lv in levels]
        ax.bar(positions, heights, bottom=bottoms, width=0.6, color=PALETTE[i], label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(positions, [f"{lv.level:g}" for lv in levels])
    ax.set_xlabel(_load_axis_label(run.mode))
    ax.set_ylabel("average latency (ms)")
    if not any(lv.server for lv in levels):
        ax.set_title("Latency breakdown (no server statistics)", fontsize=11)
    else:
        ax.set_title("Latency breakdown", fontsize=11)
    right = ax.twinx()
    right.plot(positions, [lv.throughput_infer_per_s for lv in levels], color="#000000", marker="D", markersize=4,
               linewidth=1.2, label="throughput")  # fmt: skip
    right.set_ylabel(f"throughput ({throughput_unit(run)})")
    right.set_ylim(bottom=0)
    right.spines["top"].set_visible(False)
    handles, labels = ax.get_legend_handles_labels()
    h2, l2 = right.get_legend_handles_labels()
    fig.legend(handles + h2, labels + l2, frameon=False, fontsize=7, loc="lower center", ncols=4)
    return _png(fig)


def _origin_ns(run: SweepResult) -> int:
    starts = [w.start_ns for lv in run.levels for w in lv.windows]
    return min(starts) if starts else 0


def _level_spans(ax: Any, run: SweepResult, origin: int) -> None:
    """Shade every other level's time span and label it at the top."""
    for i, lv in enumerate(run.levels):
        if not lv.windows:
            continue
        start = (lv.windows[0].start_ns - origin) / 1e9
        end = (lv.windows[-1].end_ns - origin) / 1e9
        if i % 2 == 0:
            ax.axvspan(start, end, color="#f0f0f0", zorder=0)
        ax.text((start + end) / 2, 1.0, f"{lv.level:g}", transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=7, color="#555555")  # fmt: skip


def windows_over_run(run: SweepResult) -> bytes:
    """Every measurement window's throughput over the run's time, level by level: shows warm-up,
    drift and how the stability rule was met (the reported windows are the last of each level)."""
    fig, ax = _figure((12.8, 3.4), right=0.75, top=0.55)
    origin = _origin_ns(run)
    _level_spans(ax, run, origin)
    for lv in run.levels:
        xs = [((w.start_ns + w.end_ns) / 2 - origin) / 1e9 for w in lv.windows]
        ys = [w.throughput_infer_per_s for w in lv.windows]
        ax.plot(xs, ys, marker="o", markersize=3, color=PALETTE[0], linewidth=1)
    right = ax.twinx()
    for lv in run.levels:
        xs = [((w.start_ns + w.end_ns) / 2 - origin) / 1e9 for w in lv.windows]
        right.plot(xs, [ms(w.stabilizing_latency_us) for w in lv.windows], marker="s", markersize=3,
                   color=PALETTE[1], linewidth=1)  # fmt: skip
    right.set_ylabel("window latency (ms)", color=PALETTE[1])
    ax.plot([], [], marker="o", markersize=3, color=PALETTE[0], label="throughput")
    ax.plot([], [], marker="s", markersize=3, color=PALETTE[1], label="latency (stabilising: mean or --percentile)")
    _top_legend(fig, *fig.axes)
    right.set_ylim(bottom=0)
    right.spines["top"].set_visible(False)
    ax.set_xlabel("time since the first window (s)")
    ax.set_ylabel(f"throughput ({throughput_unit(run)})", color=PALETTE[0])
    ax.set_ylim(bottom=0)
    # Title on the left, legend on the right: both sit above the axes of a wide figure.
    ax.set_title("Measurement windows over the run (level shown on top)", fontsize=11, pad=14, loc="left")
    return _png(fig)


#: What the utilisation figure draws, by the tidy CSV's column names (tidy.TIDY_COLUMNS).
_UTILISATION = (
    ("client CPU (% of one core)", "client_cpu_pct", PALETTE[0]),
    ("server CPU (% of machine)", "server_cpu_pct", PALETTE[2]),
    ("GPU utilisation (%)", "gpu_utilization_pct", PALETTE[3]),
)


def _steps(ax: Any, spans: Sequence[tuple[float, float]], values: Sequence[Any], label: str, **style: Any) -> bool:
    """One horizontal segment per level that has a value; whether any was drawn."""
    drawn = False
    for (start, end), value in zip(spans, values):
        if value is not None:
            ax.hlines(value, start, end, linewidth=2.2, label=None if drawn else label, **style)
            drawn = True
    return drawn


def has_memory(run: SweepResult) -> bool:
    """Whether any level recorded GPU memory (the only memory a result holds)."""
    return any(lv.resources.gpu_memory_used_bytes for lv in run.levels)


def utilisation_title(run: SweepResult) -> str:
    """The utilisation figure's title: it names memory only when there is memory to draw."""
    return "Utilisation and GPU memory over the run" if has_memory(run) else "Utilisation over the run"


def utilization_over_run(run: SweepResult) -> bytes:
    """Client and server CPU, GPU utilisation and GPU memory over the run: one step per level, drawn
    over the level's reported windows, which its figures cover."""
    columns = {c.name: c for c in TIDY_COLUMNS}
    fig, ax = _figure((12.8, 3.4), right=0.75, top=0.55)
    origin = _origin_ns(run)
    _level_spans(ax, run, origin)
    levels = [lv for lv in run.levels if lv.windows]
    # The figures cover a level's reported windows: the last duration_s seconds of it.
    ends = [(lv.windows[-1].end_ns - origin) / 1e9 for lv in levels]
    spans = [(end - lv.duration_s, end) for lv, end in zip(levels, ends)]
    drawn = False
    for label, name, color in _UTILISATION:
        drawn |= _steps(ax, spans, [columns[name].getter(run, lv) for lv in levels], label, color=color)
    ax.set_ylabel("utilisation (%)")
    ax.set_ylim(bottom=0)
    memory = [columns["gpu_memory_used_max_bytes"].getter(run, lv) for lv in levels]
    if any(m is not None for m in memory):
        right = ax.twinx()
        gib = [None if m is None else float(m) / 2**30 for m in memory]
        _steps(right, spans, gib, "GPU memory used (GiB, max)", color=PALETTE[4], linestyle="--")
        right.set_ylabel("GPU memory (GiB)")
        right.set_ylim(bottom=0)
        right.spines["top"].set_visible(False)
    if not drawn:
        _note(ax, "no CPU or GPU figures were recorded")
    ax.set_xlabel("time since the first window (s)")
    ax.set_title(f"{utilisation_title(run)} (level shown on top)", fontsize=11, pad=14, loc="left")
    _top_legend(fig, *fig.axes)
    return _png(fig)


def has_errors_or_late_sends(run: SweepResult) -> bool:
    """Whether `errors_and_late_sends` has anything to draw: an empty chart is left out."""
    return any(lv.errors or lv.error_count or lv.delayed_pct > 0 for lv in run.levels)


def errors_and_late_sends(run: SweepResult) -> bytes:
    """Failed requests per level, stacked by kind, and the share of late sends (rate modes); drawn
    only when `has_errors_or_late_sends`."""
    scheduled = run.mode != "concurrency"
    fig, ax = _figure(right=0.75 if scheduled else 0.2)
    levels = sorted(run.levels, key=lambda lv: lv.level)
    positions = list(range(len(levels)))
    kinds = sorted({kind for lv in levels for kind in lv.errors})
    bottoms = [0] * len(levels)
    for i, kind in enumerate(kinds):
        counts = [lv.errors.get(kind, 0) for lv in levels]
        ax.bar(positions, counts, bottom=bottoms, width=0.6, color=PALETTE[(i + 3) % 8], label=kind)
        bottoms = [b + c for b, c in zip(bottoms, counts)]
    ax.set_xticks(positions, [f"{lv.level:g}" for lv in levels])
    ax.set_xlabel(_load_axis_label(run.mode))
    ax.set_ylabel("failed requests")
    ax.set_ylim(bottom=0, top=max([*bottoms, 1]) * 1.15)
    if scheduled:
        right = ax.twinx()
        right.plot(positions, [lv.delayed_pct for lv in levels], color="#000000", marker="o", markersize=4,
                   label="late sends (%)")  # fmt: skip
        right.set_ylabel("sends > 1 ms late (%)")
        right.set_ylim(bottom=0, top=max([lv.delayed_pct for lv in levels] + [1.0]) * 1.15)
        right.spines["top"].set_visible(False)
    if not kinds and not (scheduled and any(lv.delayed_pct for lv in levels)):
        _note(ax, "no failed requests" + (" and no late sends" if scheduled else ""))
    ax.set_title("Errors" + (" and late sends" if scheduled else ""), fontsize=11)
    _legend_below(fig, *fig.axes)
    return _png(fig)


@dataclass(frozen=True, slots=True)
class Point:
    """One configuration in a throughput–latency plane."""

    label: str
    p99_ms: float
    throughput: float
    default: bool = False
    best: bool = False


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by p99."""
    front: list[Point] = []
    for p in sorted(points, key=lambda p: (p.p99_ms, -p.throughput)):
        if not front or p.throughput > front[-1].throughput:
            front.append(p)
    return front


def pareto(points: Sequence[Point], constraint_ms: float | None = None) -> bytes:
    """Every variant of a tune as a point (p99, throughput), the Pareto front joined, the default
    and the best marked, and the latency constraint drawn with the region beyond it shaded."""
    fig, ax = _figure()
    ax.scatter([p.p99_ms for p in points], [p.throughput for p in points], s=18, color=PALETTE[5], label="variant")
    front = pareto_front(points)
    ax.plot([p.p99_ms for p in front], [p.throughput for p in front], color=PALETTE[0], linewidth=1.2,
            label="Pareto front")  # fmt: skip
    for p in points:
        if p.default:
            ax.scatter([p.p99_ms], [p.throughput], s=60, marker="s", color=PALETTE[1], label="default", zorder=3)
        if p.best:
            ax.scatter([p.p99_ms], [p.throughput], s=120, marker="*", color=PALETTE[3], label="best", zorder=3)
    marked = [p for p in points if p.default or p.best]
    _throughput_p99_axes(ax, "Throughput vs p99 of every variant", constraint_ms,
                         [(p.p99_ms, p.throughput, PALETTE[5]) for p in points], [p.p99_ms for p in marked])  # fmt: skip
    if constraint_ms:  # shade what breaks the constraint, to the axis's end
        ax.axvspan(constraint_ms, max(ax.get_xlim()[1], constraint_ms), color=PALETTE[3], alpha=0.06, zorder=0)
    _place_labels(ax, [(p.label, p.p99_ms, p.throughput, "#222222") for p in marked])
    return _png(fig)
