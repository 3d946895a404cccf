"""The HTML report: one self-contained file a person can open, rendered from result files.

`render_html(items) -> str` is a pure function (STYLE practice 15): figures from `plots.py` are
inlined as base64 PNG data URIs, every interpolated string goes through `html.escape`, and nothing
is fetched from the network (practice 16). Each result file carries a `kind`;
`result_files.load_result` reads it and `SECTIONS` renders it:

- `sweep` (perfkit sweep's JSON; files without a `kind` but with `levels` are sweeps): the
  validity verdict first (practice 10), key figures, the per-level table, throughput and latency
  against load, the throughput–p99 curve, the latency breakdown, the windows and utilisation over
  the run, errors and late sends (when there are any), each load worker's share (`--workers N` runs), the checks, and
  the run's provenance.
- `tune`: a ranked table, the throughput–p99 Pareto plot of every variant with the constraint, the
  top variants' curves, and a sentence on the best configuration's gain over the default;
  `tune_combination` (a tune of several models) the same over combinations, then each model's.

Several results in one report open with a comparison: their curves overlaid, and, for two sweeps
of the same levels, `perfkit compare`'s table of deltas.

The page carries a tiny inline script that, once loaded, counts the images that decoded and the
tables with rows and writes them on <body> (`data-images-ok`, `data-images-total`,
`data-tables`): the browser test reads them back from Chromium's DOM dump.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perfkit._version import __version__
from perfkit.analysis.compare import GATE_METRICS, Thresholds, compare_sweeps, level_label
from perfkit.analysis.metrics import ms
from perfkit.analysis.stats import (
    GENERATIVE_PERCENTILE,
    GENERATIVE_REQUESTS_PER_SLOT,
    GENERATIVE_WINDOW_REQUESTS,
    GENERATIVE_WINDOW_S,
)
from perfkit.errors import PerfkitError
from perfkit.genai.records import unstreamed_note
from perfkit.report import genai_plots, plots
from perfkit.report.compare_text import comparison_rows
from perfkit.report.export import composing_rows, endpoint_rows
from perfkit.report.html_assets import CHECK_SCRIPT, CSS
from perfkit.report.tidy import TIDY_COLUMNS
from perfkit.results.files import ReportItem, TuneView, VariantView, slo_from_sweep
from perfkit.results.model import LevelResult, SweepResult
from perfkit.tune.verdict import TIE_RULE, Score, difference, mark, provisional, versus_default

__all__ = ["SECTIONS", "render_html", "render_sweep_section", "render_tune_section"]

# --------------------------------------------------------------------------------------------------
# HTML pieces


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _img(png: bytes, alt: str, wide: bool = False) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure class="{"wide" if wide else ""}"><img src="data:image/png;base64,{data}" alt="{_e(alt)}"></figure>'


def _numeric(value: object) -> bool:
    if isinstance(value, _WithRange):
        return True
    return not isinstance(value, _Badge) and _NUMERIC.fullmatch(str(value)) is not None


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], classes: str = "") -> str:
    """A table; columns whose cells are all numbers are right-aligned, header included."""
    numeric = [bool(rows) and all(_numeric(row[i]) for row in rows) for i in range(len(header))]
    head = "".join(f'<th class="n">{_e(h)}</th>' if n else f"<th>{_e(h)}</th>" for h, n in zip(header, numeric))
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f'<table class="{_e(classes)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


@dataclass(frozen=True, slots=True)
class _Badge:
    text: str
    ok: bool


@dataclass(frozen=True, slots=True)
class _WithRange:
    """A figure with its 95% CI under it, small: one column where two would widen the table."""

    value: str
    low: str
    high: str


_NUMERIC = re.compile(r"[-+]?[\d,.]+( ?[–%] ?[\d,.]*%?)?|-")


def _cell(value: object) -> str:
    if isinstance(value, _Badge):
        return f'<td><span class="badge {"ok" if value.ok else "bad"}">{_e(value.text)}</span></td>'
    if isinstance(value, _WithRange):
        ci = "" if value.low == value.high == "-" else f'<span class="ci">{_e(value.low)}–{_e(value.high)}</span>'
        return f'<td class="n">{_e(value.value)}{ci}</td>'
    return f'<td class="n">{_e(value)}</td>' if _numeric(value) else f"<td>{_e(value)}</td>"


def _number(value: str | float | None, digits: int) -> str:
    return "-" if value is None or isinstance(value, str) else f"{value:,.{digits}f}"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


# --------------------------------------------------------------------------------------------------
# A sweep


def _verdict(result: SweepResult) -> str:
    invalid = [lv for lv in result.levels if not lv.valid]
    problems: list[str] = []
    if not result.completed:
        problems.append(f"<li>The sweep stopped early: {_e(result.stop_reason)}</li>")
    for lv in invalid:
        for check in lv.checks:
            if not check.passed:
                advice = f' <span class="advice">→ {_e(check.advice)}</span>' if check.advice else ""
                problems.append(f"<li><b>{_e(level_label(lv))}</b>: {_e(check.name)}: {_e(check.detail)}{advice}</li>")
    if not result.levels:
        problems.append("<li>No level was measured.</li>")
    n = len(result.levels)
    if problems:
        head = f"NOT VALID: {len(invalid)} of {n} levels failed a check" + ("" if result.completed else "; incomplete")
        return f'<div class="verdict bad"><div class="title">{_e(head)}</div><ul>{"".join(problems)}</ul></div>'
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
    figure = f"{best.throughput_infer_per_s:,.1f} {plots.throughput_unit(result)}"
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
        f'<div class="kpi"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div><div class="s">{_e(s)}</div></div>'
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
    unit = plots.throughput_unit(result)
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
            text = _number(cells[name], digits)
            if high and i:
                row[-1] = _WithRange(str(row[-1]), text, _number(cells[high], digits))
            else:
                row.append(f"{text} – {_number(cells[high], digits)}" if high else text)
        row += [_Badge("yes" if lv.stable else "no", lv.stable), _Badge("yes" if lv.valid else "no", lv.valid)]
        rows.append(row)
    # A column no level has a figure for (GPU utilisation without a GPU...) only widens the table.
    keep = [i for i in range(len(header)) if not rows or any(_shown(row[i]) for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def _shown(cell: object) -> bool:
    """Whether a cell holds a figure: not "-", nor a "-" over a CI of "-"s (TTFT unstreamed)."""
    return (cell.value if isinstance(cell, _WithRange) else cell) != "-"


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
    warning = f'<div class="verdict warn"><div class="title">{_e(missing)}</div></div>' if missing else ""
    return (
        f'<h3>Tokens</h3>{warning}<p class="note">{_e(note)}</p>'
        f'<div class="scroll">{_table(header, rows, "levels")}</div>{_token_figures(result)}'
    )


def _token_figures(result: SweepResult) -> str:
    """The generative figures (genai_plots.figures_of)."""
    images = "".join(_img(draw(result), alt, wide) for alt, draw, wide in genai_plots.figures_of(result))
    return f'<h3>Generative figures</h3><div class="grid">{images}</div>'


def _checks_table(levels: Sequence[LevelResult]) -> str:
    rows = [
        [level_label(lv), c.name, _Badge("pass" if c.passed else "fail", c.passed), c.detail, c.advice]
        for lv in levels
        for c in lv.checks
    ]
    return _table(["level", "check", "result", "detail", "what to do"], rows, "checks")


def _workers_table(levels: Sequence[LevelResult], unit: str = "infer/s") -> str:
    """Each load worker's share of each level of a distributed sweep (`--workers N`)."""
    rows = [
        [level_label(lv), w.index, w.host, w.load, w.request_count, w.error_count,
         _fmt(w.throughput_infer_per_s, 1), f"{w.clock_offset_us:+,.0f}", _fmt(w.alignment_us, 0),
         _fmt(w.cpu_pct, 0), _Badge(w.died or "no", not w.died)]
        for lv in levels
        for w in lv.workers
    ]  # fmt: skip
    header = ["level", "worker", "host", "share", "requests", "errors", unit, "clock offset µs",
              "± µs", "CPU %", "died"]  # fmt: skip
    return (
        '<p class="note">Each worker\'s requests over the reported windows; its samples are part of the '
        "level's figures above. Clock offsets are estimated from round trips: timestamps are good to "
        "± the value shown.</p>" + _table(header, rows, "workers")
    )


