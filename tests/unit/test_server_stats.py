"""perfkit.analysis.server_stats on literal statistics-extension JSON."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from perfkit.analysis.server_stats import counters_reset, network_server_us, pick_model_stats, server_diff
from perfkit.results.model import ServerStats


def d(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def entry(
    version: str,
    success: int,
    *,
    name: str = "mlp",
    us: int = 1000,
    inference_count: int | None = None,
    execution_count: int | None = None,
    batches: dict[int, int] | None = None,
) -> dict[str, Any]:
    """`success` requests averaging `us` µs in the server: 1/10 queue, 1/20 input, 7/10 infer, 1/20 output."""
    ns = us * 1000
    return {
        "name": name,
        "version": version,
        "last_inference": 1_700_000_000_000,
        "inference_count": success if inference_count is None else inference_count,
        "execution_count": success if execution_count is None else execution_count,
        "inference_stats": {
            "success": d(success, success * ns),
            "fail": d(0, 0),
            "queue": d(success, success * ns // 10),
            "compute_input": d(success, success * ns // 20),
            "compute_infer": d(success, success * ns * 7 // 10),
            "compute_output": d(success, success * ns // 20),
            "cache_hit": d(0, 0),
            "cache_miss": d(0, 0),
        },
        "response_stats": {},
        "batch_stats": [
            {"batch_size": size, "compute_input": d(n, n), "compute_infer": d(n, n * 10), "compute_output": d(n, n)}
            for size, n in sorted((batches or {}).items())
        ],
        "memory_usage": [],
    }


def response(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"model_stats": list(entries)}


# -- picking the entry -------------------------------------------------------------------------


def test_pick_by_name_and_explicit_version() -> None:
    stats = response(entry("1", 5), entry("2", 7), entry("1", 9, name="other"))
    picked = pick_model_stats(stats, "mlp", "1")
    assert picked is not None and picked["inference_count"] == 5
    assert pick_model_stats(stats, "mlp", "3") is None
    assert pick_model_stats(stats, "absent") is None
    assert pick_model_stats({}, "mlp") is None


def test_pick_without_version_is_the_one_whose_queue_moved() -> None:
    before = response(entry("1", 5), entry("2", 7), entry("10", 3))
    after = response(entry("1", 15), entry("2", 7), entry("10", 3))
    picked = pick_model_stats(after, "mlp", previous=before)
    assert picked is not None and picked["version"] == "1"
    # Several moved: the highest of those (perf_analyzer warns and does the same).
    both = response(entry("1", 15), entry("2", 8), entry("10", 3))
    assert pick_model_stats(both, "mlp", previous=before)["version"] == "2"  # type: ignore[index]
    # None moved, or nothing to compare with: the highest version, numerically ("10" > "2").
    assert pick_model_stats(before, "mlp", previous=before)["version"] == "10"  # type: ignore[index]
    assert pick_model_stats(after, "mlp")["version"] == "10"  # type: ignore[index]
    # A version that appeared since `previous` moved from nothing.
    grown = response(entry("1", 5), entry("2", 7), entry("10", 3), entry("3", 1))
    assert pick_model_stats(grown, "mlp", previous=before)["version"] == "3"  # type: ignore[index]


def test_pick_with_the_last_picked_entry_as_previous() -> None:
    after = response(entry("1", 15), entry("2", 7))
    # Only version 1 can be judged: it moved, so it is picked although 2 is higher.
    assert pick_model_stats(after, "mlp", previous=entry("1", 5))["version"] == "1"  # type: ignore[index]
    # It did not move, and the others cannot be judged: the highest version.
    assert pick_model_stats(after, "mlp", previous=entry("1", 15))["version"] == "2"  # type: ignore[index]


# -- differences -------------------------------------------------------------------------------


def test_server_diff_of_two_snapshots() -> None:
    before = entry("1", 100, us=1000, inference_count=400, execution_count=100, batches={4: 100})
    after = entry("1", 300, us=1000, inference_count=1400, execution_count=300, batches={2: 50, 4: 200, 8: 50})
    # Make the new 200 requests slower: 2000 µs each, so the phase averages double.
    for phase, stat in after["inference_stats"].items():
        if stat["count"]:
            stat["ns"] = before["inference_stats"][phase]["ns"] + 2 * (
                stat["ns"] - before["inference_stats"][phase]["ns"]
            )
    after["inference_stats"]["fail"] = d(3, 9_000_000)
    s = server_diff(before, after)
    assert (s.success_count, s.fail_count, s.inference_count, s.execution_count) == (200, 3, 1000, 200)
    assert s.avg_batch_size == 5.0
    assert s.request_us == pytest.approx(2000.0)
    assert (s.queue_us, s.compute_input_us, s.compute_infer_us, s.compute_output_us) == pytest.approx(
        (200.0, 100.0, 1400.0, 100.0)
    )
    assert s.overhead_us == pytest.approx(200.0)  # 2000 − 200 − 100 − 1400 − 100
    assert s.batch_sizes == {2: 50, 4: 100, 8: 50}


def test_server_diff_floors_overhead_and_tolerates_missing_fields() -> None:
    after = {
        "name": "m",
        "version": "1",
        "inference_stats": {"success": d(2, 1000), "queue": d(2, 4000), "compute_infer": {"count": "2", "ns": "600"}},
    }
    s = server_diff({}, after)
    assert (s.success_count, s.request_us, s.queue_us, s.compute_infer_us, s.compute_input_us) == (
        2,
        0.5,
        2.0,
        0.3,
        0.0,
    )
    assert s.overhead_us == 0.0  # 0.5 − 2.0 − 0.3 < 0
    assert (s.inference_count, s.execution_count, s.avg_batch_size, s.batch_sizes) == (0, 0, 0.0, {})
    assert server_diff(None, {}) == ServerStats()


def test_counters_going_backwards_count_from_the_reload() -> None:
    before = entry("1", 1000, batches={1: 1000})
    after = entry("1", 40, batches={1: 40})  # reloaded, then 40 requests
    assert counters_reset(before, after)
    assert not counters_reset(after, copy.deepcopy(after))
    s = server_diff(before, after)
    assert (s.success_count, s.request_us, s.batch_sizes) == (40, 1000.0, {1: 40})


# -- network + server --------------------------------------------------------------------------


def test_network_server_is_latency_less_client_and_server_parts() -> None:
    server = ServerStats(queue_us=100.0, compute_input_us=20.0, compute_infer_us=700.0, compute_output_us=30.0)
    assert network_server_us(1500.0, 50.0, 150.0, server) == pytest.approx(450.0)
    assert network_server_us(500.0, 50.0, 150.0, server) == 0.0  # floored, as perf_analyzer
