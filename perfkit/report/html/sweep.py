"""A sweep's section of the HTML report: the validity verdict first (STYLE practice 10), the key
figures (the peak throughput among the valid levels), the per-level table (a view of the tidy
CSV's columns, practice 16), a generative run's Tokens table and figures, the sweep's figures,
each load worker's share (`--workers N`), the endpoints and composing models, the checks, and the
run's provenance.

A generative run counts requests (req/s), an inference run inferences (infer/s):
`metrics.throughput_unit`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from perfkit.analysis.compare import level_label
from perfkit.analysis.metrics import ms, throughput_unit
from perfkit.analysis.stats import (
    GENERATIVE_PERCENTILE,
    GENERATIVE_REQUESTS_PER_SLOT,
    GENERATIVE_WINDOW_REQUESTS,
    GENERATIVE_WINDOW_S,
)
from perfkit.genai.records import unstreamed_note
from perfkit.report import figures
from perfkit.report.export import composing_rows, endpoint_rows
from perfkit.report.figures import generative
from perfkit.report.html.cells import Badge, WithRange, anchor, esc, fmt, img, number, render_table
from perfkit.report.tidy import TIDY_COLUMNS
from perfkit.results.files import ReportItem, slo_from_sweep
from perfkit.results.model import LevelResult, SweepResult

__all__ = ["render_sweep_section"]


def _verdict(result: SweepResult) -> str:
    invalid = [lv for lv in result.levels if not lv.valid]
    problems: list[str] = []
    if not result.completed:
        problems.append(f"<li>The sweep stopped early: {esc(result.stop_reason)}</li>")
    for lv in invalid:
        for check in lv.checks:
            if not check.passed:
                advice = f' <span class="advice">→ {esc(check.advice)}</span>' if check.advice else ""
                problems.append(f"<li><b>{esc(level_label(lv))}</b>: {esc(check.name)}: {esc(check.detail)}{advice}</li>")
    if not result.levels:
        problems.append("<li>No level was measured.</li>")
    n = len(result.levels)
    if problems:
        head = f"NOT VALID: {len(invalid)} of {n} levels failed a check" + ("" if result.completed else "; incomplete")
        return f'<div class="verdict bad"><div class="title">{esc(head)}</div><ul>{"".join(problems)}</ul></div>'
    return (
        f'<div class="verdict ok"><div class="title">VALID: all {n} levels passed every check</div>'
        f"<div>stable windows, enough samples for {_judged(result)}, no failed requests, the schedule kept, "
        "the client not saturated.</div></div>"
    )


def _peak_card(result: SweepResult) -> tuple[str, str, str]:
    """The peak throughput among the valid levels (stable, error-free, every check passed): a level
    that failed a check is no peak to quote. With none valid, the card says so and names the best
    invalid level as such, with the checks it failed. A generative run's peak is in requests/s, with
    the level's output tokens/s beside it (the figure AIPerf's users quote)."""
    levels = result.levels
    valid = [lv for lv in levels if lv.valid and lv.stable and not lv.error_count]
    best = max(valid or levels, key=lambda lv: lv.throughput_infer_per_s)
    figure = f"{best.throughput_infer_per_s:,.1f} {throughput_unit(result)}"
    if valid:
        higher = any(lv.throughput_infer_per_s > best.throughput_infer_per_s for lv in levels)
        tokens = f"{best.tokens.output_tokens_per_s:,.1f} output tokens/s " if best.tokens is not None else ""
        where = f"{tokens}at {level_label(best)}" + (", the best valid level" if higher else "")
        return "peak throughput", figure, where
    failed = [c.name for c in best.checks if not c.passed] or (["stable"] if not best.stable else ["errors"])
    return "peak throughput", "no valid level", f"best invalid: {figure} at {level_label(best)} ({', '.join(failed)})"


def _judged(result: SweepResult) -> str:
    """The percentile the levels' sample counts were judged for (stats.validity_checks)."""
    custom = next((lv.latency.custom_percentile for lv in result.levels if lv.latency.custom_percentile), None)
    generative = any(lv.tokens is not None for lv in result.levels)
    streamed = any(lv.tokens is not None and lv.tokens.ttft_ms.count for lv in result.levels)
    percentile = custom or (GENERATIVE_PERCENTILE if generative else 99.0)
    # An unstreamed answer has no TTFT or ITL to have judged.
    return f"p{percentile:g}" + ((" of TTFT, ITL and latency" if streamed else " of latency") if generative else "")


