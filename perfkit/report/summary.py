"""What the console shows at the end of `perfkit sweep` (also when `perfkit run` sweeps) and of
`perfkit probe`, as lines; the CLI prints them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfkit.analysis.stats import spread
from perfkit.errors import ExitCode
from perfkit.measure.probe import ServerProbe
from perfkit.report.export import render_composing_table, render_endpoint_table, render_summary_table
from perfkit.results.model import LevelResult, SweepResult, level_name


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


def exit_line(result: SweepResult | None, code: int) -> str | None:
    """The one line an exit 3 ends with: the levels, the check they failed (how far off) and the
    flag to change; None for any other exit."""
    if code != ExitCode.UNSTABLE or result is None:
        return None
    failed: dict[str, list[LevelResult]] = {}
    for lv in result.levels:
        for check in lv.checks:
            if not check.passed:
                failed.setdefault(check.name, []).append(lv)
    spec = result.provenance.get("spec") or {}
    windows = spec.get("windows") or {}
    # count windows (asked for, or a generative sweep's default) are lengthened by their request count
    generative = (spec.get("genai") or {}).get("endpoint_type", "kserve-infer") != "kserve-infer"
    counted = windows.get("mode") == "count_windows" or (generative and spec.get("auto_windows"))
    longer = "--measurement-request-count" if counted else "-p / --measurement-interval"
    parts = []
    for name, levels in sorted(failed.items(), key=lambda item: item[0] != "stable"):
        if name == "stable":
            parts.append(f"{_levels_text(levels)} never stabilised ({_instability(levels, windows)}): raise "
                         f"{longer} or --window-lengthenings, or accept more spread with -s / "
                         "--stability-percentage")  # fmt: skip
        else:
            check = next(c for c in levels[0].checks if c.name == name)
            parts.append(f"{_levels_text(levels)} failed the {name} check ({check.detail}): {check.advice}")
    return "; ".join(parts) or "a level never stabilised"


def _levels_text(levels: list[LevelResult]) -> str:
    """The levels with their kind named once: concurrency 1, 4 and 7; request rate 10/s and 20/s."""
    names = [level_name(lv.mode, lv.level) for lv in levels]
    kind = names[0].rpartition(" ")[0] if levels[0].mode != "custom_intervals" else ""
    if not kind or any(not n.startswith(kind + " ") for n in names):
        values = names
    else:
        values = [names[0], *(n[len(kind) + 1 :] for n in names[1:])]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} and {values[-1]}"


def _instability(levels: list[LevelResult], windows: dict[str, Any]) -> str:
    """How far apart the last windows of the unstable levels were at worst, against -s."""
    count = int(windows.get("stable_window_count") or 3)
    pct = float(windows.get("stability_pct") or 10.0)
    judged = [lv.windows[-count:] for lv in levels if len(lv.windows) >= count]
    if not judged:
        return f"fewer than {count} windows measured"
    if any(w.ok_count == 0 for last in judged for w in last):
        return f"a window of the last {count} completed no request"
    spreads = {
        "throughput": max(spread([w.throughput_infer_per_s for w in last]) for last in judged) - 1.0,
        "latency": max(spread([w.stabilizing_latency_us for w in last]) for last in judged) - 1.0,
    }
    varied = " and ".join(f"{what} varied {value * 100:.0f}%" for what, value in spreads.items() if value * 100 > pct)
    # Named as the windows were asked for: a time window ends a few ms late on a busy machine.
    lengths = {f"{(last[-1].end_ns - last[-1].start_ns) / 1e9:.2g}" for last in judged}
    length = f"{lengths.pop()} s" if len(lengths) == 1 else f"up to {max(lengths, key=float)} s"
    return f"{varied or 'windows varied'} > -s {pct:g}% over the last {count} windows of {length}"


def render_probe(result: ServerProbe) -> list[str]:
    lines = [
        f"server   {result.name} {result.version} at {result.url}",
        f"health   live={result.live} ready={result.ready}",
        f"features {', '.join(result.extensions) or '-'}",
        *(f"note     {note}" for note in result.notes),
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
