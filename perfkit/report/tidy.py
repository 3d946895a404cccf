"""perfkit's tidy CSV: one row per load level, every column snake_case with its unit in the name.

A level measured over several endpoints (`-u A,B`) has a row per endpoint after its own (the
`endpoint` column names it; the level's row names them all), and a level of an ensemble or of a
model given --bls-composing-models a row per composing model (`composing_of` names the measured
model; client-side columns empty, throughput its share, as in perf_analyzer's composing CSVs).

It is driven by the one column table `TIDY_COLUMNS`, which docs and other renderers share; a change to
that table is a change of `TIDY_SCHEMA_VERSION`. Its metric columns are the catalogue's
(`analysis.metrics`): name, unit, getter and meaning.

- `render_tidy_csv` / `append_tidy_csv`: the CSV of one sweep, and a sweep's rows added to the text
  of a history CSV (led by run id and time); `append_history` / `check_history` do that to a file
  (`--append`), refusing one with another schema's header before anything is measured.
- `render_tidy_schema`: the column table (name, type, unit, meaning) as Markdown, from
  `TIDY_COLUMNS` itself, so `docs/tidy_csv_schema.md` cannot drift from the code: a test compares
  the two.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfkit.analysis.metrics import SESSION_METRICS, TOKEN_METRICS, latency_ms, metric, ms, token_figure
from perfkit.errors import PerfkitError
from perfkit.results.files import write_text_atomic
from perfkit.results.model import (
    ComposingStats,
    EndpointFigures,
    LatencyStats,
    LevelResult,
    ResourceUsage,
    ResponseStats,
    ServerStats,
    SweepResult,
)

__all__ = [
    "TIDY_COLUMNS",
    "TIDY_SCHEMA_VERSION",
    "Column",
    "append_history",
    "append_tidy_csv",
    "check_history",
    "render_tidy_csv",
    "render_tidy_schema",
    "tidy_header",
]

TIDY_SCHEMA_VERSION = 3


# --------------------------------------------------------------------------------------------------
# perfkit's tidy CSV

Cell = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the tidy CSV: its name (snake_case, unit suffixed), its unit, and how to read it
    from a level of a sweep. A getter returns None for "not measured", written as an empty cell."""

    name: str
    unit: str
    getter: Callable[[SweepResult, LevelResult], Cell]
    description: str = ""


def _metric_column(name: str) -> Column:
    """The column of a catalogue metric: its canonical name, unit, getter and description."""
    spec = metric(name)
    return Column(name, spec.unit, lambda s, lv: spec.value(lv), spec.description)


def _latency(attr: str) -> Callable[[SweepResult, LevelResult], Cell]:
    get = latency_ms(attr)
    return lambda s, lv: get(lv)


def _server(attr: str) -> Callable[[SweepResult, LevelResult], Cell]:
    def get(_: SweepResult, lv: LevelResult) -> Cell:
        return None if lv.server is None else getattr(lv.server, attr)

    return get


def _mean(values: dict[str, float]) -> float | None:
    return sum(values.values()) / len(values) if values else None


def _custom_ms(_: SweepResult, lv: LevelResult) -> Cell:
    stats = lv.latency
    return ms(stats.custom_us) if stats.custom_us is not None and stats.count > 0 else None


def _token_ci(attr: str, bound: str) -> Callable[[SweepResult, LevelResult], Cell]:
    get = token_figure(attr, bound)
    return lambda s, lv: get(lv)


