"""ModelStats: the statistics-extension JSON and the cumulative counters behind Prometheus."""

from __future__ import annotations

import time

import pytest

from reference_server.scheduling.stats import FAILURE_REASONS, ModelStats


def test_empty_stats_have_the_extension_shape() -> None:
    d = ModelStats().to_dict("simple", "1")
    zero = {"count": 0, "ns": 0}
    assert d == {
        "name": "simple",
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {
            "success": zero,
            "fail": zero,
            "queue": zero,
            "compute_input": zero,
            "compute_infer": zero,
            "compute_output": zero,
            "cache_hit": zero,
            "cache_miss": zero,
        },
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }


def test_one_batch_of_two_requests() -> None:
    stats = ModelStats()
    before_ms = time.time_ns() // 1_000_000
    # One execution of batch size 3 (requests of dim 0 = 1 and 2): both requests record the same
    # compute durations, as in Triton.
    stats.record_execution(3, 10, 100, 20)
    stats.record_success(1000, 300, 10, 100, 20)
    stats.record_success(1500, 700, 10, 100, 20)
    d = stats.to_dict("m", "2")
    assert d["inference_count"] == 3
    assert d["execution_count"] == 1
    assert d["last_inference"] >= before_ms
    s = d["inference_stats"]
    assert s["success"] == {"count": 2, "ns": 2500}
    assert s["queue"] == {"count": 2, "ns": 1000}
    assert s["compute_input"] == {"count": 2, "ns": 20}
    assert s["compute_infer"] == {"count": 2, "ns": 200}
    assert s["compute_output"] == {"count": 2, "ns": 40}
    assert d["batch_stats"] == [
        {
            "batch_size": 3,
            "compute_input": {"count": 1, "ns": 10},
            "compute_infer": {"count": 1, "ns": 100},
            "compute_output": {"count": 1, "ns": 20},
        }
    ]


def test_batch_stats_accumulate_per_size_in_ascending_order() -> None:
    stats = ModelStats()
    stats.record_execution(8, 1, 2, 3)
    stats.record_execution(1, 1, 1, 1)
    stats.record_execution(8, 1, 2, 3)
    d = stats.to_dict("m", "1")
    assert d["inference_count"] == 17
    assert d["execution_count"] == 3
    assert [b["batch_size"] for b in d["batch_stats"]] == [1, 8]
    assert d["batch_stats"][1]["compute_infer"] == {"count": 2, "ns": 4}


def test_failures_count_by_reason_and_add_to_request_time() -> None:
    stats = ModelStats()
    stats.record_success(100, 10, 1, 1, 1)
    stats.record_failure(40, "REJECTED")
    stats.record_failure(60, "BACKEND")
    stats.record_failure(5, "BACKEND")
    assert stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    assert set(stats.failures) == set(FAILURE_REASONS)
    assert stats.to_dict("m", "1")["inference_stats"]["fail"] == {"count": 3, "ns": 105}
    # nv_inference_request_duration_us counts successes and failures alike.
    assert stats.request_ns_total == 205
    assert stats.queue_ns_total == 10
    with pytest.raises(ValueError, match="unknown failure reason"):
        stats.record_failure(1, "TIMEOUT")


def test_pending_is_a_plain_gauge() -> None:
    stats = ModelStats()
    stats.pending += 3
    stats.pending -= 1
    assert stats.pending == 2


def test_stats_use_slots() -> None:
    with pytest.raises(AttributeError):
        ModelStats().typo = 1  # type: ignore[attr-defined]
