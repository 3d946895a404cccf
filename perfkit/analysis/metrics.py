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

from perfkit.results.model import LatencyStats, LevelResult

__all__ = ["METRICS", "Metric", "find", "latency_ms", "metric", "ms", "sequence_latency_ms"]


def ms(us: float) -> float:
    """Microseconds, as results store times, in the milliseconds every report shows."""
    return us / 1e3


def latency_ms(attr: str, corrected: bool = False) -> Callable[[LevelResult], float | None]:
    """A latency statistic in ms (from the intended send with `corrected`); None when no request
    succeeded, since the statistics are then all zeros."""

    def get(level: LevelResult) -> float | None:
        stats: LatencyStats = level.latency_from_intended if corrected else level.latency
        return ms(getattr(stats, attr)) if stats.count > 0 else None

    return get


def sequence_latency_ms(attr: str) -> Callable[[LevelResult], float | None]:
    """A per-sequence latency statistic in ms; None but for sequence models' levels."""

    def get(level: LevelResult) -> float | None:
        stats = level.sequence_latency
        return ms(getattr(stats, attr)) if stats is not None and stats.count > 0 else None

    return get


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
_INTENDED = "completion - intended send (coordinated omission corrected)"
_SEQUENCE = "a sequence's last answer - its first send (sequence models)"

METRICS: tuple[Metric, ...] = (
    Metric("throughput_infer_per_s", "infer/s", "higher", lambda lv: lv.throughput_infer_per_s,
           ("perf_throughput",), gate="throughput", figure="throughput", fmt="{:.1f}"),
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
)  # fmt: skip

_BY_SPELLING = {spelling: metric for metric in METRICS for spelling in metric.spellings}
_BY_NAME = {metric.name: metric for metric in METRICS}


def find(name: str) -> Metric | None:
    """The metric `name` spells (canonical or any alias, any case, surrounding blanks ignored)."""
    return _BY_SPELLING.get(name.strip().lower())


def metric(name: str) -> Metric:
    """The metric whose canonical name is `name`; a KeyError is a bug in the caller."""
    return _BY_NAME[name]
