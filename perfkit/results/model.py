"""What a sweep produces: one LevelResult per load level, inside a SweepResult with provenance.

Plain frozen dataclasses, written to and read from JSON here and nowhere else. Times are
microseconds (`*_us`) and rates per second, as in perf_analyzer's reports.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.results.writing import write_text_atomic

RESULT_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Latency distribution of one set of requests, in microseconds."""

    count: int = 0
    mean_us: float = 0.0
    std_us: float = 0.0
    min_us: float = 0.0
    max_us: float = 0.0
    p50_us: float = 0.0
    p90_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    p999_us: float = 0.0
    # 95% confidence interval of p99 from order statistics (distribution-free).
    p99_ci_low_us: float = 0.0
    p99_ci_high_us: float = 0.0
    # --percentile P, when asked for.
    custom_percentile: float | None = None
    custom_us: float | None = None


@dataclass(frozen=True, slots=True)
class ResponseStats:
    """Streamed requests (`--streaming`), every response timed: from the send to the first response
    (`first_response`), between consecutive responses of a request (`gap`), how many per request
    and per second (perf_analyzer's "Response Throughput", which counts the same responses)."""

    response_count: int = 0
    responses_per_request: float = 0.0
    throughput_response_per_s: float = 0.0
    first_response: LatencyStats = field(default_factory=LatencyStats)
    gap: LatencyStats = field(default_factory=LatencyStats)


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One measurement window: the requests that completed within it."""

    start_ns: int
    end_ns: int
    request_count: int
    ok_count: int
    error_count: int
    throughput_infer_per_s: float
    stabilizing_latency_us: float  # average latency, or --percentile's, as perf_analyzer


@dataclass(frozen=True, slots=True)
class ServerStats:
    """Differences of the server's statistics extension over the reported windows."""

    success_count: int = 0
    fail_count: int = 0
    inference_count: int = 0
    execution_count: int = 0
    avg_batch_size: float = 0.0
    request_us: float = 0.0  # average server-side request time (success.ns / success.count)
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    overhead_us: float = 0.0  # request − queue − compute, floored at 0 (perf_analyzer's "overhead")
    batch_sizes: dict[int, int] = field(default_factory=dict)  # formed batch size → executions
    # An ensemble's steps and --bls-composing-models, each differenced over the same windows.
    composing: tuple[ComposingStats, ...] = ()


@dataclass(frozen=True, slots=True)
class ComposingStats:
    """One composing model of an ensemble or BLS model (perf_analyzer's `composing_models_stat`):
    its name, the version whose statistics were read, and its own server-side figures."""

    model: str
    version: str
    server: ServerStats


@dataclass(frozen=True, slots=True)
class EndpointFigures:
    """One endpoint's share of a level measured over several (`-u A,B`): the requests sent to it,
    over the reported windows. Its samples are already in the level's figures."""

    url: str
    request_count: int
    ok_count: int
    error_count: int
    errors: dict[str, int]
    throughput_infer_per_s: float
    latency: LatencyStats


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """Resource figures over the reported windows. Empty dicts / None mean "not measured"."""

    gpu_utilization: dict[str, float] = field(default_factory=dict)  # gpu uuid → mean 0..1
    gpu_power_w: dict[str, float] = field(default_factory=dict)  # mean
    gpu_memory_used_bytes: dict[str, int] = field(default_factory=dict)  # max
    gpu_memory_total_bytes: dict[str, int] = field(default_factory=dict)
    client_cpu_pct: float | None = None  # of one core, all client processes
    client_cpu_us_per_request: float | None = None
    server_cpu_pct: float | None = None  # of the whole machine, 0..100 (nv_cpu_utilization or psutil)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Check:
    """One validity criterion: what was checked, whether it passed, and what to do if not."""

    name: str
    passed: bool
    detail: str
    advice: str = ""


@dataclass(frozen=True, slots=True)
class WorkerFigures:
    """One load worker's share of a distributed level (`perfkit sweep --workers N`), over the
    reported windows. Its samples are already in the level's figures; these say who sent what."""

    index: int
    host: str
    load: str  # its share: "concurrency 3", "arrivals i % 2 == 0"
    request_count: int
    ok_count: int
    error_count: int
    throughput_infer_per_s: float
    clock_offset_us: float  # its monotonic clock minus the driver's, as estimated
    alignment_us: float  # ± on its converted timestamps: half the round trip of the best estimate
    cpu_pct: float | None = None  # of one core, over the whole level
    died: str = ""  # when and why it stopped answering; "" while alive


