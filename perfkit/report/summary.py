"""What the console shows at the end of `perfkit sweep` (also when `perfkit run` sweeps) and of
`perfkit probe`, as lines; the CLI prints them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from perfkit.errors import ExitCode
from perfkit.measure.probe import ServerProbe
from perfkit.report.export import render_composing_table, render_endpoint_table, render_summary_table
from perfkit.results.model import SweepResult


def sweep_table(result: SweepResult | None) -> list[str]:
    """The summary table of the levels measured, or nothing when none was; then, where there are,
    each endpoint's share (`-u A,B`) and the composing models' server-side breakdown."""
    if result is None or not result.levels:
        return []
    lines = render_summary_table(result.levels)
    for extra in (render_endpoint_table(result.levels), render_composing_table(result.levels)):
        lines += ["", *extra] if extra else []
    return lines


def sweep_notes(result: SweepResult | None, written: Sequence[Path], code: int) -> list[str]:
    """The files written, then why the sweep stopped early when it did; an interrupt (Ctrl-C) is
    left to the caller, which knows what was kept."""
    notes = [f"wrote {path}" for path in written]
    if result is not None and not result.completed and code != ExitCode.INTERRUPTED:
        notes.append(f"error: the sweep stopped early: {result.stop_reason}")
    return notes


def render_probe(result: ServerProbe) -> list[str]:
    lines = [
        f"server   {result.name} {result.version} at {result.url}",
        f"health   live={result.live} ready={result.ready}",
        f"features {', '.join(result.extensions) or '-'}",
        "",
        f"{'model':<16} {'versions':>8} {'inputs':<30} {'ok':>7} {'p50 ms':>8} {'max ms':>8}",
    ]
    for m in result.models:
        ins = " ".join(f"{k}{v}" for k, v in m.input_shapes.items())
        ok = f"{m.requests - m.errors}/{m.requests}"
        lines.append(f"{m.model:<16} {m.versions:>8} {ins:<30} {ok:>7} {m.p50_ms:>8.3f} {m.max_ms:>8.3f}")
        if m.error:
            lines.append(f"  error: {m.error}")
    return lines
