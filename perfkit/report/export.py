"""Report renderers: pure functions from results to text. The CLI decides where the text goes.

Four outputs:

- `render_pa_csv`: perf_analyzer's `-f` CSV, byte for byte in the layout of its `report_writer.cc`
  (checked against perf_analyzer 2.48.0), so tools that parse it (model_analyzer, scripts) read ours.
- `render_tidy_csv` / `append_tidy_csv`: perfkit's own CSV, one row per load level, every column
  snake_case with its unit in the name. It is driven by the one column table `TIDY_COLUMNS`, which
  docs and other renderers share; a change to that table is a change of `TIDY_SCHEMA_VERSION`. Its
  metric columns are the catalogue's (`analysis.metrics`): name, unit, getter and meaning.
- `render_profile_export`: perf_analyzer's `--profile-export-file` JSON (what genai-perf reads), with
  perfkit's per-request extras under their own keys.
- `render_summary_table`: the console table, as lines.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from perfkit.analysis.metrics import latency_ms, metric, ms
from perfkit.load.samples import SampleArrays
from perfkit.results.model import LatencyStats, LevelResult, SweepResult

__all__ = [
    "TIDY_COLUMNS",
    "TIDY_SCHEMA_VERSION",
    "Column",
    "ProfileExperiment",
    "append_tidy_csv",
    "render_pa_csv",
    "render_profile_export",
    "render_summary_table",
    "render_tidy_csv",
    "tidy_header",
]

TIDY_SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------------
# perf_analyzer's CSV (-f)


def _c_double(value: float) -> str:
    """A double as C++ `ostream << double` writes it by default: printf's `%g`, 6 significant digits
    (perf_analyzer writes 580.972, 1473.43, 12.5, 50)."""
    return f"{value:g}"


def _trunc_us(value: float) -> int:
    """perf_analyzer divides integer nanoseconds by 1000, so every time cell is truncated (and an
    unsigned type, so never negative)."""
    if not math.isfinite(value):
        return 0
    return max(0, int(value))


def _percentile_label(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else _c_double(p)


def _pa_percentiles(latency: LatencyStats) -> list[tuple[float, float]]:
    """(percentile, µs) pairs in increasing percentile order, as perf_analyzer's std::map holds them:
    p50, p90, p95, p99, plus `--percentile` when it is not one of those."""
    values = {50.0: latency.p50_us, 90.0: latency.p90_us, 95.0: latency.p95_us, 99.0: latency.p99_us}
    if latency.custom_percentile is not None:
        values[float(latency.custom_percentile)] = latency.custom_us if latency.custom_us is not None else 0.0
    return sorted(values.items())


def _gpu_cell(values: dict[str, float] | dict[str, int]) -> str:
    return "".join(
        f"{uuid}:{int(value) if isinstance(value, numbers.Integral) else _c_double(value)};"
        for uuid, value in sorted(values.items())
    )


def render_pa_csv(levels: Sequence[LevelResult], *, collect_metrics: bool = False, verbose_csv: bool = False) -> str:
    """perf_analyzer's `-f` CSV for these levels.

    As perf_analyzer does: the first column is `Concurrency` in concurrency mode and `Request Rate`
    otherwise (custom intervals included); server columns appear when server statistics exist; rows
    are sorted by increasing Inferences/Second; times are integer µs, truncated. `verbose_csv` adds
    `Avg latency` (only without a custom percentile), `request/response` and `response wait`, and
    only with it does `collect_metrics` add the four GPU columns (perf_analyzer writes them under
    `--verbose-csv --collect-metrics` only). Decoupled-model and response-cache columns are never
    written: perfkit measures neither.
    """
    modes = {level.mode for level in levels}
    if len(modes) > 1:
        raise ValueError(f"one perf_analyzer CSV holds one load mode, got {sorted(modes)}")
    concurrency = not levels or levels[0].mode == "concurrency"
    include_server = any(level.server is not None for level in levels)
    percentiles = [p for p, _ in _pa_percentiles(levels[0].latency if levels else LatencyStats())]
    has_custom = bool(levels) and levels[0].latency.custom_percentile is not None

    header = ["Concurrency" if concurrency else "Request Rate", "Inferences/Second", "Client Send"]
    if include_server:
        header += [
            "Network+Server Send/Recv",
            "Server Queue",
            "Server Compute Input",
            "Server Compute Infer",
            "Server Compute Output",
        ]
    header.append("Client Recv")
    header += [f"p{_percentile_label(p)} latency" for p in percentiles]
    if verbose_csv:
        if not has_custom:
            header.append("Avg latency")
        header += ["request/response", "response wait"]
        if collect_metrics:
            header += ["Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory"]
    lines = [",".join(header)]

    for level in sorted(levels, key=lambda lv: lv.throughput_infer_per_s):
        send = _trunc_us(level.client_send_us)
        recv = _trunc_us(level.client_recv_us)
        row = [
            str(int(level.level)) if concurrency else _c_double(level.level),
            _c_double(level.throughput_infer_per_s),
            str(send),
        ]
        if include_server:
            s = level.server
            row += [
                str(_trunc_us(level.network_server_us)),
                *(
                    ("0",) * 4
                    if s is None
                    else (
                        str(_trunc_us(s.queue_us)),
                        str(_trunc_us(s.compute_input_us)),
                        str(_trunc_us(s.compute_infer_us)),
                        str(_trunc_us(s.compute_output_us)),
                    )
                ),
            ]
        row.append(str(recv))
        by_percentile = dict(_pa_percentiles(level.latency))
        row += [str(_trunc_us(by_percentile.get(p, 0.0))) for p in percentiles]
        if verbose_csv:
            # perf_analyzer's "response wait" is the client library's average request time minus send
            # and receive; perfkit's closest figure is the average latency.
            mean = _trunc_us(level.latency.mean_us)
            if not has_custom:
                row.append(str(mean))
            row += [str(send + recv), str(max(0, mean - send - recv))]
            if collect_metrics:
                r = level.resources
                row += [
                    _gpu_cell(r.gpu_utilization),
                    _gpu_cell(r.gpu_power_w),
                    _gpu_cell(r.gpu_memory_used_bytes),
                    _gpu_cell(r.gpu_memory_total_bytes),
                ]
        lines.append(",".join(row))
    return "\n".join(lines) + "\n"


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
        "failed_checks",
        "",
        lambda s, lv: ";".join(check.name for check in lv.checks if not check.passed),
        "names of the validity checks that failed, ;-separated",
    ),
)

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
    return [[_cell(column.getter(result, level)) for column in TIDY_COLUMNS] for level in result.levels]


def render_tidy_csv(result: SweepResult) -> str:
    """One row per load level, in the order the sweep measured them, columns from `TIDY_COLUMNS`."""
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
# perf_analyzer's profile export JSON (--profile-export-file)


class ProfileExperiment(NamedTuple):
    """One load level's requests for the profile export. `samples` and `window_boundaries_ns` are on
    the monotonic clock of the run."""

    mode: str  # "concurrency" | "request_rate" | "custom_intervals"
    value: float
    samples: SampleArrays
    window_boundaries_ns: Sequence[int]


def _experiment_json(mode: str, value: float) -> str:
    # perf_analyzer writes a concurrency as an integer and any other schedule as a request rate (a
    # double, so 50 is written 50.0), custom intervals included.
    if mode == "concurrency":
        return json.dumps({"mode": "concurrency", "value": int(value)}, separators=(",", ":"))
    return json.dumps({"mode": "request_rate", "value": float(value)}, separators=(",", ":"))


def _requests_json(samples: SampleArrays, offset: int) -> str:
    # Formatted per request rather than through json.dumps on dicts: 100k requests take ~0.1 s.
    errors = [json.dumps(name) for name in samples.error_names]
    sent = (samples.sent_ns + offset).tolist()
    done = (samples.done_ns + offset).tolist()
    intended = (samples.intended_ns + offset).tolist()
    kinds = samples.error_kind.tolist()
    return ",".join(
        f'{{"timestamp":{s},"request_inputs":{{}},"response_timestamps":[{d}],"response_outputs":[{{}}],'
        f'"intended_timestamp":{i},"error":{errors[k]}}}'
        for s, d, i, k in zip(sent, done, intended, kinds)
    )


def render_profile_export(
    experiments: Sequence[tuple[str, float, SampleArrays, Sequence[int]]],
    *,
    version: str,
    epoch_offset_ns: int,
    service_kind: str = "triton",
    endpoint: str = "",
) -> str:
    """perf_analyzer's profile export JSON, compact and on one line as perf_analyzer writes it.

    Each experiment is (mode, value, samples, window boundaries); `ProfileExperiment` names them.
    perf_analyzer's timestamps are ns since the epoch and perfkit's are monotonic, so every
    timestamp has `epoch_offset_ns` (wall clock − monotonic clock, taken at the start of the run)
    added. A request's `timestamp` is its actual send and its one response timestamp its completion;
    requests keep the order of `samples`. perfkit adds, per request, `intended_timestamp` (when the
    schedule wanted it sent) and `error` ("" on success, else the error's kind); `request_inputs`
    and `response_outputs` hold no tensor data.
    """
    parts = []
    for mode, value, samples, boundaries in experiments:
        boundaries_json = json.dumps([int(b) + epoch_offset_ns for b in boundaries], separators=(",", ":"))
        parts.append(
            f'{{"experiment":{_experiment_json(mode, value)},"requests":[{_requests_json(samples, epoch_offset_ns)}],'
            f'"window_boundaries":{boundaries_json}}}'
        )
    trailer = json.dumps(
        {"version": version, "service_kind": service_kind, "endpoint": endpoint}, separators=(",", ":")
    )
    return f'{{"experiments":[{",".join(parts)}],{trailer[1:]}'


# --------------------------------------------------------------------------------------------------
# Console summary


def _fmt_level(level: LevelResult) -> str:
    return str(int(level.level)) if level.mode == "concurrency" else f"{level.level:g}"


def _fmt_ms(stats: LatencyStats, us: float) -> str:
    return f"{ms(us):.2f}" if stats.count > 0 else "-"


def render_summary_table(levels: Sequence[LevelResult]) -> list[str]:
    """The per-level summary as aligned plain-text lines. Rate-mode columns (latency from the
    intended send time, delayed sends) appear when some level ran on a schedule."""
    scheduled = any(level.mode != "concurrency" for level in levels)
    if all(level.mode == "concurrency" for level in levels):
        level_title = "concurrency"
    elif all(level.mode != "concurrency" for level in levels):
        level_title = "rate req/s"
    else:
        level_title = "level"
    titles = [level_title, "infer/s", "p50 ms", "p90 ms", "p99 ms"]
    if scheduled:
        titles += ["p99 corr ms", "delayed %"]
    titles += ["errors", "avg batch", "stable", "valid"]

    rows: list[list[str]] = []
    for level in levels:
        lat = level.latency
        row = [
            _fmt_level(level),
            f"{level.throughput_infer_per_s:.1f}",
            _fmt_ms(lat, lat.p50_us),
            _fmt_ms(lat, lat.p90_us),
            _fmt_ms(lat, lat.p99_us),
        ]
        if scheduled:
            corrected = level.latency_from_intended
            on_schedule = level.mode != "concurrency"
            row += [
                _fmt_ms(corrected, corrected.p99_us) if on_schedule else "-",
                f"{level.delayed_pct:.1f}" if on_schedule else "-",
            ]
        row += [
            str(level.error_count),
            "-" if level.server is None else f"{level.server.avg_batch_size:.2f}",
            "yes" if level.stable else "NO",
            "yes" if level.valid else "NO",
        ]
        rows.append(row)

    widths = [max(len(cell) for cell in column) for column in zip(titles, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths)).rstrip()

    return [line(titles), "  ".join("-" * width for width in widths), *(line(row) for row in rows)]