def _kpis(result: SweepResult) -> str:
    levels = result.levels
    if not levels:
        return ""
    measured = [lv for lv in levels if lv.latency.count]
    cards = [_peak_card(result)]
    if measured:
        best = min(measured, key=lambda lv: lv.latency.p99_us)
        cards.append(("lowest p99", f"{ms(best.latency.p99_us):,.2f} ms", f"at {level_label(best)}"))
    requests = sum(lv.request_count for lv in levels)
    errors = sum(lv.error_count for lv in levels)
    cards.append(("requests measured", f"{requests:,}", f"{errors:,} failed"))
    stable = sum(lv.stable for lv in levels)
    valid = sum(lv.valid for lv in levels)
    cards.append(("levels", str(len(levels)), f"{stable} stable, {valid} valid"))
    if result.mode != "concurrency":
        worst = max(levels, key=lambda lv: lv.delayed_pct)
        cards.append(("late sends (worst)", f"{worst.delayed_pct:.2f} %", f"at {level_label(worst)}"))
    return '<div class="kpis">' + "".join(
        f'<div class="kpi"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div><div class="s">{esc(s)}</div></div>'
        for k, v, s in cards
    ) + "</div>"  # fmt: skip


#: The level table: (title, tidy CSV column, decimals, "-" range partner). The HTML is a view of the
#: CSV contract (STYLE practice 16): its figures come from tidy.TIDY_COLUMNS' getters.
_LEVEL_TABLE: tuple[tuple[str, str, int, str], ...] = (
    ("throughput infer/s", "throughput_infer_per_s", 1, ""),  # req/s for a generative run: _level_rows
    ("95% CI", "throughput_ci_low_infer_per_s", 1, "throughput_ci_high_infer_per_s"),
    ("p50 ms", "p50_ms", 2, ""),
    ("p90 ms", "p90_ms", 2, ""),
    ("p95 ms", "p95_ms", 2, ""),
    ("p99 ms", "p99_ms", 2, ""),
    ("p99 95% CI", "p99_ci_low_ms", 2, "p99_ci_high_ms"),
    ("p99.9 ms", "p999_ms", 2, ""),
    ("p99 from intended ms", "p99_from_intended_ms", 2, ""),  # rate modes only
    ("sent req/s", "send_rate_per_s", 1, ""),  # rate modes only: delivered, beside the offered level
    ("late sends %", "delayed_pct", 2, ""),  # rate modes only
    ("responses/s", "throughput_response_per_s", 1, ""),  # streamed only
    ("first response p50 ms", "first_response_p50_ms", 2, ""),  # streamed only
    ("response gap p50 ms", "response_gap_p50_ms", 2, ""),  # streamed only
    ("errors", "error_count", 0, ""),
    ("sequences/s", "sequence_throughput_per_s", 2, ""),  # sequence models only
    ("sequence p50 ms", "sequence_p50_ms", 2, ""),
    ("sequence p99 ms", "sequence_p99_ms", 2, ""),
    ("avg batch", "server_avg_batch_size", 2, ""),
    ("client CPU %", "client_cpu_pct", 0, ""),
    ("server CPU %", "server_cpu_pct", 0, ""),
    ("GPU util %", "gpu_utilization_pct", 0, ""),
)
_RATE_ONLY = {"p99_from_intended_ms", "send_rate_per_s", "delayed_pct"}
_STREAMED_ONLY = {"throughput_response_per_s", "first_response_p50_ms", "response_gap_p50_ms"}
_SEQUENCE_ONLY = {"sequence_throughput_per_s", "sequence_p50_ms", "sequence_p99_ms"}
#: The token table of generative endpoints (`--endpoint-type`), the same way.
_TOKEN_TABLE: tuple[tuple[str, str, int, str], ...] = (
    ("TTFT p50 ms", "ttft_p50_ms", 2, ""),
    ("TTFT p99 ms", "ttft_p99_ms", 2, ""),
    ("TTFT p99 95% CI", "ttft_p99_ci_low_ms", 2, "ttft_p99_ci_high_ms"),
    ("TTST p50 ms", "ttst_p50_ms", 2, ""),
    ("ITL p50 ms", "itl_p50_ms", 2, ""),
    ("ITL p99 ms", "itl_p99_ms", 2, ""),
    ("ITL p99 95% CI", "itl_p99_ci_low_ms", 2, "itl_p99_ci_high_ms"),
    ("output tokens/s", "output_tokens_per_s", 1, ""),
    ("tokens/s per user p50", "output_tokens_per_s_per_request_p50", 1, ""),  # one request's decode rate
    ("input tokens avg", "input_tokens_mean", 1, ""),
    ("output tokens avg", "output_tokens_mean", 1, ""),
    ("goodput req/s", "goodput_per_s", 1, ""),
    ("goodput %", "goodput_pct", 1, ""),
    ("lengths not honoured", "output_lengths_not_honoured", 0, ""),
)
#: Added to the token table when the levels ran multi-turn sessions.
_SESSION_TABLE: tuple[tuple[str, str, int, str], ...] = (
    ("sessions/s", "session_throughput_per_s", 2, ""),
    ("turns/session", "session_turns_mean", 1, ""),
    ("session p50 ms", "session_p50_ms", 2, ""),
    ("session p99 ms", "session_p99_ms", 2, ""),
)
_COLUMNS = {column.name: column for column in TIDY_COLUMNS}