TIDY_COLUMNS: tuple[Column, ...] = (
    Column("schema_version", "", lambda s, lv: TIDY_SCHEMA_VERSION, "version of this column table"),
    Column("model", "", lambda s, lv: s.model),
    Column("model_version", "", lambda s, lv: s.model_version, "empty: the server's choice"),
    Column("protocol", "", lambda s, lv: s.protocol, "http or grpc"),
    Column("mode", "", lambda s, lv: lv.mode, "concurrency, request_rate or custom_intervals"),
    Column("level", "", lambda s, lv: lv.level, "concurrency, or requests per second"),
    Column("batch_size", "count", lambda s, lv: lv.batch_size),
    Column("stable", "bool", lambda s, lv: lv.stable, "the level met the stability rule"),
    Column("valid", "bool", lambda s, lv: lv.valid, "every validity check passed"),
    Column("duration_s", "s", lambda s, lv: lv.duration_s, "length of the reported windows"),
    Column("request_count", "count", lambda s, lv: lv.request_count),
    Column("ok_count", "count", lambda s, lv: lv.ok_count),
    Column("error_count", "count", lambda s, lv: lv.error_count),
    Column(
        "errors",
        "",
        lambda s, lv: ";".join(f"{kind}={count}" for kind, count in sorted(lv.errors.items())),
        "kind=count;... sorted by kind",
    ),
    _metric_column("throughput_infer_per_s"),
    Column("throughput_ci_low_infer_per_s", "infer/s", lambda s, lv: lv.throughput_ci_low, "95% CI"),
    Column("throughput_ci_high_infer_per_s", "infer/s", lambda s, lv: lv.throughput_ci_high, "95% CI"),
    Column("send_rate_per_s", "req/s", lambda s, lv: lv.send_rate_per_s, "requests actually sent per second"),
    *(_metric_column(f"{stat}_ms") for stat in ("p50", "p90", "p95", "p99", "p999", "mean", "std", "min", "max")),
    Column("p99_ci_low_ms", "ms", _latency("p99_ci_low_us"), "95% CI of p99"),
    Column("p99_ci_high_ms", "ms", _latency("p99_ci_high_us"), "95% CI of p99"),
    Column("custom_percentile", "", lambda s, lv: lv.latency.custom_percentile, "--percentile, when asked for"),
    Column("custom_percentile_ms", "ms", _custom_ms, "latency at --percentile"),
    *(_metric_column(f"{stat}_from_intended_ms") for stat in ("p50", "p90", "p95", "p99", "p999", "mean", "max")),
    _metric_column("throughput_response_per_s"),
    _metric_column("responses_per_request"),
    *(_metric_column(f"first_response_{stat}_ms") for stat in ("p50", "p90", "p99", "mean")),
    *(_metric_column(f"response_gap_{stat}_ms") for stat in ("p50", "p90", "p99", "mean", "max")),
    Column("delayed_pct", "%", lambda s, lv: lv.delayed_pct, "sends more than 1 ms after their intended time"),
    Column("max_send_lag_ms", "ms", lambda s, lv: ms(lv.max_send_lag_us)),
    Column("client_send_us", "us", lambda s, lv: lv.client_send_us),
    Column("client_recv_us", "us", lambda s, lv: lv.client_recv_us),
    Column("network_server_us", "us", lambda s, lv: lv.network_server_us, "perf_analyzer's Network+Server Send/Recv"),
    Column("server_queue_us", "us", _server("queue_us")),
    Column("server_compute_input_us", "us", _server("compute_input_us")),
    Column("server_compute_infer_us", "us", _server("compute_infer_us")),
    Column("server_compute_output_us", "us", _server("compute_output_us")),
    Column("server_avg_batch_size", "count", _server("avg_batch_size")),
    Column("server_inference_count", "count", _server("inference_count")),
    Column("server_execution_count", "count", _server("execution_count")),
    _metric_column("gpu_utilization_pct"),
    Column(
        "gpu_memory_used_max_bytes",
        "bytes",
        lambda s, lv: max(lv.resources.gpu_memory_used_bytes.values(), default=None),
        "max over GPUs",
    ),
    Column("gpu_power_mean_w", "W", lambda s, lv: _mean(lv.resources.gpu_power_w), "mean over GPUs"),
    Column("client_cpu_pct", "%", lambda s, lv: lv.resources.client_cpu_pct, "of one core"),
    Column("client_cpu_us_per_request", "us/req", lambda s, lv: lv.resources.client_cpu_us_per_request),
    Column("server_cpu_pct", "%", lambda s, lv: lv.resources.server_cpu_pct, "of the whole machine"),
    Column("bytes_out_per_request", "bytes", lambda s, lv: lv.bytes_out_per_request),
    Column("bytes_in_per_request", "bytes", lambda s, lv: lv.bytes_in_per_request),
    Column(
        "token_source",
        "",
        lambda s, lv: lv.tokens.token_source if lv.tokens else None,
        "generative endpoints: bytes, a tokenizer.json, or usage (the server's counts)",
    ),  # fmt: skip
    *(_metric_column(m.name) for m in TOKEN_METRICS),
    *(
        Column(f"{figure}_p99_ci_{side}_ms", "ms", _token_ci(f"{figure}_ms", f"p99_ci_{side}"), "95% CI of p99")
        for figure in ("ttft", "itl")
        for side in ("low", "high")
    ),
    Column("goodput_slo", "", lambda s, lv: lv.tokens.goodput_slo or None if lv.tokens else None, "--goodput"),
    Column(
        "output_lengths_not_honoured",
        "count",
        lambda s, lv: lv.tokens.not_honoured_count if lv.tokens else None,
        "requests answered with another output length than asked",
    ),  # fmt: skip
    Column(
        "sequence_count",
        "count",
        lambda s, lv: lv.sequence_count if lv.sequence_latency else None,
        "sequence models: sequences whose last answer came in the windows",
    ),  # fmt: skip
    _metric_column("sequence_throughput_per_s"),
    *(_metric_column(f"sequence_{stat}_ms") for stat in ("p50", "p90", "p95", "p99", "mean", "max")),
    Column(
        "session_count",
        "count",
        lambda s, lv: lv.sessions.count if lv.sessions else None,
        "generative sessions: sessions whose last answer came in the windows",
    ),  # fmt: skip
    *(_metric_column(m.name) for m in SESSION_METRICS),
    Column(
        "failed_checks",
        "",
        lambda s, lv: ";".join(check.name for check in lv.checks if not check.passed),
        "names of the validity checks that failed, ;-separated",
    ),
    Column("endpoint", "", lambda s, lv: s.url, "where the row's requests went: one endpoint, or all, comma-separated"),
    Column(
        "composing_of",
        "",
        lambda s, lv: str(s.provenance.get("composing_of", "")),
        "the ensemble or BLS model this row's model composes; empty for the measured model",
    ),
)

