"""The report's figures: pure functions from results to PNG bytes, which the HTML report inlines.

`canvas.py` is what every figure is drawn with (the figure, its PNG, the palette, legends, label
placement); `curves.py` draws throughput and latency against load and against each other (a sweep,
several runs, a tune's variants); `timeline.py` a sweep over its run's time (windows, utilisation,
errors); `generative.py` a generative run's token figures (TTFT, ITL, tokens/s, goodput).
"""

from __future__ import annotations

from perfkit.report.figures.canvas import PALETTE, robust_upper
from perfkit.report.figures.curves import (
    BREAKDOWN,
    Point,
    latency_breakdown,
    latency_vs_load,
    pareto,
    pareto_front,
    throughput_vs_load,
    throughput_vs_p99,
)
from perfkit.report.figures.timeline import (
    errors_and_late_sends,
    has_errors_or_late_sends,
    has_memory,
    utilisation_title,
    utilization_over_run,
    windows_over_run,
)

__all__ = [
    "BREAKDOWN", "PALETTE", "Point", "errors_and_late_sends", "has_errors_or_late_sends", "has_memory",
    "latency_breakdown", "latency_vs_load", "pareto", "pareto_front", "robust_upper", "throughput_vs_load",
    "throughput_vs_p99", "utilisation_title", "utilization_over_run", "windows_over_run",
]  # fmt: skip