def _extra_table(title: str, table: tuple[list[str], list[list[str]]], classes: str) -> str:
    """A titled table of the levels' endpoints or composing models, or nothing when it has no rows."""
    header, rows = table
    return f'<h3>{_e(title)}</h3><div class="scroll">{_table(header, rows, classes)}</div>' if rows else ""


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
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    config = json.dumps(spec, indent=1, sort_keys=True)
    return (
        f'<table class="kv"><tbody>{body}</tbody></table>'
        f"<details><summary>full configuration</summary><pre>{_e(config)}</pre></details>"
    )


def render_sweep_section(item: ReportItem, slo_ms: float | None = None) -> str:
    result = item.result
    assert isinstance(result, SweepResult)
    slo = slo_ms if slo_ms is not None else slo_from_sweep(result)
    runs = [(item.label, result)]
    figures = [
        _img(plots.throughput_vs_load(runs), "throughput vs load"),
        _img(plots.latency_vs_load(runs, slo), "latency percentiles vs load"),
        _img(plots.throughput_vs_p99(runs, slo), "throughput vs p99 latency"),
        *([_img(plots.latency_breakdown(result), "latency breakdown")] if any(lv.server for lv in result.levels) else []),
        _img(plots.windows_over_run(result), "measurement windows over the run", wide=True),
        _img(
            plots.utilization_over_run(result),
            plots.utilisation_title(result).replace("Utilisation", "utilisation"),
            wide=True,
        ),
    ]
    if plots.has_errors_or_late_sends(result):  # an empty chart says less than no chart
        figures.append(_img(plots.errors_and_late_sends(result), "errors and late sends"))
    notes = sorted({note for lv in result.levels for note in lv.resources.notes})
    header, rows = _level_rows(result)
    title = f"Sweep of {result.model}: {result.mode.replace('_', ' ')}"
    return (
        f'<section id="{_e(_anchor(item))}"><h2>{_e(title)} <span class="muted">{_e(item.label)}</span></h2>'
        f"{_verdict(result)}{_kpis(result)}"
        f'<h3>Levels</h3><div class="scroll">{_table(header, rows, "levels")}</div>'
        + _token_section(result)
        + f'<h3>Figures</h3><div class="grid">{"".join(figures)}</div>'
        + ("".join(f'<p class="note">{_e(n)}</p>' for n in notes))
        + (
            f"<h3>Load workers</h3>{_workers_table(result.levels, plots.throughput_unit(result))}"
            if any(lv.workers for lv in result.levels)
            else ""
        )
        + _extra_table("Endpoints", endpoint_rows(result.levels), "endpoints")
        + _extra_table("Composing models (server side)", composing_rows(result.levels), "composing")
        + f"<h3>Validity checks</h3>{_checks_table(result.levels)}"
        f"<h3>Provenance</h3>{_provenance(result)}</section>"
    )