_NAN = math.nan


def _endpoint_view(result: SweepResult, level: LevelResult, e: EndpointFigures) -> tuple[SweepResult, LevelResult]:
    row = dataclasses.replace(
        level, request_count=e.request_count, ok_count=e.ok_count, error_count=e.error_count, errors=e.errors,
        throughput_infer_per_s=e.throughput_infer_per_s, throughput_ci_low=_NAN, throughput_ci_high=_NAN,
        send_rate_per_s=_NAN, latency=e.latency, latency_from_intended=LatencyStats(), delayed_pct=_NAN,
        max_send_lag_us=_NAN, client_send_us=_NAN, client_recv_us=_NAN, network_server_us=_NAN, server=None,
        resources=ResourceUsage(), bytes_out_per_request=_NAN, bytes_in_per_request=_NAN, endpoints=(),
    )  # fmt: skip
    return dataclasses.replace(result, url=e.url), row


def _composing_view(result: SweepResult, level: LevelResult, c: ComposingStats, parent: ServerStats,
                    parent_name: str) -> tuple[SweepResult, LevelResult]:  # fmt: skip
    share = c.server.success_count / parent.success_count if parent.success_count > 0 else 0.0
    row = dataclasses.replace(
        level, request_count=c.server.success_count + c.server.fail_count, ok_count=c.server.success_count,
        error_count=c.server.fail_count, errors={}, throughput_infer_per_s=share * level.throughput_infer_per_s,
        throughput_ci_low=_NAN, throughput_ci_high=_NAN, send_rate_per_s=_NAN, latency=LatencyStats(),
        latency_from_intended=LatencyStats(), delayed_pct=_NAN, max_send_lag_us=_NAN, client_send_us=_NAN,
        client_recv_us=_NAN, network_server_us=c.server.overhead_us, server=c.server, resources=ResourceUsage(),
        bytes_out_per_request=_NAN, bytes_in_per_request=_NAN, endpoints=(),
    )  # fmt: skip
    view = dataclasses.replace(result, model=c.model, model_version=c.version,
                               provenance={"composing_of": parent_name})  # fmt: skip
    return view, row


def _views(result: SweepResult, level: LevelResult) -> list[tuple[SweepResult, LevelResult]]:
    """The rows of one level: its own, each endpoint's, each composing model's (recursively)."""
    views = [(result, level)]
    views += [_endpoint_view(result, level, e) for e in level.endpoints]
    pending = [(result.model, level.server)] if level.server is not None else []
    while pending:
        parent_name, parent = pending.pop(0)
        for c in parent.composing:
            views.append(_composing_view(result, level, c, parent, parent_name))
            pending.append((c.model, c.server))
    return views


_HISTORY_COLUMNS = ("run_id", "timestamp")


def _cell(value: Cell) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isnan(x):
            return ""
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        text = f"{x:.6f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    return str(value)