@dataclass(frozen=True, slots=True)
class ValueStats:
    """Distribution of one per-request figure of generative requests, in the unit its name says
    (ms, tokens, tokens/s), with 95% confidence intervals of the mean (Student t) and of p99
    (order statistics)."""

    count: int = 0
    mean: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    mean_ci_low: float = 0.0
    mean_ci_high: float = 0.0
    p99_ci_low: float = 0.0
    p99_ci_high: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenSample:
    """Up to `records.SAMPLE_CAP` successful requests of a generative level, drawn evenly in order of
    completion from `total`, one column per figure, so that a report read from the result file can
    draw the distributions and the per-request scatter (the tables' figures come from every request).
    None where a request has no such figure (no TTFT without streaming, no ITL with one token)."""

    total: int = 0
    ttft_ms: tuple[float | None, ...] = ()
    itl_ms: tuple[float | None, ...] = ()
    latency_ms: tuple[float, ...] = ()
    input_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenFigures:
    """What a level of generative requests adds (perfkit/genai/records.py): per-request token
    timings and counts over the successful requests of the reported windows, the token
    throughput, and goodput when `--goodput` was given."""

    endpoint_type: str
    streaming: bool
    token_source: str  # "bytes", a tokenizer.json path, or "usage" (the server's figures)
    ttft_ms: ValueStats  # streamed only: send to the first response carrying output text
    ttst_ms: ValueStats  # streamed only: first to second such response (AIPerf's TTST)
    itl_ms: ValueStats  # streamed only: (latency - ttft) / (output tokens - 1), per request
    input_tokens: ValueStats
    output_tokens: ValueStats
    output_tokens_per_s_per_request: ValueStats  # streamed: 1 / itl; else output tokens / latency
    output_tokens_per_s: float  # all output tokens of the windows / their seconds
    total_tokens_per_s: float  # input and output
    asked_count: int = 0  # requests that asked for an output length (max_tokens)
    not_honoured_count: int = 0  # of those, answered with another length (module records.py)
    goodput_slo: str = ""  # --goodput as given; "" when none
    goodput_per_s: float | None = None
    goodput_pct: float | None = None  # of the successful requests
    sample: TokenSample | None = None  # per-request figures for the report's distributions (capped)
    # how the counts were got where --tokenizer alone does not say: answers without usage counted by
    # perfkit's tokenizer, a server whose usage disagrees with it (records.usage_notes)
    token_notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """What a level of multi-turn sessions adds (perfkit/genai/sessions.py): the sessions whose
    last answer came in a reported window, their rate, their turns, and the latency of the
    successful ones from the first turn's send to the last turn's answer (think times included)."""

    count: int
    ok_count: int
    throughput_per_s: float  # successful sessions / the windows' seconds
    turns: ValueStats  # turns per session
    latency_ms: ValueStats


@dataclass(frozen=True, slots=True)
class LevelResult:
    mode: str  # "concurrency" | "request_rate" | "custom_intervals"
    level: float  # concurrency, or requests per second
    batch_size: int
    stable: bool
    duration_s: float  # of the reported (merged) windows
    request_count: int
    ok_count: int
    error_count: int
    errors: dict[str, int]  # error kind → count
    throughput_infer_per_s: float
    throughput_ci_low: float
    throughput_ci_high: float
    send_rate_per_s: float
    latency: LatencyStats  # service latency: completion − actual send (perf_analyzer's)
    latency_from_intended: LatencyStats  # completion − intended send (coordinated omission corrected)
    delayed_pct: float  # share of sends later than 1 ms after their intended time
    max_send_lag_us: float
    client_send_us: float
    client_recv_us: float
    network_server_us: float  # perf_analyzer's "Network+Server Send/Recv"
    server: ServerStats | None
    resources: ResourceUsage
    windows: tuple[WindowResult, ...]
    checks: tuple[Check, ...]
    bytes_out_per_request: float = 0.0
    bytes_in_per_request: float = 0.0
    workers: tuple[WorkerFigures, ...] = ()  # distributed runs only
    responses: ResponseStats | None = None  # streamed runs only
    tokens: TokenFigures | None = None  # generative endpoints only
    # Sequence models only: the sequences whose last answer came in a reported window, their rate,
    # and their latency from first send to last answer (successful sequences).
    sequence_count: int = 0
    sequence_throughput_per_s: float = 0.0
    sequence_latency: LatencyStats | None = None
    endpoints: tuple[EndpointFigures, ...] = ()  # several -u endpoints only
    sessions: SessionFigures | None = None  # generative multi-turn sessions only
    # Requests that ended after the last window, while the level drained (answered, failed, or
    # cancelled at the drain timeout): in no window's figures, but counted once each. Their failures
    # are in `errors`, `error_count` and `request_count`; their answers only here (late_ok_count),
    # so ok_count + late_ok_count + error_count is every request counted for the level.
    late_count: int = 0
    late_ok_count: int = 0
    # Requests that failed before the reported windows (in earlier, unreported windows or the
    # warm-up): in none of the figures above, which are the reported span's, but failures of the
    # level all the same: its "errors" check fails on them and the sweep exits 4.
    early_error_count: int = 0
    early_errors: dict[str, int] = field(default_factory=dict)  # error kind -> count

    @property
    def valid(self) -> bool:
        return all(check.passed for check in self.checks)


