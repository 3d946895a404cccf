"""Per model-version statistics, in the shape of Triton's statistics extension.

One `ModelStats` per loaded model version. The scheduler is its only writer and it writes from the
event-loop thread, so plain ints suffice: no locks, no atomics. Readers (the statistics endpoint
and the Prometheus collector) run on the same loop and see a consistent snapshot.

Triton semantics kept here (server docs/protocol/extension_statistics.md, core
src/infer_stats.cc):

- *Per request*: `success`, `fail`, `queue` and the three `compute_*` durations. The compute
  durations of a request are those of the batch execution it was part of, so in a batch of 8
  every request adds the same compute time. `success.ns` is the request's whole time in the
  server; `queue.count` therefore equals `success.count`, and so do the `compute_*` counts but for cache hits.
- *Per execution*: `inference_count` grows by the batch size, `execution_count` by one, and
  `batch_stats[batch_size]` accumulates the compute phases of that execution once.
- *Response cache* (Triton's `UpdateSuccessCacheHit`/`UpdateSuccessCacheMiss`): a hit is a success
  with its queue time and a `cache_hit` duration, and no compute; so the three `compute_*` counts
  are `success.count - cache_hit.count`. A miss adds its lookup and insertion time to `cache_miss`
  and to `success.ns`.
- All counters are cumulative since load; clients difference two samples.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any, Final

import numpy as np
from mypy_extensions import mypyc_attr

#: Failure reasons Triton attaches to `nv_inference_request_failure` (core src/metric_model_reporter.cc).
FAILURE_REASONS: Final = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_LOADS = itertools.count(1)

#: What `ModelStats.publish` writes for another process to read, in this order, then the failures by
#: reason, then four counters for each batch size from 1 (`counters_length`).
_PUBLISHED: Final = (
    "success_count", "success_ns", "fail_count", "fail_ns", "queue_ns_total", "compute_input_ns_total",
    "compute_infer_ns_total", "compute_output_ns_total", "inference_count", "execution_count",
    "last_inference_ms", "pending", "cache_hit_count", "cache_hit_ns_total", "cache_miss_count",
    "cache_miss_ns_total",
)  # fmt: skip
_HEAD: Final = len(_PUBLISHED) + len(FAILURE_REASONS)
_SUMMED: Final = tuple(name for name in _PUBLISHED if name != "last_inference_ms")


def counters_length(max_batch_size: int) -> int:
    """How many int64 counters `publish` writes for a model of `max_batch_size` (0: no batching)."""
    return _HEAD + 4 * max(1, max_batch_size)


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


class _BatchStats:
    """Cumulative compute time of the executions of one batch size."""

    __slots__ = ("count", "compute_input_ns", "compute_infer_ns", "compute_output_ns")

    def __init__(self) -> None:
        self.count = 0
        self.compute_input_ns = 0
        self.compute_infer_ns = 0
        self.compute_output_ns = 0


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class ModelStats:
    """Cumulative inference statistics of one model version.

    Mutate only from the event-loop thread. Durations are integer nanoseconds.
    """

    __slots__ = (
        "success_count",
        "success_ns",
        "fail_count",
        "fail_ns",
        "queue_ns_total",
        "compute_input_ns_total",
        "compute_infer_ns_total",
        "compute_output_ns_total",
        "inference_count",
        "execution_count",
        "last_inference_ms",
        "pending",
        "failures",
        "cache_enabled",
        "cache_hit_count",
        "cache_hit_ns_total",
        "cache_miss_count",
        "cache_miss_ns_total",
        "load_id",
        "_batches",
    )

    def __init__(self, cache_enabled: bool = False) -> None:
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        # Per-request sums whose counts are `success_count` (Triton counts them on success only).
        # Named *_total because Prometheus exports them as cumulative counters as they are.
        self.queue_ns_total = 0
        self.compute_input_ns_total = 0
        self.compute_infer_ns_total = 0
        self.compute_output_ns_total = 0
        self.inference_count = 0
        self.execution_count = 0
        #: Wall clock (ms since the epoch) of the last execution; 0 before the first.
        self.last_inference_ms = 0
        #: Requests received but not yet executing (`nv_inference_pending_request_count`).
        self.pending = 0
        #: Failed requests by reason; every reason is present so Prometheus exports zeros too.
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        #: Whether the version's config enables the response cache (its nv_cache_* metrics exist then).
        self.cache_enabled = cache_enabled
        self.cache_hit_count = 0
        self.cache_hit_ns_total = 0
        self.cache_miss_count = 0
        self.cache_miss_ns_total = 0
        #: Unique per load in this process: what tells a reloaded version's cache entries from the old ones'.
        self.load_id = next(_LOADS)
        self._batches: dict[int, _BatchStats] = {}

    # -- writers (scheduler) ---------------------------------------------------------------------

    def record_success(
        self,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """Count one successful request and its time in the server, queue and compute phases."""
        self.success_count += 1
        self.success_ns += request_ns
        self.queue_ns_total += queue_ns
        self.compute_input_ns_total += compute_input_ns
        self.compute_infer_ns_total += compute_infer_ns
        self.compute_output_ns_total += compute_output_ns

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """Count one request answered from the response cache: a success that never ran."""
        self.success_count += 1
        self.success_ns += request_ns
        self.queue_ns_total += queue_ns
        self.cache_hit_count += 1
        self.cache_hit_ns_total += lookup_ns

    def record_cache_miss(self, lookup_and_insert_ns: int) -> None:
        """Count the cache's part of a request that ran (already counted a success by the scheduler)."""
        self.success_ns += lookup_and_insert_ns
        self.cache_miss_count += 1
        self.cache_miss_ns_total += lookup_and_insert_ns

    def record_failure(self, request_ns: int, reason: str) -> None:
        """Count one failed request; `reason` is one of `FAILURE_REASONS`."""
        if reason not in self.failures:
            raise ValueError(f"unknown failure reason {reason!r}; expected one of {FAILURE_REASONS}")
        self.fail_count += 1
        self.fail_ns += request_ns
        self.failures[reason] += 1

    def record_execution(
        self, batch_size: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """Count one model execution of `batch_size` inferences."""
        self.inference_count += batch_size
        self.execution_count += 1
        entry = self._batches.get(batch_size)
        if entry is None:
            entry = self._batches[batch_size] = _BatchStats()
        entry.count += 1
        entry.compute_input_ns += compute_input_ns
        entry.compute_infer_ns += compute_infer_ns
        entry.compute_output_ns += compute_output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    # -- across processes (a front-end worker's instances, read by the core) ---------------------

    def publish(self, counters: np.ndarray, batches: bool = True) -> None:
        """Write every counter into `counters` (int64, `counters_length` long, shared with a reader);
        the per-batch-size ones only with `batches` (they change with executions alone).

        A reader may see one request's counters half written; the next read is whole again."""
        counters[:_HEAD] = (*[getattr(self, name) for name in _PUBLISHED], *self.failures.values())
        if not batches:
            return
        rows = (len(counters) - _HEAD) // 4
        for size, entry in self._batches.items():
            if size <= rows:
                start = _HEAD + 4 * (size - 1)
                counters[start : start + 4] = (
                    entry.count, entry.compute_input_ns, entry.compute_infer_ns, entry.compute_output_ns
                )  # fmt: skip

    @classmethod
    def from_counters(cls, counters: np.ndarray) -> ModelStats:
        """The statistics another process published into `counters`."""
        values = counters.tolist()
        stats = cls()
        for name, value in zip(_PUBLISHED, values):
            setattr(stats, name, value)
        stats.failures = dict(zip(FAILURE_REASONS, values[len(_PUBLISHED) : _HEAD]))
        for start in range(_HEAD, len(values), 4):
            if values[start]:
                entry = stats._batches[(start - _HEAD) // 4 + 1] = _BatchStats()
                entry.count, entry.compute_input_ns, entry.compute_infer_ns, entry.compute_output_ns = values[
                    start : start + 4
                ]
        return stats

    @classmethod
    def merged(cls, parts: Iterable[ModelStats]) -> ModelStats:
        """One version's statistics summed over the processes that ran it; the first part's load."""
        parts = list(parts)
        total = cls(parts[0].cache_enabled)
        total.load_id = parts[0].load_id
        for part in parts:
            for name in _SUMMED:
                setattr(total, name, getattr(total, name) + getattr(part, name))
            total.last_inference_ms = max(total.last_inference_ms, part.last_inference_ms)
            for reason, count in part.failures.items():
                total.failures[reason] += count
            for size, entry in part._batches.items():
                into = total._batches.get(size)
                if into is None:
                    into = total._batches[size] = _BatchStats()
                into.count += entry.count
                into.compute_input_ns += entry.compute_input_ns
                into.compute_infer_ns += entry.compute_infer_ns
                into.compute_output_ns += entry.compute_output_ns
        return total

    # -- readers (statistics endpoint, Prometheus) -----------------------------------------------

    @property
    def request_ns_total(self) -> int:
        """Cumulative time in the server of all finished requests (`nv_inference_request_duration_us`)."""
        return self.success_ns + self.fail_ns

    def to_dict(self, name: str, version: str, memory_usage: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One entry of `model_stats` in the statistics-extension JSON.

        `memory_usage` is the extension's list of `{"type": "CPU"|"CPU_PINNED"|"GPU", "id", "byte_size"}`
        (what the version's instances hold); it is not a statistic, so the caller supplies it.
        """
        n = self.success_count
        computed = n - self.cache_hit_count
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": _duration(n, self.success_ns),
                "fail": _duration(self.fail_count, self.fail_ns),
                "queue": _duration(n, self.queue_ns_total),
                "compute_input": _duration(computed, self.compute_input_ns_total),
                "compute_infer": _duration(computed, self.compute_infer_ns_total),
                "compute_output": _duration(computed, self.compute_output_ns_total),
                # Zeros without the response cache, as Triton's.
                "cache_hit": _duration(self.cache_hit_count, self.cache_hit_ns_total),
                "cache_miss": _duration(self.cache_miss_count, self.cache_miss_ns_total),
            },
            # Per-response statistics exist for decoupled models only; ours never are.
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": _duration(b.count, b.compute_input_ns),
                    "compute_infer": _duration(b.count, b.compute_infer_ns),
                    "compute_output": _duration(b.count, b.compute_output_ns),
                }
                for size, b in sorted(self._batches.items())
            ],
            "memory_usage": list(memory_usage or []),
        }
