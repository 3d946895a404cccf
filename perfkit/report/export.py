"""Report renderers: pure functions from results to text. The CLI decides where the text goes.

Four outputs here (perfkit's tidy CSV has its own module, `report.tidy`):

- `render_pa_csv`: perf_analyzer's `-f` CSV, byte for byte in the layout of its `report_writer.cc`
  (checked against perf_analyzer 2.48.0), so tools that parse it (model_analyzer, scripts) read ours.
- `render_composing_csvs`: the CSV perf_analyzer writes beside it for each composing model of an
  ensemble (or --bls-composing-models), its server-side breakdown per level.
- `render_profile_export`: perf_analyzer's `--profile-export-file` JSON (what genai-perf reads), with
  perfkit's per-request extras under their own keys.
- `render_summary_table`: the console table, as lines.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

from perfkit.analysis.metrics import ms
from perfkit.load.samples import SampleArrays
from perfkit.results.model import LatencyStats, LevelResult, ServerStats

__all__ = [
    "ProfileExperiment",
    "composing_csv_name",
    "composing_rows",
    "endpoint_rows",
    "render_composing_csvs",
    "render_composing_table",
    "render_endpoint_table",
    "render_pa_csv",
    "render_profile_export",
    "render_summary_table",
]


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
    `--verbose-csv --collect-metrics` only). `Response Throughput` follows `Inferences/Second` when
    the levels were streamed (perf_analyzer writes it for decoupled models, which it streams);
    response-cache columns are never written: perfkit does not measure them.
    """
    modes = {level.mode for level in levels}
    if len(modes) > 1:
        raise ValueError(f"one perf_analyzer CSV holds one load mode, got {sorted(modes)}")
    concurrency = not levels or levels[0].mode == "concurrency"
    include_server = any(level.server is not None for level in levels)
    percentiles = [p for p, _ in _pa_percentiles(levels[0].latency if levels else LatencyStats())]
    has_custom = bool(levels) and levels[0].latency.custom_percentile is not None

    streamed = any(level.responses is not None for level in levels)
    header = ["Concurrency" if concurrency else "Request Rate", "Inferences/Second"]
    header += ["Response Throughput", "Client Send"] if streamed else ["Client Send"]
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
    tokens = any(level.tokens is not None for level in levels)
    if tokens:
        header += [title for title, _, _ in TOKEN_CSV_COLUMNS]
    lines = [",".join(header)]

    for level in sorted(levels, key=lambda lv: lv.throughput_infer_per_s):
        send = _trunc_us(level.client_send_us)
        recv = _trunc_us(level.client_recv_us)
        row = [
            str(int(level.level)) if concurrency else _c_double(level.level),
            _c_double(level.throughput_infer_per_s),
            *([_c_double(level.responses.throughput_response_per_s if level.responses else 0.0)] if streamed else []),
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
        if tokens:
            row += _token_csv_cells(level)
        lines.append(",".join(row))
    return "\n".join(lines) + "\n"


#: Columns a generative sweep adds at the end of perf_analyzer's CSV (perf_analyzer has none):
#: times in integer µs, as its latencies, and token rates per second.
TOKEN_CSV_COLUMNS = (
    ("Time To First Token avg", "ttft_ms", "mean"),
    ("Time To First Token p99", "ttft_ms", "p99"),
    ("Inter Token Latency avg", "itl_ms", "mean"),
    ("Inter Token Latency p99", "itl_ms", "p99"),
    ("Output Tokens/Second", "output_tokens_per_s", ""),
    ("Goodput/Second", "goodput_per_s", ""),
)


def _token_csv_cells(level: LevelResult) -> list[str]:
    t = level.tokens
    cells = []
    for _, attr, stat in TOKEN_CSV_COLUMNS:
        value = None if t is None else getattr(t, attr)
        if stat:
            cells.append(str(_trunc_us(getattr(value, stat) * 1e3)) if value is not None and value.count else "")
        else:
            cells.append(_c_double(value) if value is not None else "")
    return cells


_COMPOSING_SERVER_COLUMNS = (
    "Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output"
)


def composing_csv_name(model: str, version: str, csv_name: str) -> str:
    """perf_analyzer's name for a composing model's CSV: `<model>_v<version>.<the -f file's name>`.
    perf_analyzer prefixes the -f argument as given, so its files land beside the CSV only for a bare
    file name in its working directory (`-f dir/out.csv` makes `mlp_v1.dir/out.csv`); perfkit
    writes them beside the CSV wherever it is."""
    return f"{model}_v{version}.{csv_name}"


def render_composing_csvs(levels: Sequence[LevelResult]) -> list[tuple[str, str, str]]:
    """(model, version, CSV text) for each composing model of the measured one, in the layout of
    perf_analyzer's report_writer.cc: the level, the model's share of the client's throughput (its
    successful requests over the ensemble's), Client Send 0, its server overhead in the
    Network+Server column, its queue and compute averages, Client Recv 0; rows in the main CSV's
    order (increasing Inferences/Second). Empty for a model with no composing models."""
    ordered = sorted(levels, key=lambda lv: lv.throughput_infer_per_s)
    models: dict[tuple[str, str], None] = {}
    for level in ordered:
        for c in level.server.composing if level.server is not None else ():
            models.setdefault((c.model, c.version), None)
    concurrency = bool(levels) and levels[0].mode == "concurrency"
    files = []
    for model, version in models:
        lines = [f"{'Concurrency' if concurrency else 'Request Rate'},Inferences/Second,Client Send,"
                 f"{_COMPOSING_SERVER_COLUMNS},Client Recv"]  # fmt: skip
        for level in ordered:
            top = level.server or ServerStats()
            mine = next((c.server for c in top.composing if (c.model, c.version) == (model, version)), ServerStats())
            ratio = mine.success_count / top.success_count if top.success_count > 0 else 0.0
            cells = [
                str(int(level.level)) if concurrency else _c_double(level.level),
                _c_double(ratio * level.throughput_infer_per_s),
                "0",
                *(str(_trunc_us(v)) for v in (mine.overhead_us, mine.queue_us, mine.compute_input_us,
                                              mine.compute_infer_us, mine.compute_output_us)),
                "0",
            ]  # fmt: skip
            lines.append(",".join(cells))
        files.append((model, version, "\n".join(lines) + "\n"))
    return files


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
    # A sequence model's request carries its sequence's id, after the timestamp, as perf_analyzer's does.
    ids = (
        [""] * len(sent)
        if samples.sequence_id is None
        else [f',"sequence_id":{q}' if q else "" for q in samples.sequence_id.tolist()]
    )
    responses: list[str] = [str(d) for d in done]
    if len(samples.gaps_ns) or (samples.responses > 0).any():  # streamed: every response's time
        first, gaps, counts = (samples.first_ns + offset).tolist(), samples.gaps_ns.tolist(), samples.responses.tolist()
        at = 0
        for index, count in enumerate(counts):
            if count > 0:
                times = [first[index]]
                for gap in gaps[at : at + count - 1]:
                    times.append(times[-1] + gap)
                responses[index] = ",".join(map(str, times))
                at += count - 1
    return ",".join(
        f'{{"timestamp":{s}{q},"request_inputs":{{}},"response_timestamps":[{r}],"response_outputs":[{{}}],'
        f'"intended_timestamp":{i},"error":{errors[k]}}}'
        for s, q, r, i, k in zip(sent, ids, responses, intended, kinds)
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
    added. A request's `timestamp` is its actual send and its one response timestamp its completion
    (a streamed request's response timestamps: each of its responses that carried outputs); a
    sequence model's request has its `sequence_id` (a session's turn: its session's number, the n of
    its X-Correlation-ID); requests keep the order of `samples`. perfkit adds, per request, `intended_timestamp` (when the
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


def _token_cells(level: LevelResult, goodput: bool) -> list[str]:
    t = level.tokens
    if t is None:
        return ["-"] * (4 if goodput else 3)
    cells = [
        f"{t.ttft_ms.p50:.2f}" if t.ttft_ms.count else "-",
        f"{t.itl_ms.p50:.2f}" if t.itl_ms.count else "-",
        f"{t.output_tokens_per_s:.1f}",
    ]
    return cells + ([f"{t.goodput_per_s:.1f}" if t.goodput_per_s is not None else "-"] if goodput else [])


def _session_cells(level: LevelResult) -> list[str]:
    """The summary table's session columns: sessions/s, mean turns, session p50."""
    f = level.sessions
    if f is None:
        return ["-"] * 3
    return [
        f"{f.throughput_per_s:.2f}",
        f"{f.turns.mean:.1f}" if f.turns.count else "-",
        f"{f.latency_ms.p50:.2f}" if f.latency_ms.count else "-",
    ]


def render_summary_table(levels: Sequence[LevelResult]) -> list[str]:
    """The per-level summary as aligned plain-text lines. Rate-mode columns (latency from the
    intended send time, delayed sends) appear when some level ran on a schedule, the sequences'
    rate and p50 when the model is a sequence model, and the sessions' rate, turns and p50 when
    the levels ran multi-turn sessions."""
    scheduled = any(level.mode != "concurrency" for level in levels)
    if all(level.mode == "concurrency" for level in levels):
        level_title = "concurrency"
    elif all(level.mode != "concurrency" for level in levels):
        level_title = "rate req/s"
    else:
        level_title = "level"
    tokens = any(level.tokens is not None for level in levels)
    goodput = any(level.tokens is not None and level.tokens.goodput_slo for level in levels)
    titles = [level_title, "req/s" if tokens else "infer/s", "p50 ms", "p90 ms", "p99 ms"]
    if scheduled:
        titles += ["p99 corr ms", "sent/s", "delayed %"]
    streamed = any(level.responses is not None for level in levels)
    if streamed:
        titles += ["resp/s", "first p50 ms", "gap p50 ms"]
    if tokens:
        titles += ["ttft p50 ms", "itl p50 ms", "tokens/s"] + (["goodput/s"] if goodput else [])
    sequences = any(level.sequence_latency is not None for level in levels)
    if sequences:
        titles += ["seq/s", "seq p50 ms"]
    sessions = any(level.sessions is not None for level in levels)
    if sessions:
        titles += ["sessions/s", "turns", "session p50 ms"]
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
                f"{level.send_rate_per_s:.1f}" if on_schedule else "-",
                f"{level.delayed_pct:.1f}" if on_schedule else "-",
            ]
        if streamed:
            r = level.responses
            row += ["-", "-", "-"] if r is None else [
                f"{r.throughput_response_per_s:.1f}", _fmt_ms(r.first_response, r.first_response.p50_us),
                _fmt_ms(r.gap, r.gap.p50_us),
            ]  # fmt: skip
        if tokens:
            row += _token_cells(level, goodput)
        if sequences:
            seq = level.sequence_latency
            row += ["-", "-"] if seq is None else [f"{level.sequence_throughput_per_s:.1f}", _fmt_ms(seq, seq.p50_us)]
        if sessions:
            row += _session_cells(level)
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


def _aligned(titles: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(titles, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths)).rstrip()

    return [line(titles), "  ".join("-" * width for width in widths), *(line(row) for row in rows)]


def composing_rows(levels: Sequence[LevelResult]) -> tuple[list[str], list[list[str]]]:
    """The composing models' server-side breakdown per level (perf_analyzer's "Composing models:"
    blocks) as titles and rows, for the console and the HTML report; no rows when there are none."""
    rows = []
    for level in levels:
        top = level.server or ServerStats()
        for c in top.composing:
            s = c.server
            share = s.success_count / top.success_count if top.success_count > 0 else 0.0
            rows.append([
                _fmt_level(level), c.model, c.version or "-", f"{share * level.throughput_infer_per_s:.1f}",
                str(s.success_count), f"{s.request_us:.0f}", f"{s.queue_us:.0f}",
                f"{s.compute_input_us + s.compute_infer_us + s.compute_output_us:.0f}", f"{s.avg_batch_size:.2f}",
            ])  # fmt: skip
    titles = ["level", "composing model", "version", "infer/s", "requests", "request us", "queue us", "compute us",
              "avg batch"]  # fmt: skip
    return titles, rows


def endpoint_rows(levels: Sequence[LevelResult]) -> tuple[list[str], list[list[str]]]:
    """Each endpoint's share of every level measured over several (`-u A,B`), then the level's
    total, as titles and rows; no rows for levels measured over one endpoint."""
    rows = []
    for level in levels:
        if not level.endpoints:
            continue
        for e in level.endpoints:
            errors = ", ".join(f"{kind} ×{count}" for kind, count in sorted(e.errors.items()))
            rows.append([
                _fmt_level(level), e.url, f"{e.throughput_infer_per_s:.1f}", _fmt_ms(e.latency, e.latency.p50_us),
                _fmt_ms(e.latency, e.latency.p99_us), str(e.request_count), errors or "0",
            ])  # fmt: skip
        lat = level.latency
        rows.append([
            _fmt_level(level), "total", f"{level.throughput_infer_per_s:.1f}", _fmt_ms(lat, lat.p50_us),
            _fmt_ms(lat, lat.p99_us), str(level.request_count), str(level.error_count),
        ])  # fmt: skip
    return ["level", "endpoint", "infer/s", "p50 ms", "p99 ms", "requests", "errors"], rows


def render_composing_table(levels: Sequence[LevelResult]) -> list[str]:
    """`composing_rows` as aligned lines; nothing when the model has no composing models."""
    titles, rows = composing_rows(levels)
    return _aligned(titles, rows) if rows else []


def render_endpoint_table(levels: Sequence[LevelResult]) -> list[str]:
    """`endpoint_rows` as aligned lines; nothing for a sweep of one endpoint."""
    titles, rows = endpoint_rows(levels)
    return _aligned(titles, rows) if rows else []