def level_name(mode: str, level: float, *, short: bool = False) -> str:
    """How a load level is named: `concurrency 4`, `request rate 12.5/s`, `custom intervals` in
    progress lines; with `short`, as comparisons and reports name it: `rate 12.5/s`, `intervals 8/s`."""
    if mode == "concurrency":
        return f"concurrency {int(level)}"
    if mode == "custom_intervals":
        return f"intervals {level:g}/s" if short else "custom intervals"
    return f"{'rate' if short else 'request rate'} {level:g}/s"


@dataclass(frozen=True, slots=True)
class SweepResult:
    model: str
    model_version: str
    url: str
    protocol: str  # "http" | "grpc"
    mode: str
    levels: tuple[LevelResult, ...]
    provenance: dict[str, Any]  # perfkit version, git commit, server metadata, machine, seed, argv, spec
    completed: bool = True  # False when the sweep stopped early (server failure, interrupt)
    stop_reason: str = ""

    def with_level(self, level: LevelResult) -> SweepResult:
        return dataclasses.replace(self, levels=(*self.levels, level))


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def _server_from_json(data: dict[str, Any]) -> ServerStats:
    composing = tuple(
        ComposingStats(c["model"], c["version"], _server_from_json(c["server"])) for c in data.get("composing", ())
    )
    return ServerStats(
        **{**data, "batch_sizes": {int(k): v for k, v in data["batch_sizes"].items()}, "composing": composing}
    )


def _endpoint_from_json(data: dict[str, Any]) -> EndpointFigures:
    return EndpointFigures(**{**data, "errors": dict(data["errors"]), "latency": LatencyStats(**data["latency"])})


def _level_from_json(data: dict[str, Any]) -> LevelResult:
    server = data.get("server")
    return LevelResult(
        **{
            **data,
            "errors": dict(data["errors"]),
            "latency": LatencyStats(**data["latency"]),
            "latency_from_intended": LatencyStats(**data["latency_from_intended"]),
            "server": None if server is None else _server_from_json(server),
            "resources": ResourceUsage(**{**data["resources"], "notes": tuple(data["resources"]["notes"])}),
            "windows": tuple(WindowResult(**w) for w in data["windows"]),
            "checks": tuple(Check(**c) for c in data["checks"]),
            "workers": tuple(WorkerFigures(**w) for w in data.get("workers", ())),
            "responses": _responses_from_json(data.get("responses")),
            "tokens": _tokens_from_json(data.get("tokens")),
            "sequence_latency": (
                LatencyStats(**data["sequence_latency"]) if data.get("sequence_latency") is not None else None
            ),
            "endpoints": tuple(_endpoint_from_json(e) for e in data.get("endpoints", ())),
            "sessions": _sessions_from_json(data.get("sessions")),
        }
    )


def _responses_from_json(data: dict[str, Any] | None) -> ResponseStats | None:
    if data is None:
        return None
    first, gap = LatencyStats(**data["first_response"]), LatencyStats(**data["gap"])
    return ResponseStats(**{**data, "first_response": first, "gap": gap})


def _sessions_from_json(data: dict[str, Any] | None) -> SessionFigures | None:
    if data is None:
        return None
    return SessionFigures(
        **{**data, "turns": ValueStats(**data["turns"]), "latency_ms": ValueStats(**data["latency_ms"])}
    )


def _tokens_from_json(data: dict[str, Any] | None) -> TokenFigures | None:
    if data is None:
        return None
    sample = data.get("sample")
    stats = {name: ValueStats(**value) for name, value in data.items() if isinstance(value, dict) and name != "sample"}
    columns: dict[str, Any] = {} if sample is None else {k: tuple(v) if isinstance(v, list) else v for k, v in sample.items()}
    notes = tuple(data.get("token_notes", ()))
    kept = TokenSample(**columns) if sample is not None else None
    return TokenFigures(**{**data, **stats, "token_notes": notes, "sample": kept})


def sweep_to_json(result: SweepResult) -> str:
    return json.dumps({"schema_version": RESULT_SCHEMA_VERSION, **to_jsonable(result)}, indent=1)


def sweep_from_json(text: str, source: str = "result") -> SweepResult:
    data = json.loads(text)
    version = data.pop("schema_version", None)
    if version != RESULT_SCHEMA_VERSION:
        raise ValueError(f"{source}: result schema version {version} is not {RESULT_SCHEMA_VERSION}")
    data["levels"] = tuple(_level_from_json(level) for level in data["levels"])
    return SweepResult(**data)


def write_sweep(result: SweepResult, path: Path) -> None:
    """Write atomically, so an interrupted sweep never leaves a half-written file."""
    write_text_atomic(path, sweep_to_json(result))


def read_sweep(path: Path) -> SweepResult:
    return sweep_from_json(path.read_text(), str(path))
