"""Per model-version statistics, in the shape of Triton's statistics extension.

One `ModelStats` per loaded model version. The scheduler is its only writer and it writes from the
event-loop thread, so plain ints suffice: no locks, no atomics. Readers (the statistics endpoint
and the Prometheus collector) run on the same loop and see a consistent snapshot.

Triton semantics kept here (server docs/protocol/extension_statistics.md, core
src/infer_stats.cc):

- *Per request*: `success`, `fail`, `queue` and the three `compute_*` durations. The compute
  durations of a request are those of the batch execution it was part of, so in a batch of 8
  every request adds the same compute time. `success.ns` is the request's whole time in the
  server; `queue.count` and `compute_*.count` therefore equal `success.count`.
- *Per execution*: `inference_count` grows by the batch size, `execution_count` by one, and
  `batch_stats[batch_size]` accumulates the compute phases of that execution once.
- All counters are cumulative since load; clients difference two samples.
"""

from __future__ import annotations

import time
from typing import Any, Final

#: Failure reasons Triton attaches to `nv_inference_request_failure` (core src/metric_model_reporter.cc).
FAILURE_REASONS: Final = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


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
        "_batches",
    )

    def __init__(self) -> None:
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
                "compute_input": _duration(n, self.compute_input_ns_total),
                "compute_infer": _duration(n, self.compute_infer_ns_total),
                "compute_output": _duration(n, self.compute_output_ns_total),
                # No response cache: Triton reports zeros when caching is off.
                "cache_hit": _duration(0, 0),
                "cache_miss": _duration(0, 0),
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
