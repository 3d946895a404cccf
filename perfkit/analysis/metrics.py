"""The one catalogue of the metrics a load level is reduced to (STYLE practice 21: metrics are data).

Each `Metric` has one canonical name, the unit-bearing spelling of the tidy CSV's column
(`p99_ms`, `throughput_infer_per_s`, `gpu_utilization_pct`), its unit, whether higher or lower is
better, and the one getter that reads it from a `LevelResult` in that unit (the one µs → ms
conversion). The tidy CSV's metric columns, `perfkit compare`'s gates and `perfkit tune`'s figures
are all read from here, so a new metric is one line.

Every spelling a metric ever had is an input alias: `compare --metric p99`, a scenario's
`metrics = ["p99"]` and `tune --objective p99_ms` name the same metric, and `find` accepts any of
them anywhere. Outputs keep the spellings files and dashboards already read: `gate` is the name
`perfkit compare` prints and writes into JUnit (`p99`), `figure` the key of tune's figures in
tune.json (`throughput`, `p99_ms`). A metric without one of them is not gated, or not tuned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from perfkit.results.model import LatencyStats, LevelResult, SweepResult

__all__ = [
    "METRICS", "SESSION_METRICS", "TOKEN_METRICS", "Metric", "find", "latency_ms", "metric", "ms",
    "sequence_latency_ms", "session_figure", "throughput_unit", "token_figure",
]  # fmt: skip


def ms(us: float) -> float:
    """Microseconds, as results store times, in the milliseconds every report shows."""
    return us / 1e3


def throughput_unit(*runs: SweepResult) -> str:
    """What the runs' throughput counts: requests/s for a generative endpoint (a request is one
    completion; AIPerf's and genai-perf's unit, and the console's "req/s"), inferences/s otherwise;
    both, for runs drawn together that differ."""
    units = dict.fromkeys("req/s" if any(lv.tokens is not None for lv in run.levels) else "infer/s" for run in runs)
    return " or ".join(units) or "infer/s"


def latency_ms(attr: str, corrected: bool = False) -> Callable[[LevelResult], float | None]:
    """A latency statistic in ms (from the intended send with `corrected`); None when no request
    succeeded, since the statistics are then all zeros."""

    def get(level: LevelResult) -> float | None:
        stats: LatencyStats = level.latency_from_intended if corrected else level.latency
        return ms(getattr(stats, attr)) if stats.count > 0 else None

    return get


def response_ms(stats: str, attr: str) -> Callable[[LevelResult], float | None]:
    """A streamed level's first-response (`stats` "first_response") or inter-response gap ("gap")
    statistic in ms; None for a level that was not streamed or has no such time."""

    def get(level: LevelResult) -> float | None:
        responses = level.responses
        if responses is None:
            return None
        times: LatencyStats = getattr(responses, stats)
        return ms(getattr(times, attr)) if times.count > 0 else None

    return get


def sequence_latency_ms(attr: str) -> Callable[[LevelResult], float | None]:
    """A per-sequence latency statistic in ms; None but for sequence models' levels."""

    def get(level: LevelResult) -> float | None:
        stats = level.sequence_latency
        return ms(getattr(stats, attr)) if stats is not None and stats.count > 0 else None

    return get


def token_figure(attr: str, stat: str | None = None) -> Callable[[LevelResult], float | None]:
    """A figure of a level's generative requests (`LevelResult.tokens`), `stat` of a distribution;
    None for a level of tensor requests, or when no request had the figure."""

    def get(level: LevelResult) -> float | None:
        figures = level.tokens
        if figures is None:
            return None
        value = getattr(figures, attr)
        if stat is None:
            return float(value) if value is not None else None
        return float(getattr(value, stat)) if value.count > 0 else None

    return get


def session_figure(attr: str, stat: str | None = None) -> Callable[[LevelResult], float | None]:
    """A figure of a level's multi-turn sessions (`LevelResult.sessions`), `stat` of a distribution;
    None for a level without sessions, or when no session had the figure."""

    def get(level: LevelResult) -> float | None:
        figures = level.sessions
        if figures is None:
            return None
        value = getattr(figures, attr)
        if stat is None:
            return float(value)
        return float(getattr(value, stat)) if value.count > 0 else None

    return get


def _responses(attr: str) -> Callable[[LevelResult], float | None]:
    return lambda level: None if level.responses is None else float(getattr(level.responses, attr))