def _level_rows(
    result: SweepResult, table: Sequence[tuple[str, str, int, str]] | None = None
) -> tuple[list[str], list[list[object]]]:
    scheduled = result.mode != "concurrency"
    streamed = any(lv.responses is not None for lv in result.levels)
    sequences = any(lv.sequence_latency is not None for lv in result.levels)
    table = table or [
        spec for spec in _LEVEL_TABLE
        if (scheduled or spec[1] not in _RATE_ONLY) and (streamed or spec[1] not in _STREAMED_ONLY)
        and (sequences or spec[1] not in _SEQUENCE_ONLY)
    ]  # fmt: skip
    # A range (a 95% CI) goes under the figure of the column before it, not in a column of its
    # own: a rate-mode table of separate CI columns outgrows a 1400 px window.
    header = ["level"]
    unit = throughput_unit(result)
    for i, (title, _, _, high) in enumerate(table):
        if high and i:
            header[-1] += " (95% CI)"
        else:
            header.append(title.replace("infer/s", unit))
    header += ["stable", "valid"]
    rows: list[list[object]] = []
    for lv in result.levels:
        cells = {name: _COLUMNS[name].getter(result, lv) for _, name, _, high in table for name in (name, high) if name}
        row: list[object] = [level_label(lv)]
        for i, (_, name, digits, high) in enumerate(table):
            text = number(cells[name], digits)
            if high and i:
                row[-1] = WithRange(str(row[-1]), text, number(cells[high], digits))
            else:
                row.append(f"{text} – {number(cells[high], digits)}" if high else text)
        row += [Badge("yes" if lv.stable else "no", lv.stable), Badge("yes" if lv.valid else "no", lv.valid)]
        rows.append(row)
    # A column no level has a figure for (GPU utilisation without a GPU...) only widens the table.
    keep = [i for i in range(len(header)) if not rows or any(_shown(row[i]) for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def _shown(cell: object) -> bool:
    """Whether a cell holds a figure: not "-", nor a "-" over a CI of "-"s (TTFT unstreamed)."""
    return (cell.value if isinstance(cell, WithRange) else cell) != "-"


def _token_section(result: SweepResult) -> str:
    """Generative endpoints' token figures, per level; nothing for tensor requests."""
    tokens = next((lv.tokens for lv in result.levels if lv.tokens is not None), None)
    if tokens is None:
        return ""
    sessions = any(lv.sessions is not None for lv in result.levels)
    header, rows = _level_rows(result, (*_TOKEN_TABLE, *_SESSION_TABLE) if sessions else _TOKEN_TABLE)
    how = "streamed" if tokens.streaming else "not streamed"
    missing = unstreamed_note(tokens.endpoint_type, tokens.streaming)
    note = (f"{tokens.endpoint_type} endpoint, {how}; tokens counted with {tokens.token_source}"
            + (f"; goodput objectives {tokens.goodput_slo}" if tokens.goodput_slo else ""))  # fmt: skip
    # how the counts were got where --tokenizer does not say it (records.usage_notes), as the first
    # level that has any said it: later levels say the same with their own figures
    counting = next((lv.tokens.token_notes for lv in result.levels if lv.tokens and lv.tokens.token_notes), ())
    warning = "".join(f'<div class="verdict warn"><div class="title">{esc(text)}</div></div>'
                      for text in (missing, *counting) if text)  # fmt: skip
    return (
        f'<h3>Tokens</h3>{warning}<p class="note">{esc(note)}</p>'
        f'<div class="scroll">{render_table(header, rows, "levels")}</div>{_token_figures(result)}'
    )


def _token_figures(result: SweepResult) -> str:
    """The generative figures (generative.figures_of)."""
    images = "".join(img(draw(result), alt, wide) for alt, draw, wide in generative.figures_of(result))
    return f'<h3>Generative figures</h3><div class="grid">{images}</div>'


def _checks_table(levels: Sequence[LevelResult]) -> str:
    rows = [
        [level_label(lv), c.name, Badge("pass" if c.passed else "fail", c.passed), c.detail, c.advice]
        for lv in levels
        for c in lv.checks
    ]
    return render_table(["level", "check", "result", "detail", "what to do"], rows, "checks")


def _workers_table(levels: Sequence[LevelResult], unit: str = "infer/s") -> str:
    """Each load worker's share of each level of a distributed sweep (`--workers N`)."""
    rows = [
        [level_label(lv), w.index, w.host, w.load, w.request_count, w.error_count,
         fmt(w.throughput_infer_per_s, 1), f"{w.clock_offset_us:+,.0f}", fmt(w.alignment_us, 0),
         fmt(w.cpu_pct, 0), Badge(w.died or "no", not w.died)]
        for lv in levels
        for w in lv.workers
    ]  # fmt: skip
    header = ["level", "worker", "host", "share", "requests", "errors", unit, "clock offset µs",
              "± µs", "CPU %", "died"]  # fmt: skip
    return (
        '<p class="note">Each worker\'s requests over the reported windows; its samples are part of the '
        "level's figures above. Clock offsets are estimated from round trips: timestamps are good to "
        "± the value shown.</p>" + render_table(header, rows, "workers")
    )


def _extra_table(title: str, table: tuple[list[str], list[list[str]]], classes: str) -> str:
    """A titled table of the levels' endpoints or composing models, or nothing when it has no rows."""
    header, rows = table
    return f'<h3>{esc(title)}</h3><div class="scroll">{render_table(header, rows, classes)}</div>' if rows else ""


def _spec_text(spec: dict[str, Any]) -> dict[str, str]:
    load, windows, inputs = spec.get("load") or {}, spec.get("windows") or {}, spec.get("inputs") or {}
    out: dict[str, str] = {}
    if load:
        mode = load.get("mode", "")
        text = f"{mode} {load.get('start', 0):g}:{load.get('end', 0):g}:{load.get('step', 0):g}"
        if mode != "concurrency":
            text += f", {load.get('distribution', 'constant')} arrivals"
        if load.get("latency_threshold_ms"):
            text += f", stop above {load['latency_threshold_ms']:g} ms" + (
                " (binary search)" if load.get("binary_search") else ""
            )
        out["load"] = text
    if windows and spec.get("auto_windows") and (spec.get("genai") or {}).get("endpoint_type", "kserve-infer") != (
        "kserve-infer"
    ):  # no window flag: a generative sweep's own windows (sweep.spec.generative_windows)
        out["measurement"] = (
            f"generative default: count windows of at least {GENERATIVE_WINDOW_REQUESTS} requests "
            f"({GENERATIVE_REQUESTS_PER_SLOT} per request in flight, {GENERATIVE_WINDOW_S:g} s of arrivals on a "
            f"schedule); stable when the last {windows.get('stable_window_count', 3)} agree within "
            f"{windows.get('stability_pct', 0):g}% (throughput and average latency)"
        )
    elif windows:
        if windows.get("mode") == "count_windows":
            size = f"windows of {windows.get('request_count')} requests"
        else:
            size = f"windows of {windows.get('interval_ms', 0):g} ms"
        stabilise = f"p{windows['percentile']:g}" if windows.get("percentile") else "average latency"
        out["measurement"] = (
            f"{size}; stable when the last {windows.get('stable_window_count', 3)} agree within "
            f"{windows.get('stability_pct', 0):g}% (throughput and {stabilise}); at most {windows.get('max_trials')} windows"
        )  # fmt: skip
        if windows.get("lengthenings"):
            out["measurement"] += (
                f" a length, doubled up to {windows['lengthenings']} times when they disagree (see each level's stable check)"
            )
    if inputs:
        out["inputs"] = f"batch {inputs.get('batch_size', 1)}, {inputs.get('input_data', 'random')} data"
    return out


def _provenance(result: SweepResult) -> str:
    p = result.provenance
    server = p.get("server") or {}
    machine = p.get("machine") or {}
    spec = p.get("spec") or {}
    rows: list[tuple[str, str]] = [
        ("perfkit", str(p.get("perfkit_version", "?"))),
        ("git commit", str(p.get("git_commit") or "(not in a git checkout)")),
        ("started", str(p.get("started_at", "?"))),
        ("command", "perfkit " + " ".join(str(a) for a in p.get("argv", []))),
        ("server", f"{server.get('name', '?')} {server.get('version', '')} at {result.url} over {result.protocol}"
                   + (" (embedded reference server)" if server.get("embedded") else "")),
        ("model", result.model + (f" version {result.model_version}" if result.model_version else " (latest version)")),
        *_spec_text(spec).items(),
        ("seed", str(p.get("seed", "?"))),
        ("machine", ", ".join(f"{k} {v}" for k, v in machine.items())),
        ("completed", "yes" if result.completed else f"no: {result.stop_reason}"),
    ]  # fmt: skip
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    config = json.dumps(spec, indent=1, sort_keys=True)
    return (
        f'<table class="kv"><tbody>{body}</tbody></table>'
        f"<details><summary>full configuration</summary><pre>{esc(config)}</pre></details>"
    )


def render_sweep_section(item: ReportItem, slo_ms: float | None = None) -> str:
    result = item.result
    assert isinstance(result, SweepResult)
    slo = slo_ms if slo_ms is not None else slo_from_sweep(result)
    runs = [(item.label, result)]
    drawn = [
        img(figures.throughput_vs_load(runs), "throughput vs load"),
        img(figures.latency_vs_load(runs, slo), "latency percentiles vs load"),
        img(figures.throughput_vs_p99(runs, slo), "throughput vs p99 latency"),
        *([img(figures.latency_breakdown(result), "latency breakdown")] if any(lv.server for lv in result.levels) else []),
        img(figures.windows_over_run(result), "measurement windows over the run", wide=True),
        img(
            figures.utilization_over_run(result),
            figures.utilisation_title(result).replace("Utilisation", "utilisation"),
            wide=True,
        ),
    ]
    if figures.has_errors_or_late_sends(result):  # an empty chart says less than no chart
        drawn.append(img(figures.errors_and_late_sends(result), "errors and late sends"))
    notes = sorted({note for lv in result.levels for note in lv.resources.notes})
    header, rows = _level_rows(result)
    title = f"Sweep of {result.model}: {result.mode.replace('_', ' ')}"
    return (
        f'<section id="{esc(anchor(item))}"><h2>{esc(title)} <span class="muted">{esc(item.label)}</span></h2>'
        f"{_verdict(result)}{_kpis(result)}"
        f'<h3>Levels</h3><div class="scroll">{render_table(header, rows, "levels")}</div>'
        + _token_section(result)
        + f'<h3>Figures</h3><div class="grid">{"".join(drawn)}</div>'
        + ("".join(f'<p class="note">{esc(n)}</p>' for n in notes))
        + (
            f"<h3>Load workers</h3>{_workers_table(result.levels, throughput_unit(result))}"
            if any(lv.workers for lv in result.levels)
            else ""
        )
        + _extra_table("Endpoints", endpoint_rows(result.levels), "endpoints")
        + _extra_table("Composing models (server side)", composing_rows(result.levels), "composing")
        + f"<h3>Validity checks</h3>{_checks_table(result.levels)}"
        f"<h3>Provenance</h3>{_provenance(result)}</section>"
    )
