"""A sweep over its run's time, level by level: every measurement window's throughput and latency
(warm-up, drift, how the stability rule was met), the client's and server's utilisation and memory,
and the errors and late sends (drawn only when there are some: an empty chart says less than none).
Pure functions from a SweepResult to PNG bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfkit.analysis.metrics import ms, throughput_unit
from perfkit.report.figures import canvas
from perfkit.report.figures.canvas import PALETTE
from perfkit.report.tidy import TIDY_COLUMNS
from perfkit.results.model import SweepResult

__all__ = [
    "errors_and_late_sends", "has_errors_or_late_sends", "has_memory", "utilisation_title", "utilization_over_run",
    "windows_over_run",
]  # fmt: skip


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
    fig, ax = canvas.new_figure((12.8, 3.4), right=0.75, top=0.55)
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
    canvas.top_legend(fig, *fig.axes)
    right.set_ylim(bottom=0)
    right.spines["top"].set_visible(False)
    ax.set_xlabel("time since the first window (s)")
    ax.set_ylabel(f"throughput ({throughput_unit(run)})", color=PALETTE[0])
    ax.set_ylim(bottom=0)
    # Title on the left, legend on the right: both sit above the axes of a wide figure.
    ax.set_title("Measurement windows over the run (level shown on top)", fontsize=11, pad=14, loc="left")
    return canvas.png(fig)


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
    fig, ax = canvas.new_figure((12.8, 3.4), right=0.75, top=0.55)
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
        canvas.centred_note(ax, "no CPU or GPU figures were recorded")
    ax.set_xlabel("time since the first window (s)")
    ax.set_title(f"{utilisation_title(run)} (level shown on top)", fontsize=11, pad=14, loc="left")
    canvas.top_legend(fig, *fig.axes)
    return canvas.png(fig)


def has_errors_or_late_sends(run: SweepResult) -> bool:
    """Whether `errors_and_late_sends` has anything to draw: an empty chart is left out."""
    return any(lv.errors or lv.error_count or lv.delayed_pct > 0 for lv in run.levels)


def errors_and_late_sends(run: SweepResult) -> bytes:
    """Failed requests per level, stacked by kind, and the share of late sends (rate modes); drawn
    only when `has_errors_or_late_sends`."""
    scheduled = run.mode != "concurrency"
    fig, ax = canvas.new_figure(right=0.75 if scheduled else 0.2)
    levels = sorted(run.levels, key=lambda lv: lv.level)
    positions = list(range(len(levels)))
    kinds = sorted({kind for lv in levels for kind in lv.errors})
    bottoms = [0] * len(levels)
    for i, kind in enumerate(kinds):
        counts = [lv.errors.get(kind, 0) for lv in levels]
        ax.bar(positions, counts, bottom=bottoms, width=0.6, color=PALETTE[(i + 3) % 8], label=kind)
        bottoms = [b + c for b, c in zip(bottoms, counts)]
    ax.set_xticks(positions, [f"{lv.level:g}" for lv in levels])
    ax.set_xlabel(canvas.load_axis_label(run.mode))
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
        canvas.centred_note(ax, "no failed requests" + (" and no late sends" if scheduled else ""))
    ax.set_title("Errors" + (" and late sends" if scheduled else ""), fontsize=11)
    canvas.legend_below(fig, *fig.axes)
    return canvas.png(fig)
