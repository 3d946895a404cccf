"""Throughput and latency curves: against load (throughput with its CI, latency percentiles with the
SLO), against each other (the throughput–p99 curve of one run or several, and the Pareto plot of a
tune's variants), and where the average request's time went at each level (the latency breakdown).
Pure functions from results to PNG bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfkit.analysis.metrics import metric, ms, throughput_unit
from perfkit.report.figures import canvas
from perfkit.report.figures.canvas import PALETTE, Run
from perfkit.results.model import LevelResult, SweepResult

__all__ = [
    "BREAKDOWN", "Point", "latency_breakdown", "latency_vs_load", "pareto", "pareto_front", "throughput_vs_load",
    "throughput_vs_p99",
]  # fmt: skip


def _runs_unit(runs: Sequence[Run]) -> str:
    return throughput_unit(*(run for _, run in runs))


def _measured(levels: Sequence[LevelResult]) -> list[LevelResult]:
    return [lv for lv in levels if lv.latency.count > 0]


def throughput_vs_load(runs: Sequence[Run]) -> bytes:
    """Throughput against concurrency or offered rate, with the 95 % CI of each level; in rate
    modes the offered load is drawn as the line a keeping-up server would follow."""
    fig, ax = canvas.new_figure()
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
    canvas.set_load_axis(ax, all_levels, runs[0][1].mode if runs else "concurrency")
    ax.set_ylabel(f"throughput ({_runs_unit(runs)})")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs load", fontsize=11)
    canvas.legend_below(fig, ax)
    return canvas.png(fig)


def latency_vs_load(runs: Sequence[Run], slo_ms: float | None = None) -> bytes:
    """Latency percentiles against load. One run: p50 to p99.9, the p99 95 % CI as a band and, in
    rate modes, p99 from the intended send time. Several runs: p50 (dotted) and p99 of each."""
    fig, ax = canvas.new_figure()
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
    canvas.set_load_axis(ax, all_levels, runs[0][1].mode if runs else "concurrency")
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency percentiles vs load", fontsize=11)
    canvas.legend_below(fig, ax)
    return canvas.png(fig)


def throughput_vs_p99(runs: Sequence[Run], slo_ms: float | None = None) -> bytes:
    """The throughput–latency curve: each level is a point (p99, throughput), joined in load order
    and labelled with its level."""
    fig, ax = canvas.new_figure()
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
    canvas.place_labels(ax, [label for label in labels if label[1] <= ax.get_xlim()[1]])
    return canvas.png(fig)


def _throughput_p99_axes(
    ax: Any,
    title: str,
    bound_ms: float | None,
    points: Sequence[tuple[float, float, str]],
    keep: Sequence[float] = (),
    unit: str = "infer/s",
) -> None:
    """Labels, limits (robust to a far outlier: `canvas.clip_right`), the latency bound and the legend of
    a throughput (y) against p99 (x) figure."""
    if bound_ms:
        ax.axvline(bound_ms, color=PALETTE[3], linestyle="-.", linewidth=1, label=f"p99 ≤ {bound_ms:g} ms")
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    canvas.clip_right(ax, points, [*keep, *([bound_ms] if bound_ms else [])])
    ax.set_title(title, fontsize=11)
    canvas.legend_below(ax.figure, ax)


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
    fig, ax = canvas.new_figure((6.4, 4.3), right=0.75, bottom=1.15)
    levels = sorted(run.levels, key=lambda lv: lv.level)
    positions = list(range(len(levels)))
    bottoms = [0.0] * len(levels)
    for i, (name, get) in enumerate(BREAKDOWN):
        heights = [ms(get(lv)) for lv in levels]
        ax.bar(positions, heights, bottom=bottoms, width=0.6, color=PALETTE[i], label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(positions, [f"{lv.level:g}" for lv in levels])
    ax.set_xlabel(canvas.load_axis_label(run.mode))
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
    return canvas.png(fig)


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
    fig, ax = canvas.new_figure()
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
    canvas.place_labels(ax, [(p.label, p.p99_ms, p.throughput, "#222222") for p in marked])
    return canvas.png(fig)