# --------------------------------------------------------------------------------------------------
# A tune


def _gain(view: TuneView, variant: VariantView) -> float | None:
    """The tune's own gain over the default (a fraction), else the throughput ratio."""
    if variant.gain is not None:
        return float(variant.gain)
    default = next((v for v in view.variants if v.default), None)
    if default is None or not default.throughput_infer_per_s or variant.throughput_infer_per_s is None:
        return None
    return variant.throughput_infer_per_s / default.throughput_infer_per_s - 1


def _best(view: TuneView) -> VariantView | None:
    by_name = {v.name: v for v in view.variants}
    if view.best is not None:
        return by_name.get(view.best)
    ranked = view.ranked()
    return ranked[0] if ranked and ranked[0].feasible else None


def _scores(view: TuneView) -> dict[str, Score]:
    return {v.name: v.score for v in view.variants if v.score is not None}


def _versus(view: TuneView, variant: VariantView, default: VariantView) -> str:
    """`variant` against the default: with the tune's intervals, a gain only when it is significant
    (`verdict.versus_default`, as the console says it); from a tune.json without them, the point
    difference, said to be one."""
    scores = _scores(view)
    if variant.name in scores and default.name in scores:
        return versus_default(difference(scores[variant.name], scores[default.name]))
    gain = _gain(view, variant)
    if gain is None:
        return "not compared with the default configuration (no figures)"
    return (
        f"{abs(gain) * 100:.0f}% {'better' if gain >= 0 else 'worse'} than the default configuration by its "
        "point figures (this tune.json has no intervals to tell whether that is noise)"
    )