def _gpu_utilization_pct(level: LevelResult) -> float | None:
    util = level.resources.gpu_utilization
    return 100.0 * sum(util.values()) / len(util) if util else None


def _gpu_memory_mb(level: LevelResult) -> float | None:
    used = level.resources.gpu_memory_used_bytes
    return max(used.values()) / 1e6 if used else None


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric of a load level. `grows_with_load`: under a closed loop it only rises with
    concurrency, so an upper bound on it holds below one level only (tune bisects that boundary)."""

    name: str
    unit: str
    better: Literal["higher", "lower"]
    value: Callable[[LevelResult], float | None]
    aliases: tuple[str, ...] = ()
    gate: str | None = None
    figure: str | None = None
    fmt: str = "{:.2f}"
    description: str = ""
    grows_with_load: bool = False

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every name this metric answers to, the canonical one first."""
        names = (self.name, *self.aliases, self.gate, self.figure)
        return tuple(dict.fromkeys(n for n in names if n))


_SENT = "completion - actual send"
_FIRST = "streamed: first response - actual send"
_GAP = "streamed: between consecutive responses of a request"
_TOKEN_TIMES = {
    "ttft": (
        "time to first token: send to the first response with output text (streamed)",
        ("p50", "p90", "p95", "p99", "mean"),
    ),
    "ttst": ("time to second token: first to second response with output text (streamed)", ("p50", "p99", "mean")),
    "itl": (
        "inter-token latency per request: (latency - ttft) / (output tokens - 1)",
        ("p50", "p90", "p95", "p99", "mean"),
    ),
}

#: The figures of generative endpoints (perfkit/genai/records.py), gated by their canonical names.
TOKEN_METRICS: tuple[Metric, ...] = (
    *(
        Metric(f"{figure}_{stat}_ms", "ms", "lower", token_figure(f"{figure}_ms", stat),
               gate=f"{figure}_{stat}_ms", description=text)
        for figure, (text, stats) in _TOKEN_TIMES.items() for stat in stats
    ),
    Metric("output_tokens_per_s", "tokens/s", "higher", token_figure("output_tokens_per_s"), ("output_token_throughput",),
           gate="output_tokens_per_s", fmt="{:.1f}", description="output tokens of the successful requests / seconds"),
    Metric("total_tokens_per_s", "tokens/s", "higher", token_figure("total_tokens_per_s"), fmt="{:.1f}",
           description="input and output tokens / seconds"),
    *(
        Metric(f"output_tokens_per_s_per_request_{stat}", "tokens/s", "higher",
               token_figure("output_tokens_per_s_per_request", stat), fmt="{:.1f}",
               gate=f"output_tokens_per_s_per_request_{stat}" if stat == "p50" else None,
               description="streamed: 1 / itl; otherwise output tokens / latency")
        for stat in ("p50", "mean")
    ),
    Metric("input_tokens_mean", "tokens", "lower", token_figure("input_tokens", "mean"), fmt="{:.1f}",
           description="per successful request"),
    Metric("output_tokens_mean", "tokens", "higher", token_figure("output_tokens", "mean"), fmt="{:.1f}",
           description="per successful request"),
    Metric("goodput_per_s", "req/s", "higher", token_figure("goodput_per_s"), ("goodput",), gate="goodput_per_s",
           fmt="{:.1f}", description="successful requests that met every --goodput objective / seconds"),
    Metric("goodput_pct", "%", "higher", token_figure("goodput_pct"), fmt="{:.1f}",
           description="share of the successful requests that met every --goodput objective"),
)  # fmt: skip
_SESSION = "a session's last answer - its first turn's send, think times included (generative sessions)"
#: The figures of multi-turn sessions (perfkit/genai/sessions.py).
SESSION_METRICS: tuple[Metric, ...] = (
    Metric("session_throughput_per_s", "sessions/s", "higher", session_figure("throughput_per_s"), fmt="{:.2f}",
           description="successful sessions whose last answer came in the windows / seconds"),
    *(
        Metric(f"session_turns_{stat}", "turns", "higher", session_figure("turns", stat), fmt="{:.1f}",
               description="turns per session (ended sessions, failed ones included)")
        for stat in ("mean", "max")
    ),
    *(
        Metric(f"session_{stat}_ms", "ms", "lower", session_figure("latency_ms", stat),
               gate=f"session_{stat}_ms" if stat in ("p50", "p99") else None, description=_SESSION)
        for stat in ("p50", "p90", "p95", "p99", "mean", "max")
    ),
)  # fmt: skip
_INTENDED = "completion - intended send (coordinated omission corrected)"
_SEQUENCE = "a sequence's last answer - its first send (sequence models)"