def _csv_text(rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def tidy_header(*, history: bool = False) -> list[str]:
    """The tidy CSV's column names; with `history`, led by `run_id` and `timestamp`."""
    return [*(_HISTORY_COLUMNS if history else ()), *(column.name for column in TIDY_COLUMNS)]


def _tidy_rows(result: SweepResult) -> list[list[str]]:
    return [
        [_cell(column.getter(view, row)) for column in TIDY_COLUMNS]
        for level in result.levels
        for view, row in _views(result, level)
    ]


def render_tidy_csv(result: SweepResult) -> str:
    """One row per load level, in the order the sweep measured them (each followed by its endpoints'
    and composing models' rows), columns from `TIDY_COLUMNS`."""
    return _csv_text([tidy_header(), *_tidy_rows(result)])


def append_tidy_csv(existing_text: str | None, result: SweepResult, run_id: str, timestamp: str) -> str:
    """A history CSV: `existing_text` (None or empty for a new file) followed by this sweep's rows,
    each led by `run_id` and `timestamp`. Raises ValueError when the existing header is not this
    version's."""
    expected = tidy_header(history=True)
    rows = [[run_id, timestamp, *row] for row in _tidy_rows(result)]
    if not existing_text:
        return _csv_text([expected, *rows])
    found = next(csv.reader(io.StringIO(existing_text)), [])
    if found != expected:
        missing = [name for name in expected if name not in found]
        extra = [name for name in found if name not in expected]
        if missing or extra:
            detail = "; ".join(
                part
                for part in (
                    f"missing columns {missing}" if missing else "",
                    f"unexpected columns {extra}" if extra else "",
                )
                if part
            )
        else:
            index = next(i for i, (a, b) in enumerate(zip(found, expected)) if a != b)
            detail = f"column {index + 1} is {found[index]!r}, expected {expected[index]!r}"
        raise ValueError(
            f"the history CSV's header does not match tidy schema version {TIDY_SCHEMA_VERSION}: {detail}; "
            "write to a new history file"
        )
    separator = "" if existing_text.endswith("\n") else "\n"
    return existing_text + separator + _csv_text(rows)


# --------------------------------------------------------------------------------------------------
# The tidy CSV's schema, as documentation


_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _schema_sample() -> SweepResult:
    """A sweep whose one level has every optional figure present, to read each column's type."""
    latency = LatencyStats(count=1, custom_percentile=97.0, custom_us=1.0)
    level = LevelResult(
        mode="request_rate", level=1.0, batch_size=1, stable=True, duration_s=1.0, request_count=1, ok_count=1,
        error_count=0, errors={}, throughput_infer_per_s=1.0, throughput_ci_low=1.0, throughput_ci_high=1.0,
        send_rate_per_s=1.0, latency=latency, latency_from_intended=latency, delayed_pct=0.0, max_send_lag_us=0.0,
        client_send_us=0.0, client_recv_us=0.0, network_server_us=0.0, server=ServerStats(),
        resources=ResourceUsage({"gpu": 0.5}, {"gpu": 1.0}, {"gpu": 1}, {"gpu": 2}, 1.0, 1.0, 1.0),
        windows=(), checks=(), responses=ResponseStats(1, 1.0, 1.0, latency, latency),
    )  # fmt: skip
    return SweepResult("m", "", "u", "http", "request_rate", (level,), {})


def render_tidy_schema() -> str:
    """docs/tidy_csv_schema.md: the tidy CSV's columns as a Markdown table, from TIDY_COLUMNS."""
    sample = _schema_sample()
    level = sample.levels[0]
    lines = [
        "# The tidy CSV's schema",
        "",
        "<!-- Generated from perfkit.report.tidy.TIDY_COLUMNS by `perfkit report --tidy-schema`; do not edit. -->",
        "",
        f"Schema version {TIDY_SCHEMA_VERSION}. `perfkit sweep` writes one row per load level to `*_long.csv`; "
        "`--append HISTORY.csv` (on `perfkit sweep` or `perfkit report`) adds a run's rows to a history file, "
        "each led by `run_id` and `timestamp`. Comma-separated, UTF-8, a header row, `\\n` line ends. "
        "An empty cell means *not measured*; booleans are `true`/`false`; numbers use `.` and no "
        "thousands separator. Columns are only ever added with a new `schema_version`, never renamed in place.",
        "",
        "| column | type | unit | meaning |",
        "| --- | --- | --- | --- |",
        "| `run_id` | string |  | history files only: the result file's name without `.json` |",
        "| `timestamp` | string | ISO 8601 | history files only: when the run started (UTC) |",
    ]
    for column in TIDY_COLUMNS:
        value = column.getter(sample, level)
        kind = _TYPE_NAMES.get(type(value), "string")
        cells = (f"`{column.name}`", kind, column.unit, column.description)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# The history CSV (--append)


def check_history(path: Path, flag: str = "--append") -> None:
    """Fail before measuring when `path` exists with another schema's header."""
    if not path.exists():
        if not path.parent.is_dir():
            raise PerfkitError(f"{flag} {path}: the folder {path.parent} does not exist")
        return
    try:
        header = path.read_text(encoding="utf-8").split("\n", 1)[0]
        append_tidy_csv(header + "\n", SweepResult("", "", "", "", "", (), {}), "", "")
    except OSError as exc:
        raise PerfkitError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise PerfkitError(f"{flag} {path}: {exc}") from None


def append_history(path: Path, result: SweepResult, run_id: str, flag: str = "--append") -> None:
    """Add a sweep's tidy rows to the history CSV at `path`, led by its run id and start time."""
    check_history(path, flag)
    existing = path.read_text(encoding="utf-8") if path.exists() else None
    timestamp = str(result.provenance.get("started_at", ""))
    write_text_atomic(path, append_tidy_csv(existing, result, run_id, timestamp))
