"""perfkit.analysis.stats: windows, percentiles, stability, intervals and validity, on hand-built samples.

Every sample set is built from literal timestamps (ns): no clock, no sleeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from perfkit.analysis.stats import (
    is_stable,
    latency_stats,
    level_result,
    min_requests_for_percentile,
    percentile_ci,
    percentile_rank,
    reported_windows,
    spread,
    student_t_quantile,
    throughput_ci,
    validity_checks,
    window_result,
)
from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.results.model import LevelResult, ResourceUsage, ServerStats, WindowResult

MS = 1_000_000
S = 1_000_000_000


def arrays(rows: Sequence[tuple[Any, ...]]) -> SampleArrays:
    """(intended, sent, done[, error[, bytes_out, bytes_in, send_ns, recv_ns]]) rows."""
    buffer = SampleBuffer()
    for row in rows:
        buffer.record(*row)
    return buffer.arrays()


def window(tp: float, lat_us: float, ok: int = 10) -> WindowResult:
    return WindowResult(0, S, ok, ok, 0, tp, lat_us)


# -- percentiles -------------------------------------------------------------------------------


def test_percentile_rank_is_perf_analyzers_nearest_rank() -> None:
    values = np.arange(1, 11)  # 1..10, n = 10
    # index = int(p/100 * 9 + 0.5): p50 → int(5.0) = 5 → 6; p90 → int(8.6) = 8 → 9;
    # p95 → int(9.05) = 9 → 10; p99 → int(9.41) = 9 → 10; p0 → 1; p100 → 10; p25 → int(2.75) = 2 → 3.
    assert [percentile_rank(values, p) for p in (50, 90, 95, 99, 0, 100, 25)] == [6, 9, 10, 10, 1, 10, 3]
    assert percentile_rank(np.arange(1000), 99) == 989  # int(989.51)
    assert percentile_rank(np.arange(1000), 99.9) == 998  # int(998.501)
    assert percentile_rank([7], 99) == 7
    assert percentile_rank([], 50) == 0.0
    with pytest.raises(ValueError):
        percentile_rank(values, 101)


def test_latency_stats_in_microseconds() -> None:
    ns = np.array([4000, 1000, 3000, 2000], dtype=np.int64)  # unsorted on purpose
    st = latency_stats(ns, custom_percentile=75)
    assert (st.count, st.mean_us, st.min_us, st.max_us) == (4, 2.5, 1.0, 4.0)
    assert st.std_us == pytest.approx(math.sqrt(5 / 3))  # sample std of 1,2,3,4 µs (n − 1)
    # n − 1 = 3: p50 → int(2.0) = 2 → 3 µs; p90 → int(3.2) = 3 → 4 µs; p75 → int(2.75) = 2 → 3 µs
    assert (st.p50_us, st.p90_us, st.p95_us, st.p99_us, st.p999_us) == (3.0, 4.0, 4.0, 4.0, 4.0)
    assert (st.custom_percentile, st.custom_us) == (75, 3.0)
    one = latency_stats(np.array([5000]))
    assert (one.std_us, one.p99_us, one.custom_us) == (0.0, 5.0, None)


def test_latency_stats_of_nothing_is_zeros() -> None:
    st = latency_stats(np.array([], dtype=np.int64), custom_percentile=99.9)
    assert (st.count, st.mean_us, st.p99_us, st.p99_ci_high_us, st.custom_us) == (0, 0.0, 0.0, 0.0, 0.0)
    assert latency_stats(np.array([], dtype=np.int64)).custom_us is None


def test_percentile_ci_from_order_statistics() -> None:
    values = np.arange(1, 101)  # value = 1-based rank
    # n q = 50, 1.96·√25 = 9.8: ranks ⌊40.2⌋ = 40 and ⌈59.8⌉ + 1 = 61
    assert percentile_ci(values, 50) == (40.0, 61.0)
    ranks = np.arange(1, 1001)
    # n q = 990, 1.96·√9.9 = 6.167: ranks 983 and 997 + 1 = 998
    assert percentile_ci(ranks, 99) == (983.0, 998.0)
    st = latency_stats(ranks * 1000)
    assert (st.p99_ci_low_us, st.p99_us, st.p99_ci_high_us) == (983.0, 990.0, 998.0)
    # Too few samples to bound p99 from above: the upper bound clamps to the maximum.
    assert percentile_ci(np.arange(1, 51), 99) == (48.0, 50.0)
    assert percentile_ci([], 99) == (0.0, 0.0)


# -- windows -----------------------------------------------------------------------------------


def test_a_request_counts_in_the_window_where_it_completes() -> None:
    samples = arrays(
        [
            (0, 0, 100 * MS),  # window 1
            (900 * MS, 900 * MS, 1100 * MS),  # sent in window 1, completes in window 2
            (1200 * MS, 1200 * MS, 1300 * MS),  # window 2
            (1500 * MS, 1500 * MS, 2 * S),  # completes exactly at window 2's end: window 3
            (1600 * MS, 1600 * MS, 1700 * MS, "HTTP 503"),  # window 2, failed
        ]
    )
    w1 = window_result(samples, 0, S, batch_size=1)
    w2 = window_result(samples, S, 2 * S, batch_size=4)
    assert (w1.request_count, w1.ok_count, w1.throughput_infer_per_s, w1.stabilizing_latency_us) == (1, 1, 1.0, 100_000)
    assert (w2.request_count, w2.ok_count, w2.error_count) == (3, 2, 1)
    assert w2.throughput_infer_per_s == 8.0  # 2 ok × batch 4 / 1 s
    assert w2.stabilizing_latency_us == 150_000  # mean of 200 ms and 100 ms; the failure is left out
    assert window_result(samples, S, 2 * S, 1, stabilizing_percentile=99).stabilizing_latency_us == 200_000
    half = window_result(samples, S, S + 500 * MS, batch_size=1)  # 2 ok in 500 ms: 4 per second
    assert (half.ok_count, half.throughput_infer_per_s) == (2, 4.0)


def test_a_window_without_success_has_zero_throughput_and_infinite_latency() -> None:
    samples = arrays([(0, 0, 10 * MS, "timeout")])
    w = window_result(samples, 0, S, batch_size=1)
    assert (w.request_count, w.ok_count, w.throughput_infer_per_s, w.stabilizing_latency_us) == (1, 0, 0.0, math.inf)
    with pytest.raises(ValueError):
        window_result(samples, S, S, batch_size=1)


# -- stability ---------------------------------------------------------------------------------


def test_stability_is_perf_analyzers_rule() -> None:
    # perf_analyzer's own doctest cases (inference_profiler.cc test_check_window_for_stability)
    assert is_stable([window(500, 1), window(520, 1), window(510, 1)], 0.1)
    assert not is_stable([window(1, 1), window(1000, 1), window(500, 1)], 0.1)
    assert not is_stable([window(500, 1), window(520, 100), window(510, 50)], 0.1)
    # Ratios are compared as doubles, as current perf_analyzer does (older releases divided integers).
    assert is_stable([window(500, 45), window(520, 49), window(510, 45)], 0.1)  # 49/45 = 1.089
    assert not is_stable([window(500, 45), window(520, 50), window(510, 45)], 0.1)  # 50/45 = 1.111


def test_stability_boundaries_and_only_the_last_windows() -> None:
    assert is_stable([window(100, 10), window(110, 11), window(105, 10.5)], 0.1)  # exactly 1.1
    assert not is_stable([window(100, 10), window(110.001, 10), window(105, 10)], 0.1)
    assert not is_stable([window(100, 10), window(100, 10)], 0.1)  # fewer than 3
    early_noise = [window(1, 99), window(1000, 1), window(500, 10), window(500, 10), window(520, 10.2)]
    assert is_stable(early_noise, 0.1)
    assert is_stable(early_noise[-2:], 0.1, count=2)
    assert not is_stable([window(100, 10), window(0, math.inf, ok=0), window(100, 10)], 0.1)
    assert not is_stable([window(100, 10), window(100, 10), window(0, math.inf, ok=0)], 10.0)
    assert is_stable([window(100, 0), window(100, 0), window(100, 0)], 0.1)  # fake-clock zero latency
    assert spread([2.0, 0.0]) == math.inf and spread([3.0, 3.0]) == 1.0 and spread([math.inf] * 3) == math.inf


# -- intervals ---------------------------------------------------------------------------------


def test_student_t_quantiles_match_the_tables() -> None:
    for df, expected in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (29, 2.0452)]:
        assert student_t_quantile(0.95, df) == pytest.approx(expected, abs=1e-4)
    assert student_t_quantile(0.99, 2) == pytest.approx(9.9248, abs=1e-4)
    assert student_t_quantile(0.90, 5) == pytest.approx(2.0150, abs=1e-4)
    assert student_t_quantile(0.95, 100_000) == pytest.approx(1.95997, abs=1e-4)


def test_throughput_ci() -> None:
    low, high = throughput_ci([window(100, 1), window(110, 1), window(120, 1)])
    half = 4.302653 * 10 / math.sqrt(3)  # t(0.975, 2) · s / √n with s = 10
    assert low == pytest.approx(110 - half) and high == pytest.approx(110 + half)
    assert throughput_ci([window(42, 1)]) == (42, 42)
    assert throughput_ci([]) == (0.0, 0.0)
    assert throughput_ci([window(1, 1), window(100, 1)])[0] == 0.0  # floored


def test_reported_windows_are_the_last_three() -> None:
    ws = [window(i, 1) for i in range(1, 6)]
    assert reported_windows(ws) == tuple(ws[2:])
    assert reported_windows(ws[:2]) == tuple(ws[:2])


def test_minimum_requests_are_mlperfs_early_stopping_figures() -> None:
    assert min_requests_for_percentile(90) == 64
    assert min_requests_for_percentile(99) == 662
    assert min_requests_for_percentile(99.9) == 6636
    with pytest.raises(ValueError):
        min_requests_for_percentile(100)


# -- a whole level -----------------------------------------------------------------------------


def stall_samples() -> SampleArrays:
    """Rate mode, one request every 10 ms for 10 s; each takes 1 ms, except that the server stalls
    for 1 s on the request intended at 2.000 s. The generator cannot send during the stall and
    sends the 100 requests it missed (intended 2.01 .. 3.00 s) at 3.001 s, done 1 ms later."""
    rows: list[tuple[int, int, int]] = []
    for i in range(1000):
        intended = i * 10 * MS
        if i == 200:
            rows.append((intended, intended, 3001 * MS))
        elif 201 <= i <= 300:
            rows.append((intended, 3001 * MS, 3002 * MS))
        else:
            rows.append((intended, intended, intended + MS))
    return arrays(rows)


def test_coordinated_omission_service_vs_intended_latency() -> None:
    samples = stall_samples()
    windows = [window_result(samples, k * 4 * S, (k + 1) * 4 * S, 1) for k in range(3)]
    level = level_result(
        mode="request_rate", level=100.0, batch_size=1, windows=windows, samples=samples,
        server=None, resources=ResourceUsage(), stable=False,
    )  # fmt: skip
    assert level.request_count == 1000
    # Service latency hides the stall: one 1.001 s request among 999 of 1 ms.
    assert (level.latency.p99_us, level.latency.max_us) == (1000.0, 1_001_000.0)
    # From the intended time, the 100 late requests carry the stall: 0.992 s, 0.982 s, ... 0.002 s.
    # p99 is index 989 of 1000, the 11th largest: 1.001 s, then 0.992 − 0.01 k for k = 0..9 → 0.902 s.
    assert level.latency_from_intended.p99_us == 902_000.0
    assert level.latency_from_intended.max_us == 1_001_000.0
    # Lags: 3.001 − (2.01 + 0.01 k) s; the one intended at 3.000 s is exactly 1 ms late, not "more than".
    assert level.delayed_pct == pytest.approx(9.9)
    assert level.max_send_lag_us == 991_000.0
    schedule = next(c for c in level.checks if c.name == "schedule")
    assert not schedule.passed and "could not keep the schedule" in schedule.advice
    assert "--request-rate-range" in schedule.advice


def test_concurrency_mode_latencies_are_equal_and_not_judged_on_schedule() -> None:
    rows = [(t, t, t + 2 * MS, "", 100, 40, 10_000, 30_000) for t in range(0, 3 * S, 2 * MS)]
    samples = arrays(rows)
    ws = [window_result(samples, k * S, (k + 1) * S, 2) for k in range(3)]
    level = level_result(
        mode="concurrency", level=1, batch_size=2, windows=ws, samples=samples, server=None,
        resources=ResourceUsage(), stable=is_stable(ws, 0.1),
    )  # fmt: skip
    assert level.latency == level.latency_from_intended
    assert level.stable and level.delayed_pct == 0.0 and level.max_send_lag_us == 0.0
    assert "schedule" not in {c.name for c in level.checks}
    # 1500 requests complete in [0, 3 s): the one sent at 2.998 s completes at 3.000 s, outside.
    assert (level.request_count, level.duration_s) == (1499, 3.0)
    assert level.throughput_infer_per_s == pytest.approx(1499 * 2 / 3)
    assert level.send_rate_per_s == 500.0  # 1500 sent in the windows
    assert (level.client_send_us, level.client_recv_us, level.network_server_us) == (10.0, 30.0, 1960.0)
    assert (level.bytes_out_per_request, level.bytes_in_per_request) == (100.0, 40.0)


def test_level_result_counts_errors_and_uses_server_stats() -> None:
    rows: list[tuple[Any, ...]] = [(t, t, t + 10 * MS, "", 0, 0, 100_000, 200_000) for t in range(0, S, 10 * MS)]
    rows += [(0, 0, 5 * MS, "HTTP 503"), (0, 0, 6 * MS, "HTTP 503"), (0, 0, 7 * MS, "timeout")]
    samples = arrays(rows)
    server = ServerStats(success_count=100, queue_us=1000.0, compute_infer_us=5000.0, compute_output_us=500.0)
    level = level_result(
        mode="concurrency", level=1, batch_size=1, windows=[window_result(samples, 0, S + 10 * MS, 1)],
        samples=samples, server=server, resources=ResourceUsage(client_cpu_pct=95.0), stable=False,
        custom_percentile=90,
    )  # fmt: skip
    assert (level.request_count, level.ok_count, level.error_count) == (103, 100, 3)
    assert level.errors == {"HTTP 503": 2, "timeout": 1}
    assert level.latency.count == 100 and level.latency.custom_us == 10_000.0
    # 10 ms average − 0.1 send − 0.2 recv − (1 + 5 + 0.5) queue and compute = 3.2 ms
    assert level.network_server_us == pytest.approx(3200.0)
    checks = {c.name: c for c in level.checks}
    assert list(checks) == ["stable", "sample_count", "errors", "client_cpu", "duration"]
    assert not level.valid
    assert checks["errors"].detail == "3 of 103 requests failed: HTTP 503 × 2, timeout × 1"
    assert checks["sample_count"].passed  # judged on p90 (--percentile): 100 >= 64
    assert not checks["client_cpu"].passed and "client may be the bottleneck" in checks["client_cpu"].advice
    assert checks["duration"].passed and checks["duration"].advice == ""
    stable = checks["stable"]
    assert not stable.passed and stable.detail == "only 1 window(s) measured; stability needs 3"
    assert "--measurement-interval" in stable.advice and "--max-trials" in stable.advice
    assert "--stability-percentage" in stable.advice


def test_validity_checks_pass_with_empty_advice() -> None:
    rows = [(t, t, t + MS) for t in range(0, 3 * S, 4 * MS)]  # 750 requests
    samples = arrays(rows)
    ws = [window_result(samples, k * S, (k + 1) * S, 1) for k in range(3)]
    level = level_result(
        mode="request_rate", level=250, batch_size=1, windows=ws, samples=samples, server=None,
        resources=ResourceUsage(client_cpu_pct=20.0), stable=True,
    )  # fmt: skip
    assert level.valid, level.checks
    assert [c.name for c in level.checks] == ["stable", "sample_count", "errors", "schedule", "client_cpu", "duration"]
    assert all(c.advice == "" for c in level.checks)


def test_validity_checks_fail_with_advice() -> None:
    base = LevelResult(
        mode="request_rate", level=10, batch_size=1, stable=False, duration_s=0.5, request_count=100,
        ok_count=100, error_count=0, errors={}, throughput_infer_per_s=200, throughput_ci_low=0,
        throughput_ci_high=0, send_rate_per_s=200, latency=latency_stats(np.array([MS])),
        latency_from_intended=latency_stats(np.array([MS])), delayed_pct=1.5, max_send_lag_us=20_000,
        client_send_us=0, client_recv_us=0, network_server_us=0, server=None, resources=ResourceUsage(),
        windows=(window(100, 10), window(150, 10), window(100, 12)), checks=(),
    )  # fmt: skip
    checks = {c.name: c for c in validity_checks(base, stability_threshold=0.1)}
    assert list(checks) == ["stable", "sample_count", "errors", "schedule", "duration"]  # client CPU not measured
    assert (
        checks["stable"].detail == "the last 3 windows differ by 50.0% in throughput and 20.0% in latency (limit 10%)"
    )
    assert checks["sample_count"].detail.startswith("100 successful requests measured; a p99 needs 662")
    assert "--measurement-request-count 221" in checks["sample_count"].advice
    assert checks["errors"].passed
    assert checks["schedule"].detail == (
        "1.50% of requests were sent more than 1 ms late (limit 1%; largest lag 20.0 ms)"
    )
    assert "results understate latency" in checks["schedule"].advice
    assert not checks["duration"].passed and "--measurement-interval" in checks["duration"].advice
    assert all(c.advice for c in checks.values() if not c.passed)
    p90 = {c.name: c for c in validity_checks(base, percentile=90)}
    assert p90["sample_count"].passed


def test_level_records_every_window_but_reports_the_last_ones() -> None:
    samples = arrays([(t, t, t + MS) for t in range(0, 5 * S, 10 * MS)])  # 100 per second
    every = [window_result(samples, k * S, (k + 1) * S, 1) for k in range(5)]
    noisy = [WindowResult(0, S, 10, 10, 0, 10.0, 1000.0), *every[1:]]  # a slow first window
    level = level_result(
        mode="concurrency", level=1, batch_size=1, windows=reported_windows(noisy), samples=samples,
        server=None, resources=ResourceUsage(), stable=False, all_windows=noisy,
    )  # fmt: skip
    assert level.windows == tuple(noisy)
    assert (level.duration_s, level.request_count) == (3.0, 300)  # windows 3..5 only
    assert level.throughput_ci_low == level.throughput_ci_high == 100.0
    stable = next(c for c in level.checks if c.name == "stable")
    assert stable.detail == "the last 3 windows differ by 0.0% in throughput and 0.0% in latency (limit 10%)"


def test_late_sends_of_an_idle_client_are_blamed_on_the_machine_waking_late() -> None:
    """Sends a few ms late from a client using little CPU: the advice says the machine wakes its CPUs
    late, not that the client lacks CPU; a client that lagged by a stall, or that was busy, keeps
    the advice to lower the rate."""
    # 20 req/s for 3 s, every fifth send 3 ms late.
    rows = [(t, t + (3 * MS if i % 5 == 0 else 0), t + (3 * MS if i % 5 == 0 else 0) + 5 * MS)
            for i, t in enumerate(range(0, 3 * S, 50 * MS))]  # fmt: skip

    def schedule_advice(cpu: float | None, samples: SampleArrays, window_s: int) -> str:
        windows = [window_result(samples, k * window_s * S, (k + 1) * window_s * S, 1) for k in range(3)]
        level = level_result(
            mode="request_rate", level=20.0, batch_size=1, windows=windows, samples=samples, server=None,
            resources=ResourceUsage(client_cpu_pct=cpu), stable=True,
        )  # fmt: skip
        schedule = next(c for c in level.checks if c.name == "schedule")
        assert not schedule.passed, level.delayed_pct
        return schedule.advice

    few_ms_late = arrays(rows)
    assert "wakes its CPUs late" in schedule_advice(4.0, few_ms_late, 1)
    assert "could not keep the schedule" in schedule_advice(85.0, few_ms_late, 1)
    assert "could not keep the schedule" in schedule_advice(None, few_ms_late, 1)
    assert "could not keep the schedule" in schedule_advice(4.0, stall_samples(), 4)  # lags up to 991 ms