METRICS: tuple[Metric, ...] = (
    Metric("throughput_infer_per_s", "infer/s", "higher", lambda lv: lv.throughput_infer_per_s,
           ("perf_throughput",), gate="throughput", figure="throughput", fmt="{:.1f}",
           description="successful inferences (requests × batch size) / seconds of the windows"),
    *(
        Metric(f"{stat}_ms", "ms", "lower", latency_ms(f"{stat}_us"), aliases,
               gate=gate, figure=f"{stat}_ms" if tuned else None, description=_SENT, grows_with_load=tuned)
        for stat, aliases, gate, tuned in (
            ("p50", ("perf_latency_p50",), "p50", True),
            ("p90", ("perf_latency_p90",), "p90", True),
            ("p95", ("perf_latency_p95",), "p95", True),
            ("p99", ("latency", "perf_latency_p99"), "p99", True),
            ("p999", (), "p999", False),
            ("mean", ("perf_latency_avg",), "mean", True),
            ("std", (), None, False),
            ("min", (), None, False),
            ("max", (), None, False),
        )
    ),
    *(
        Metric(f"{stat}_from_intended_ms", "ms", "lower", latency_ms(f"{stat}_us", corrected=True),
               gate="p99_from_intended" if stat == "p99" else None, description=_INTENDED)
        for stat in ("p50", "p90", "p95", "p99", "p999", "mean", "max")
    ),
    Metric("throughput_response_per_s", "response/s", "higher", _responses("throughput_response_per_s"),
           ("response_throughput",), fmt="{:.1f}", description="streamed: responses with outputs per second"),
    Metric("responses_per_request", "count", "higher", _responses("responses_per_request"),
           description="streamed: responses with outputs per request"),
    *(
        Metric(f"first_response_{stat}_ms", "ms", "lower", response_ms("first_response", f"{stat}_us"),
               gate=f"first_response_{stat}" if stat == "p99" else None, description=_FIRST)
        for stat in ("p50", "p90", "p99", "mean")
    ),
    *(
        Metric(f"response_gap_{stat}_ms", "ms", "lower", response_ms("gap", f"{stat}_us"), description=_GAP)
        for stat in ("p50", "p90", "p99", "mean", "max")
    ),
    Metric("sequence_throughput_per_s", "sequences/s", "higher",
           lambda lv: lv.sequence_throughput_per_s if lv.sequence_latency is not None else None,
           ("sequence_per_sec",), fmt="{:.2f}", description="sequences whose last answer came in the windows"),
    *(
        Metric(f"sequence_{stat}_ms", "ms", "lower", sequence_latency_ms(f"{stat}_us"),
               gate=f"sequence_{stat}" if stat in ("p50", "p99") else None, description=_SEQUENCE)
        for stat in ("p50", "p90", "p95", "p99", "mean", "max")
    ),
    # Not a tidy column: the CSV keeps the bytes (gpu_memory_used_max_bytes), tune's bounds are in MB.
    Metric("gpu_memory_mb", "MB", "lower", _gpu_memory_mb, ("gpu_used_memory",), figure="gpu_memory_mb",
           fmt="{:.0f}", description="max over GPUs"),
    Metric("gpu_utilization_pct", "%", "higher", _gpu_utilization_pct, ("gpu_utilization",),
           figure="gpu_utilization_pct", fmt="{:.1f}", description="mean over GPUs"),
    *TOKEN_METRICS,
    *SESSION_METRICS,
)  # fmt: skip

_BY_SPELLING = {spelling: metric for metric in METRICS for spelling in metric.spellings}
_BY_NAME = {metric.name: metric for metric in METRICS}


def find(name: str) -> Metric | None:
    """The metric `name` spells (canonical or any alias, any case, surrounding blanks ignored)."""
    return _BY_SPELLING.get(name.strip().lower())


def metric(name: str) -> Metric:
    """The metric whose canonical name is `name`; a KeyError is a bug in the caller."""
    return _BY_NAME[name]
