"""`perfkit compare`'s verdicts as text: the table the console and the HTML report show, and its
summary line. Pure: the CLI decides where the lines go (STYLE practice 15)."""

from __future__ import annotations

import math

from perfkit.analysis.compare import Comparison

__all__ = ["comparison_rows", "format_change", "format_value", "render_comparison_lines"]


def format_value(value: float | None) -> str:
    """A compared figure: three significant digits, one decimal from 100 up; '-' when not measured."""
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"


def format_change(change: float | None) -> str:
    """A signed change in percent; an infinite one (from a zero baseline) as ±inf%."""
    if change is None:
        return "-"
    return f"{change:+.1f}%" if math.isfinite(change) else ("+inf%" if change > 0 else "-inf%")


def comparison_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The comparison as a header and rows of text, for the console and the HTML report."""
    header = ["level", "metric", "baseline", "candidate", "change", "limit", "noise", "verdict"]
    rows = []
    for d in comparison.deltas:
        sign = "-" if d.better == "higher" else "+"
        rows.append([
            d.level, f"{d.metric} {d.unit}", format_value(d.baseline), format_value(d.candidate),
            format_change(d.change_pct), f"{sign}{d.limit_pct:g}%", d.noise.detail or d.noise.method,
            d.verdict.upper() if d.regression else d.verdict,
        ])  # fmt: skip
    return header, rows


def render_comparison_lines(comparison: Comparison) -> list[str]:
    """The table, the notes, the warnings (runs set up differently, levels not valid) just above
    the verdict where a CI log's reader looks, and a last line with the verdict."""
    header, rows = comparison_rows(comparison)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
    lines += [f"note: {note}" for note in comparison.notes]
    lines += [f"WARNING: {warning}" for warning in comparison.warnings]
    regressions = comparison.regressions
    only = " (thresholds only: no per-window samples, no significance test)" if comparison.thresholds_only else ""
    if regressions:
        beyond = "" if comparison.thresholds_only else " and beyond the runs' noise"
        lines.append(
            f"REGRESSION: {len(regressions)} of {len(comparison.deltas)} comparisons are worse than their limit"
            f"{beyond}{only}"
        )
    else:
        noisy = sum(1 for d in comparison.deltas if d.verdict == "within noise")
        tail = f" ({noisy} worse than the limit but within the runs' noise)" if noisy else ""
        lines.append(f"no regression in {len(comparison.deltas)} comparisons{tail}{only}")
    return lines