def _gain_sentence(view: TuneView) -> str:
    """model_analyzer's summary sentence (reports/report_manager.py), told with the tune's ties, and
    claiming a gain only when it is significant."""
    best = _best(view)
    constraints = f", under {', '.join(view.constraints)}" if view.constraints else ""
    measured = f"In {view.measurements} measurements across {len(view.variants)} configurations"
    if best is None:
        if not any(v.status == "infeasible" for v in view.variants):
            return f"{measured}, every configuration failed: nothing to recommend."
        return f"{measured}, no configuration met the constraints{constraints}."
    at = f" ({_fmt(best.throughput_infer_per_s, 1)} infer/s, p99 {_fmt(best.p99_ms)} ms"
    at += f" at concurrency {best.concurrency})" if best.concurrency is not None else ")"
    goal = f"at maximizing {view.objective}{constraints}"
    if best.default:
        return f"{measured}, the default configuration {best.name} is the best {goal}{at}."
    default = next((v for v in view.variants if v.default), None)
    if default is None:
        return f"{measured}, {best.name} is the best {goal}{at}; no default configuration was measured."
    versus = _versus(view, best, default)
    if len(view.ties) > 1:
        return (
            f"{measured}, {len(view.ties)} configurations tie for the best {goal}; {best.name}, the one that uses "
            f"the fewest resources, is {versus}{at}."
        )
    return f"{measured}, {best.name} is {versus} {goal}{at}."


def _versus_cell(view: TuneView, v: VariantView, scores: dict[str, Score], default: str | None) -> str:
    """The table's difference to the default with its interval, as the console prints it."""
    if v.default:
        return "-"
    if default is not None and v.name in scores and default in scores:
        return str(difference(scores[v.name], scores[default]))
    gain = _gain(view, v)  # a tune.json without intervals, or one model's own figures
    return "-" if gain is None else f"{gain * 100:+.0f} %"


def _tune_table(view: TuneView, best: VariantView | None) -> str:
    rows = []
    scores = _scores(view)
    default = next((v.name for v in view.variants if v.default), None)
    for i, v in enumerate(view.ranked(), 1):
        marked = "" if not v.feasible else mark(
            v.name, best=best.name if best else None, leader=view.leader, ties=view.ties,
            remeasured=view.remeasured, scores=scores,
        )  # fmt: skip
        status = (
            v.status + (f" ({marked})" if marked else "") + ("; " + "; ".join(v.violations) if v.violations else "")
        )
        ci = v.throughput_ci
        rows.append([
            v.rank or i, v.name + (" (default)" if v.default else "") + (" ★" if v is best else ""),
            v.description or ", ".join(f"{k}={val}" for k, val in v.params.items()),
            "-" if v.concurrency is None else str(v.concurrency), _fmt(v.throughput_infer_per_s, 1),
            "-" if ci is None else f"{ci[0]:,.1f} – {ci[1]:,.1f}", _fmt(v.p99_ms),
            _versus_cell(view, v, scores, default), _Badge(status, v.feasible),
        ])  # fmt: skip
    header = ["rank", "variant", "configuration", "concurrency", "throughput infer/s", "95% CI", "p99 ms",
              "vs default (95% CI)", "status"]  # fmt: skip
    return f'<div class="scroll">{_table(header, rows)}</div>'


