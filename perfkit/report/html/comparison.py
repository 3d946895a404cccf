"""The comparison that opens a report of several sweeps: the runs side by side, their curves overlaid
(when they ran the same load mode), and, for two sweeps of the same levels, `perfkit compare`'s
table of deltas with its warnings (runs set up differently, levels not valid).
"""

from __future__ import annotations

from collections.abc import Sequence

from perfkit.analysis.compare import Thresholds, compare_sweeps
from perfkit.analysis.metrics import throughput_unit
from perfkit.errors import PerfkitError
from perfkit.report import figures
from perfkit.report.compare_text import comparison_rows
from perfkit.report.html.cells import Badge, esc, fmt, img, render_table
from perfkit.results.files import ReportItem
from perfkit.results.model import SweepResult

__all__ = ["render_comparison_section"]


def _warnings(warnings: Sequence[str]) -> str:
    """The comparison's warnings (runs set up differently, levels not valid), above its table."""
    if not warnings:
        return ""
    items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    return f'<div class="verdict warn"><div class="title">Read with care</div><ul>{items}</ul></div>'


def render_comparison_section(items: Sequence[ReportItem], thresholds: Thresholds, slo_ms: float | None) -> str:
    sweeps = [(it.label, it.result) for it in items if isinstance(it.result, SweepResult)]
    parts = ['<section id="comparison"><h2>Comparison</h2>']
    runs_rows = [
        [label, r.model, r.mode.replace("_", " "), str(r.provenance.get("started_at", "?")),
         str(r.provenance.get("git_commit", ""))[:10] or "-", str((r.provenance.get("machine") or {}).get("hostname", "?")),
         fmt(max((lv.throughput_infer_per_s for lv in r.levels), default=0.0), 1),
         Badge(f"{sum(lv.valid for lv in r.levels)}/{len(r.levels)}", all(lv.valid for lv in r.levels))]
        for label, r in sweeps
    ]  # fmt: skip
    peak = f"peak {throughput_unit(*(r for _, r in sweeps))}"
    parts.append(render_table(["run", "model", "mode", "started", "commit", "machine", peak, "valid levels"], runs_rows))
    if len({r.mode for _, r in sweeps}) == 1:
        parts.append(
            '<div class="grid">'
            + img(figures.throughput_vs_load(sweeps), "throughput vs load, all runs")
            + img(figures.latency_vs_load(sweeps, slo_ms), "latency vs load, all runs")
            + img(figures.throughput_vs_p99(sweeps, slo_ms), "throughput vs p99, all runs")
            + "</div>"
        )
    if len(sweeps) == 2:
        (base_label, base), (cand_label, cand) = sweeps
        assert isinstance(base, SweepResult) and isinstance(cand, SweepResult)
        try:
            comparison = compare_sweeps(base, cand, thresholds, names=(base_label, cand_label))
        except PerfkitError as exc:
            parts.append(f'<p class="note">Not compared level by level: {esc(exc)}</p>')
        else:
            header, rows = comparison_rows(comparison)
            # Every gate metric is compared; the ones neither run measured (token figures of a
            # tensor model...) would be most of the table: counted, not listed.
            shown = [
                (r, d) for r, d in zip(rows, comparison.deltas) if d.baseline is not None or d.candidate is not None
            ]
            badge_rows = [[*r[:-1], Badge(r[-1], not d.regression)] for r, d in shown]
            unmeasured = sorted({d.metric for d in comparison.deltas} - {d.metric for _, d in shown})
            regressions = len(comparison.regressions)
            parts.append(
                f"<h3>{esc(cand_label)} against {esc(base_label)}</h3>"
                f'<div class="verdict {"bad" if regressions else "ok"}"><div class="title">'
                + esc(f"{regressions} regression(s)" if regressions else "no regression")
                + esc(
                    f" (limits: throughput -{thresholds.max_throughput_drop_pct:g}%, latency "
                    f"+{thresholds.max_latency_increase_pct:g}%, and beyond the runs' noise)"
                )  # fmt: skip
                + "</div></div>"
                + _warnings(comparison.warnings)
                + f'<div class="scroll">{render_table(header, badge_rows, "compared")}</div>'
                + (
                    f'<p class="note">{esc("Measured by neither run, so not shown: " + ", ".join(unmeasured))}.</p>'
                    if unmeasured
                    else ""
                )
                + "".join(f'<p class="note">{esc(n)}</p>' for n in comparison.notes)
            )
    parts.append("</section>")
    return "".join(parts)
