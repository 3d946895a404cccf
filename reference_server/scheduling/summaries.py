"""Latency summaries (`--metrics-config summary_latencies=true`): tritonserver 2.51's
`nv_inference_{request,queue,compute_input,compute_infer,compute_output}_summary_us` Prometheus
summaries (server docs/user_guide/metrics.md "Summaries", core src/metric_model_reporter.cc).

`SummarizedStats` is a `ModelStats` that also keeps each successful request's five durations, in
microseconds (nanoseconds // 1000, as Triton observes them). The repository makes its statistics
with it only when summaries are on (`ModelRepository.new_stats`), so with them off nothing is added
to any request's path.

Each summary has a `_count` and `_sum` since load and quantiles over a sliding window: the
observations of the last 48 to 60 seconds, in five age buckets of 12 s, the window of
prometheus-cpp's summary (max age 60 s, 5 age buckets) that Triton uses. Where prometheus-cpp
estimates a quantile within its allowed error (CKMS), this takes the exact nearest-rank value of the
window, which is within any error; an empty window gives NaN, as there. As on Triton, a model with
the response cache has no request summary, and a cache hit is observed in the queue summary alone.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import deque
from collections.abc import Sequence

import numpy as np

from reference_server.scheduling.stats import ModelStats

__all__ = [
    "DEFAULT_QUANTILES",
    "SUMMARIES",
    "LatencySummary",
    "SummarizedStats",
    "parse_quantiles",
]

#: Triton's default quantiles, (quantile, allowed error) each (core src/metric_model_reporter.h).
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
MAX_AGE_S = 60.0
AGE_BUCKETS = 5

#: (family name, help, SummarizedStats attribute), in the order Triton exposes them.
SUMMARIES: tuple[tuple[str, str, str], ...] = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "request_summary",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue_summary",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input_summary",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer_summary",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        "compute_output_summary",
    ),
)


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`summary_quantiles=<quantile>:<error>,...` as (quantile, error) pairs; ValueError naming the
    bad pair (Triton logs and skips it; here the server does not start with it)."""
    pairs = []
    for part in text.split(","):
        quantile, colon, error = part.strip().partition(":")
        try:
            if not colon:
                raise ValueError
            pair = (float(quantile), float(error))
        except ValueError:
            raise ValueError(
                f"--metrics-config summary_quantiles: '{part}' is not <quantile>:<error> "
                "(e.g. summary_quantiles=0.5:0.05,0.9:0.01)"
            ) from None
        if not (0.0 <= pair[0] <= 1.0 and 0.0 <= pair[1] <= 1.0):
            raise ValueError(f"--metrics-config summary_quantiles: '{part}': quantile and error must be in [0, 1]")
        pairs.append(pair)
    return tuple(pairs)


class LatencySummary:
    """One summary of one model version: count and sum since load, and the window's observations."""

    __slots__ = ("count", "total", "_buckets", "_current", "_rotate_at")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        #: (start, observations) of the window's age buckets, oldest first; the last is `_current`.
        self._buckets: deque[tuple[float, array[int]]] = deque()
        self._current: array[int] = array("q")
        self._rotate_at = -math.inf

    def observe(self, value: int, now: float) -> None:
        self.count += 1
        self.total += value
        if now >= self._rotate_at:
            self._rotate(now)
        self._current.append(value)

    def _rotate(self, now: float) -> None:
        self._current = array("q")
        self._buckets.append((now, self._current))
        self._rotate_at = now + MAX_AGE_S / AGE_BUCKETS
        self._expire(now)

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - MAX_AGE_S:
            self._buckets.popleft()

    def quantiles(self, wanted: Sequence[float], now: float | None = None) -> list[float]:
        """The nearest-rank value of each quantile in `wanted` over the window (NaN when empty)."""
        self._expire(time.monotonic() if now is None else now)
        if not any(observed for _, observed in self._buckets):
            return [math.nan] * len(wanted)
        window = np.sort(np.concatenate([np.frombuffer(observed, dtype=np.int64) for _, observed in self._buckets]))
        last = window.size - 1
        return [float(window[min(last, max(0, math.ceil(q * window.size) - 1))]) for q in wanted]


class SummarizedStats(ModelStats):
    """A model version's statistics with Triton's five latency summaries."""

    __slots__ = (
        "request_summary",
        "queue_summary",
        "compute_input_summary",
        "compute_infer_summary",
        "compute_output_summary",
    )

    def __init__(self, cache_enabled: bool = False) -> None:
        super().__init__(cache_enabled)
        self.request_summary = LatencySummary()
        self.queue_summary = LatencySummary()
        self.compute_input_summary = LatencySummary()
        self.compute_infer_summary = LatencySummary()
        self.compute_output_summary = LatencySummary()

    def record_success(
        self,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        super().record_success(request_ns, queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns)
        now = time.monotonic()
        if not self.cache_enabled:  # Triton leaves the request summary out with the cache (DLIS-4762)
            self.request_summary.observe(request_ns // 1000, now)
        self.queue_summary.observe(queue_ns // 1000, now)
        self.compute_input_summary.observe(compute_input_ns // 1000, now)
        self.compute_infer_summary.observe(compute_infer_ns // 1000, now)
        self.compute_output_summary.observe(compute_output_ns // 1000, now)

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        super().record_cache_hit(request_ns, queue_ns, lookup_ns)
        self.queue_summary.observe(queue_ns // 1000, time.monotonic())