def _tune_figures(view: TuneView, best: VariantView | None, constraint: float | None, top_n: int) -> list[str]:
    """The Pareto plot of every variant, and the curves of the top N, the best and the default."""
    ranked = view.ranked()
    points = [
        plots.Point(v.name, v.p99_ms, v.throughput_infer_per_s, v.default, v is best)
        for v in view.variants
        if v.p99_ms is not None and v.throughput_infer_per_s is not None
    ]
    figures = [_img(plots.pareto(points, constraint), "throughput vs p99 of every variant")] if points else []
    shown = [*ranked[:top_n], *(v for v in ranked if v is best or v.default)]  # the top N, the best, the default
    unique = [v for i, v in enumerate(shown) if not any(v is w for w in shown[:i])]
    top = [(v.name, v.sweep) for v in unique if v.sweep is not None]
    if top:
        figures += [
            _img(plots.throughput_vs_p99(top, constraint), "throughput vs p99 of the top variants"),
            _img(plots.throughput_vs_load(top), "throughput vs concurrency of the top variants"),
        ]
    return figures


def render_tune_section(item: ReportItem, slo_ms: float | None = None, top_n: int = 3) -> str:
    """A tune; of several models (`per_model`), each measured model's own table and figures follow."""
    view = item.result
    assert isinstance(view, TuneView)
    best = _best(view)
    constraint = view.constraint_p99_ms or slo_ms
    figures = _tune_figures(view, best, constraint, top_n)
    models = "".join(
        f"<h3>{_e(own.model)}, best first</h3>{_tune_table(own, _best(own))}"
        f'<div class="grid">{"".join(_tune_figures(own, _best(own), constraint, top_n))}</div>'
        for own in view.per_model
    )
    command = " ".join(str(a) for a in view.provenance.get("argv", []))
    unfinished = provisional(view.completed)  # the console's rule and words
    return (
        f'<section id="{_e(_anchor(item))}"><h2>{_e(f"Tune of {view.model}")} <span class="muted">{_e(item.label)}</span></h2>'
        f'<div class="verdict {"ok" if best and not unfinished else "bad"}"><div class="title">{_e(_gain_sentence(view))}</div>'
        + (f'<div class="provisional">{_e(unfinished)}</div>' if unfinished else "") + "</div>"
        f'<h3>Configurations, best first</h3>{_tune_table(view, best)}<p class="note">{_e(TIE_RULE)}</p>'
        + (f'<h3>Figures</h3><div class="grid">{"".join(figures)}</div>' if figures else "") + models
        + (f'<p class="note">{_e("perfkit " + command)}</p>' if command else "")
        + "</section>"
    )  # fmt: skip


SECTIONS: dict[str, Callable[[ReportItem, float | None], str]] = {
    "sweep": render_sweep_section,
    "tune": render_tune_section,
    "tune_combination": render_tune_section,
}


# --------------------------------------------------------------------------------------------------
# Several results


def _warnings(warnings: Sequence[str]) -> str:
    """The comparison's warnings (runs set up differently, levels not valid), above its table."""
    if not warnings:
        return ""
    items = "".join(f"<li>{_e(w)}</li>" for w in warnings)
    return f'<div class="verdict warn"><div class="title">Read with care</div><ul>{items}</ul></div>'


def _comparison_section(items: Sequence[ReportItem], thresholds: Thresholds, slo_ms: float | None) -> str:
    sweeps = [(it.label, it.result) for it in items if isinstance(it.result, SweepResult)]
    parts = ['<section id="comparison"><h2>Comparison</h2>']
    runs_rows = [
        [label, r.model, r.mode.replace("_", " "), str(r.provenance.get("started_at", "?")),
         str(r.provenance.get("git_commit", ""))[:10] or "-", str((r.provenance.get("machine") or {}).get("hostname", "?")),
         _fmt(max((lv.throughput_infer_per_s for lv in r.levels), default=0.0), 1),
         _Badge(f"{sum(lv.valid for lv in r.levels)}/{len(r.levels)}", all(lv.valid for lv in r.levels))]
        for label, r in sweeps
    ]  # fmt: skip
    peak = f"peak {plots.throughput_unit(*(r for _, r in sweeps))}"
    parts.append(_table(["run", "model", "mode", "started", "commit", "machine", peak, "valid levels"], runs_rows))
    if len({r.mode for _, r in sweeps}) == 1:
        parts.append(
            '<div class="grid">'
            + _img(plots.throughput_vs_load(sweeps), "throughput vs load, all runs")
            + _img(plots.latency_vs_load(sweeps, slo_ms), "latency vs load, all runs")
            + _img(plots.throughput_vs_p99(sweeps, slo_ms), "throughput vs p99, all runs")
            + "</div>"
        )
    if len(sweeps) == 2:
        (base_label, base), (cand_label, cand) = sweeps
        assert isinstance(base, SweepResult) and isinstance(cand, SweepResult)
        try:
            comparison = compare_sweeps(base, cand, thresholds, names=(base_label, cand_label))
        except PerfkitError as exc:
            parts.append(f'<p class="note">Not compared level by level: {_e(exc)}</p>')
        else:
            header, rows = comparison_rows(comparison)
            # Every gate metric is compared; the ones neither run measured (token figures of a
            # tensor model...) would be most of the table: counted, not listed.
            shown = [
                (r, d) for r, d in zip(rows, comparison.deltas) if d.baseline is not None or d.candidate is not None
            ]
            badge_rows = [[*r[:-1], _Badge(r[-1], not d.regression)] for r, d in shown]
            unmeasured = sorted({d.metric for d in comparison.deltas} - {d.metric for _, d in shown})
            regressions = len(comparison.regressions)
            parts.append(
                f"<h3>{_e(cand_label)} against {_e(base_label)}</h3>"
                f'<div class="verdict {"bad" if regressions else "ok"}"><div class="title">'
                + _e(f"{regressions} regression(s)" if regressions else "no regression")
                + _e(
                    f" (limits: throughput -{thresholds.max_throughput_drop_pct:g}%, latency "
                    f"+{thresholds.max_latency_increase_pct:g}%, and beyond the runs' noise)"
                )  # fmt: skip
                + "</div></div>"
                + _warnings(comparison.warnings)
                + f'<div class="scroll">{_table(header, badge_rows, "compared")}</div>'
                + (
                    f'<p class="note">{_e("Measured by neither run, so not shown: " + ", ".join(unmeasured))}.</p>'
                    if unmeasured
                    else ""
                )
                + "".join(f'<p class="note">{_e(n)}</p>' for n in comparison.notes)
            )
    parts.append("</section>")
    return "".join(parts)


def _anchor(item: ReportItem) -> str:
    return "run-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in item.label)


def render_html(
    items: Sequence[ReportItem],
    *,
    title: str | None = None,
    slo_ms: float | None = None,
    thresholds: Thresholds | None = None,
    generated_at: str | None = None,
) -> str:
    """The whole report as one HTML document. `slo_ms` draws a p99 bound on the latency figures
    (default: the sweep's own -l when it stabilised on p99); `thresholds` are the comparison's."""
    if not items:
        raise PerfkitError("nothing to report: pass at least one result file")
    thresholds = thresholds or Thresholds(metrics=tuple(GATE_METRICS))
    models = sorted({it.result.model for it in items})
    title = title or (
        "perfkit report: " + ", ".join(models) if len(items) == 1 else f"perfkit comparison of {len(items)} runs"
    )
    stamp = generated_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    compared = sum(isinstance(it.result, SweepResult) for it in items) > 1
    sections = [_comparison_section(items, thresholds, slo_ms)] if compared else []
    sections += [SECTIONS[it.kind](it, slo_ms) for it in items]
    links = ([("comparison", "Comparison")] if compared else []) + [(_anchor(it), it.label) for it in items]
    nav = "".join(f'<a href="#{_e(a)}">{_e(text)}</a>' for a, text in links)
    sources = ", ".join(it.source or it.label for it in items)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{CSS}</style></head><body>'
        f'<header><h1>{_e(title)}</h1><div class="sub">{_e(f"generated {stamp} by perfkit {__version__} from {sources}")}'
        f"</div></header><nav>{nav}</nav><main>{''.join(sections)}</main>"
        "<footer>Latencies are exact percentiles of the reported windows' requests; confidence intervals are 95%. "
        "Figures are PNG images inlined in this file, which needs no network.</footer>"
        f"<script>{CHECK_SCRIPT}</script></body></html>\n"
    )  # fmt: skip
