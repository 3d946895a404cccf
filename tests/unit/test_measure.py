"""perfkit.measure.level on virtual time: windows, stability, warm-up, count windows, server statistics and
coordinated omission, each with a scripted client and exact expectations. No sleeps: a FakeClock
level of several virtual seconds runs in milliseconds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from perfkit.errors import ExitCode
from perfkit.load.generator import CANCELLED_AT_DRAIN, FakeClock, LoadGenerator
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, Load, OpenLoop
from perfkit.measure.level import (
    POLL_NS,
    LevelMeasurement,
    ServerStatsProbe,
    WindowSpec,
    joined_in_pairs,
    measure_level,
    server_gone,
)
from perfkit.results.model import SweepResult, sweep_from_json, sweep_to_json
from perfkit.sweep.run import exit_code
from tests.fakes import FakeClient, FakePrepared, NeverAnswering

MS = 1_000_000
S = 1_000_000_000


class RecordingProgress:
    def __init__(self) -> None:
        self.windows: list[tuple[float, int, int, float, float, bool]] = []
        self.notes: list[str] = []

    def window_done(
        self, level: float, window_index: int, max_trials: int, throughput: float, latency_us: float, stable: bool
    ) -> None:
        self.windows.append((level, window_index, max_trials, throughput, latency_us, stable))

    def note(self, text: str) -> None:
        self.notes.append(text)


async def measure(
    latency: Callable[[int, int], int],
    load: Load,
    spec: WindowSpec,
    *,
    clock: FakeClock | None = None,
    error: Callable[[int], str] = lambda index: "",
    **kwargs: Any,
) -> tuple[LevelMeasurement, FakeClient]:
    clock = FakeClock() if clock is None else clock
    client = FakeClient(clock, latency, error)
    loadgen = LoadGenerator(client, [FakePrepared("a"), FakePrepared("b")], SampleBuffer(), clock)
    return await measure_level(loadgen, load, spec, batch_size=1, **kwargs), client


def per_window(a: int, b: int) -> Callable[[int, int], int]:
    """Service time `a` ms for requests sent in even seconds, `b` ms in odd ones."""
    return lambda now, index: (a if (now // S) % 2 == 0 else b) * MS


async def test_constant_latency_is_stable_after_three_contiguous_windows() -> None:
    progress = RecordingProgress()
    m, client = await measure(lambda now, i: 10 * MS, ClosedLoop(2), WindowSpec(interval_ms=1000), progress=progress)
    r = m.result
    assert m.window_boundaries_ns == (0, S, 2 * S, 3 * S)
    assert [(w.start_ns, w.end_ns) for w in r.windows] == [(0, S), (S, 2 * S), (2 * S, 3 * S)]
    # A request counts where it completes: the first window misses the 10 ms before the first
    # completion (done at 10, 20, ..., 990 ms per worker); the one done at 1000 ms is in window 2.
    assert [w.ok_count for w in r.windows] == [198, 200, 200]
    assert [w.throughput_infer_per_s for w in r.windows] == [198.0, 200.0, 200.0]
    assert r.stable and r.valid is False  # 598 samples are too few for a p99 (662)
    assert r.duration_s == 3.0
    assert r.request_count == r.ok_count == r.latency.count == 598
    assert r.throughput_infer_per_s == 598 / 3
    assert r.error_count == 0 and r.errors == {}
    lat = r.latency
    assert (lat.mean_us, lat.std_us, lat.min_us, lat.max_us) == (10_000.0, 0.0, 10_000.0, 10_000.0)
    assert (lat.p50_us, lat.p90_us, lat.p95_us, lat.p99_us, lat.p999_us) == (10_000.0,) * 5
    assert r.latency_from_intended == lat  # closed loop: intended == sent
    assert r.delayed_pct == 0.0
    # The 2 requests in flight when the level ended were drained and recorded (done at 3 s).
    assert len(m.samples) == 600 == len(client.sent)
    assert client.max_in_flight == 2
    assert [(i, stable) for _, i, _, _, _, stable in progress.windows] == [(0, False), (1, False), (2, True)]
    assert progress.windows[0] == (2.0, 0, 10, 198.0, 10_000.0, False)


async def test_warmup_requests_are_sent_but_not_counted() -> None:
    m, client = await measure(
        lambda now, i: 10 * MS, ClosedLoop(2), WindowSpec(interval_ms=1000, warmup_request_count=2)
    )
    r = m.result
    # The warm-up is polled every POLL_NS: it sees its 2 completions (at 10 ms) at the 20 ms poll.
    assert POLL_NS == 10 * MS
    assert m.window_boundaries_ns == (20 * MS, 1020 * MS, 2020 * MS, 3020 * MS)
    assert [w.ok_count for w in r.windows] == [200, 200, 200]
    assert r.throughput_infer_per_s == 200.0
    warmup = m.samples.done_ns < m.window_boundaries_ns[0]
    assert int(warmup.sum()) == 2
    assert m.samples.done_ns[warmup].tolist() == [10 * MS, 10 * MS]
    # Everything sent: 2 warm-up + 600 measured + 2 drained at the end.
    assert len(client.sent) == len(m.samples) == 604
    assert r.request_count == 600


async def test_a_level_that_never_stabilises_is_kept_and_flagged() -> None:
    spec = WindowSpec(interval_ms=1000, max_trials=6)
    m, _ = await measure(per_window(10, 20), ClosedLoop(2), spec)
    r = m.result
    assert len(r.windows) == spec.max_trials
    assert [w.ok_count for w in r.windows] == [198, 100, 200, 100, 200, 100]
    assert r.stable is False and r.valid is False
    stable_check = next(c for c in r.checks if c.name == "stable")
    assert not stable_check.passed
    assert "100.0% in throughput" in stable_check.detail
    assert "-p" in stable_check.advice and "-r" in stable_check.advice and "-s" in stable_check.advice
    # The figures are still reported, from the last 3 windows.
    assert r.duration_s == 3.0
    assert r.ok_count == 100 + 200 + 100
    assert r.throughput_infer_per_s == 400 / 3


async def test_count_windows_wait_for_the_request_count_and_at_least_one_second() -> None:
    many, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(mode="count_windows", request_count=250))
    # 100 requests/s: 250 completions take 2.5 s, and 2.51 s in the first window, whose first
    # completion comes 10 ms after it starts. Each window ends at the first 10 ms poll that sees
    # its 250 completions.
    assert many.window_boundaries_ns == (0, 2510 * MS, 5010 * MS, 7510 * MS)
    assert [w.ok_count for w in many.result.windows] == [250, 250, 250]
    assert many.result.stable

    few, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(mode="count_windows", request_count=50))
    # 50 requests come in 0.5 s, but a window lasts at least 1 s (perf_analyzer's rule).
    assert few.window_boundaries_ns == (0, S, 2 * S, 3 * S)
    assert [w.ok_count for w in few.result.windows] == [99, 100, 100]


def fake_statistics(clock: FakeClock, calls: list[int]) -> Callable[[], Any]:
    """The statistics extension of a server that completes exactly one inference per virtual ms,
    each queued 0.5 ms and computed 1.5 ms, in batches of 2."""

    async def fetch() -> dict[str, Any]:
        n = clock.now_ns() // MS
        calls.append(n)

        def d(count: int, ns_each: int) -> dict[str, int]:
            return {"count": count, "ns": count * ns_each}

        entry = {
            "name": "m", "version": "1", "inference_count": n, "execution_count": n // 2,
            "inference_stats": {
                "success": d(n, 2 * MS), "fail": d(0, 0), "queue": d(n, MS // 2),
                "compute_input": d(n, 0), "compute_infer": d(n, 3 * MS // 2), "compute_output": d(n, 0),
            },
            "batch_stats": [{"batch_size": 2, "compute_infer": d(n // 2, 3 * MS)}],
        }  # fmt: skip
        other = {"name": "other", "version": "1", "inference_count": 10**9}
        return {"model_stats": [other, entry]}

    return fetch


async def test_server_statistics_cover_exactly_the_reported_windows() -> None:
    calls: list[int] = []
    clock = FakeClock()
    probe = ServerStatsProbe(fake_statistics(clock, calls), "m", "")
    # 10 ms for two seconds, then 20 ms: windows 1-2 differ from 3-5, so 5 windows are measured
    # and the last 3 (2 s to 5 s) are reported.
    m, _ = await measure(
        lambda now, i: (10 if now < 2 * S else 20) * MS, ClosedLoop(2), WindowSpec(interval_ms=1000),
        clock=clock, server=probe,
    )  # fmt: skip
    r = m.result
    assert len(r.windows) == 5 and r.stable
    assert calls == [0, 1000, 2000, 3000, 4000, 5000]  # one snapshot at every window boundary
    server = r.server
    assert server is not None
    assert server.success_count == server.inference_count == 3000  # 2 s .. 5 s, not 0 .. 5 s
    assert server.execution_count == 1500 and server.avg_batch_size == 2.0
    assert (server.request_us, server.queue_us, server.compute_infer_us) == (2000.0, 500.0, 1500.0)
    assert server.overhead_us == 0.0
    assert server.batch_sizes == {2: 1500}
    assert r.resources.notes == ()
    assert probe.note == ""


async def test_a_failing_statistics_fetch_leaves_server_figures_out_with_a_note() -> None:
    calls: list[int] = []

    async def fetch() -> dict[str, Any]:
        calls.append(0)
        raise ConnectionError("statistics extension not offered")

    probe = ServerStatsProbe(fetch, "m", "")
    m, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(interval_ms=1000), server=probe)
    assert m.result.stable
    assert len(calls) == 4  # still asked at every boundary, never raised
    assert m.result.server is None
    assert m.result.resources.notes == ("no server-side statistics: statistics extension not offered",)
    # Without server figures the client's own split is used.
    assert m.result.network_server_us == m.result.latency.mean_us


async def test_statistics_without_the_model_give_no_server_figures() -> None:
    async def fetch() -> dict[str, Any]:
        return {"model_stats": [{"name": "other", "version": "1"}]}

    m, _ = await measure(
        lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(interval_ms=1000), server=ServerStatsProbe(fetch, "m", "")
    )
    assert m.result.server is None


class FreezingClock(FakeClock):
    """A FakeClock whose event loop can be frozen: nothing runs until the clock reads `until`, as when
    the client's process is descheduled or stops for a garbage collection."""

    def freeze(self, until_ns: int) -> None:
        self._now = max(self._now, until_ns)


async def test_open_loop_reports_latency_from_the_intended_send_time_when_sends_are_late() -> None:
    clock = FreezingClock()

    async def freeze() -> None:
        await clock.sleep_until(1502 * MS)
        clock.freeze(1802 * MS)

    freezer = asyncio.get_running_loop().create_task(freeze())
    m, client = await measure(
        lambda now, i: 5 * MS, OpenLoop(rate=100.0), WindowSpec(interval_ms=1000, max_trials=3, stability_pct=100),
        clock=clock,
    )  # fmt: skip
    await freezer
    r = m.result
    assert r.mode == "request_rate" and r.level == 100.0
    assert [w.ok_count for w in r.windows] == [99, 100, 100]
    assert r.stable
    s = m.samples
    lag = s.sent_ns - s.intended_ns
    late = lag > MS
    # The 30 sends due at 1510 .. 1800 ms all left at 1802 ms, once the loop ran again.
    assert s.intended_ns[late].tolist() == [(1510 + 10 * k) * MS for k in range(30)]
    assert np.all(s.sent_ns[late] == 1802 * MS)
    assert r.request_count == 299
    assert r.delayed_pct == 100 * 30 / 299
    assert r.max_send_lag_us == 292_000.0
    # Service latency hides the freeze (one request, in flight across it, took 302 ms); latency
    # from the intended send charges it to every request that should have left during it.
    assert (r.latency.p50_us, r.latency.p99_us, r.latency.max_us) == (5000.0, 5000.0, 302_000.0)
    assert r.latency_from_intended.p99_us == 277_000.0
    assert r.latency_from_intended.p99_us > 50 * r.latency.p99_us
    schedule = next(c for c in r.checks if c.name == "schedule")
    assert not schedule.passed and "10.03% of requests were sent more than 1 ms late" in schedule.detail
    assert len(client.sent) == len(s)


async def test_request_errors_are_counted_by_kind_and_left_out_of_latency() -> None:
    m, _ = await measure(
        lambda now, i: 10 * MS, ClosedLoop(1), WindowSpec(interval_ms=1000),
        error=lambda i: "HTTP 503" if i % 5 == 4 else ("timeout" if i % 50 == 7 else ""),
    )  # fmt: skip
    r = m.result
    counted = m.samples.select((m.samples.done_ns >= 0) & (m.samples.done_ns < 3 * S))
    assert len(counted) == 299 and counted.error_counts() == {"HTTP 503": 59, "timeout": 6}
    # The 300th request (a 503) ended at 3 s, after the last window: an error of the level all the same.
    assert r.request_count == len(m.samples) == 300 and (r.late_count, r.late_ok_count) == (1, 0)
    assert r.errors == m.samples.error_counts() == {"HTTP 503": 60, "timeout": 6}
    assert r.error_count == 66 and r.ok_count == 299 - 65
    assert r.throughput_infer_per_s == (299 - 65) / 3
    assert r.latency.count == r.ok_count
    errors = next(c for c in r.checks if c.name == "errors")
    assert not errors.passed
    assert "66 of 300 requests failed: HTTP 503 × 60, timeout × 6 (1 after the last window)" in errors.detail


async def test_a_second_load_on_the_same_generator_reports_only_its_own_samples() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 10 * MS)
    buffer = SampleBuffer()
    loadgen = LoadGenerator(client, [FakePrepared("a")], buffer, clock)
    first = await measure_level(loadgen, ClosedLoop(1), WindowSpec(interval_ms=1000), batch_size=1)
    second = await measure_level(loadgen, ClosedLoop(2), WindowSpec(interval_ms=1000), batch_size=4)
    assert first.result.level == 1.0 and second.result.level == 2.0
    assert len(first.samples) + len(second.samples) == len(buffer)
    assert second.window_boundaries_ns[0] == first.window_boundaries_ns[-1]
    assert second.result.throughput_infer_per_s == 4 * 598 / 3  # batch size 4


@pytest.mark.parametrize("percentile", [None, 90.0])
async def test_the_stabilising_latency_is_the_mean_or_the_percentile(percentile: float | None) -> None:
    # Every 10th request takes 50 ms: the mean moves, p90 stays at 10 ms.
    m, _ = await measure(
        lambda now, i: (50 if i % 10 == 9 else 10) * MS, ClosedLoop(1), WindowSpec(interval_ms=1000,
        percentile=percentile),
    )  # fmt: skip
    latencies = {w.stabilizing_latency_us for w in m.result.windows}
    if percentile is None:
        assert all(v > 10_000.0 for v in latencies)
        assert m.result.latency.custom_us is None
    else:
        assert latencies == {10_000.0}
        assert m.result.latency.custom_us == 10_000.0


def test_a_level_of_connection_failures_or_timeouts_means_the_server_is_gone() -> None:
    assert server_gone({"connection refused": 3, "grpc UNAVAILABLE": 1}, 0)
    assert server_gone({"timeout": 5, "disconnected": 1}, 0)
    assert not server_gone({"timeout": 5}, 0, timeouts=False)  # a window's rule: timeouts alone keep measuring
    assert not server_gone({"connection refused": 3}, 1)  # one answer: the server is there
    assert not server_gone({"HTTP 500": 3}, 0)
    assert not server_gone({}, 0)  # nothing completed: nothing to tell


@pytest.mark.parametrize("load", [ClosedLoop(3), OpenLoop(rate=200.0)], ids=["concurrency", "rate"])
async def test_request_count_sends_that_many_and_measures_them_as_one_stable_window(load: Load) -> None:
    spec = WindowSpec(request_limit=50, warmup_request_count=10, interval_ms=100)
    m, client = await measure(lambda now, i: 4_000_000, load, spec)
    assert len(client.sent) == 60  # warm-up + count, nothing more
    (window,) = m.result.windows
    assert m.result.request_count == 50 and m.result.stable
    sends = sorted(t for t, _ in client.sent)[10:]
    assert (window.start_ns, window.end_ns) == (sends[0], max(sends) + 4_000_000 + 1)


# Lengthened windows: a level whose -r windows did not agree goes on with windows twice as long.


async def test_a_level_that_swings_every_second_stabilises_on_lengthened_windows() -> None:
    progress = RecordingProgress()
    spec = WindowSpec(interval_ms=1000, max_trials=4, lengthenings=2)
    m, _ = await measure(per_window(10, 20), ClosedLoop(2), spec, progress=progress)
    r = m.result
    # 4 windows of 1 s swing 2:1; joined in pairs they are 2 windows of 2 s, and one more of 2 s
    # makes the 3 that agree: 6 s in all, no window measured twice.
    assert len(progress.windows) == 5
    assert m.window_boundaries_ns == (0, 2 * S, 4 * S, 6 * S)
    assert [(w.start_ns, w.end_ns) for w in r.windows] == [(0, 2 * S), (2 * S, 4 * S), (4 * S, 6 * S)]
    assert [w.ok_count for w in r.windows] == [298, 300, 300]
    assert r.stable and r.duration_s == 6.0 and r.ok_count == 898
    check = next(c for c in r.checks if c.name == "stable")
    assert check.passed
    assert "windows lengthened from 1 s to 2 s (4 of 1 s did not agree)" in check.detail
    (note,) = progress.notes
    assert note.startswith("concurrency 2: 4 windows of 1 s did not agree within 10% (last 3: throughput 100%")
    assert "lengthening the windows to 2 s" in note and "(1 of --window-lengthenings 2)" in note


async def test_joined_windows_that_agree_end_the_level_without_measuring_more() -> None:
    progress = RecordingProgress()
    m, _ = await measure(per_window(10, 20), ClosedLoop(2), WindowSpec(interval_ms=1000, max_trials=6, lengthenings=1),
                         progress=progress)  # fmt: skip
    assert len(progress.windows) == 6  # six windows of 1 s measured, none after
    assert m.window_boundaries_ns == (0, 2 * S, 4 * S, 6 * S)
    assert m.result.stable and [w.ok_count for w in m.result.windows] == [298, 300, 300]


async def test_without_lengthenings_the_level_ends_unstable_after_max_trials_as_perf_analyzer() -> None:
    m, _ = await measure(per_window(10, 20), ClosedLoop(2), WindowSpec(interval_ms=1000, max_trials=4))
    assert not m.result.stable and len(m.result.windows) == 4
    assert "lengthened" not in next(c for c in m.result.checks if c.name == "stable").detail


def drifting(now: int, index: int) -> int:
    """Service time that keeps growing (10 ms, +10 ms every second): no window length agrees."""
    return (10 + 10 * now // S) * MS


async def test_lengthening_is_bounded_by_its_count() -> None:
    progress = RecordingProgress()
    spec = WindowSpec(interval_ms=1000, max_trials=4, lengthenings=2)
    m, _ = await measure(drifting, ClosedLoop(1), spec, progress=progress)
    r = m.result
    # 4 x 1 s, then 2 more of 2 s, then 2 more of 4 s: -r x -p x 2^lengthenings = 16 s at most.
    assert m.window_boundaries_ns == (0, 4 * S, 8 * S, 12 * S, 16 * S)
    assert not r.stable and len(progress.notes) == 2 and len(progress.windows) == 4 + 2 + 2
    check = next(c for c in r.checks if c.name == "stable")
    assert "windows lengthened from 1 s to 4 s (4 of 1 s and 4 of 2 s did not agree)" in check.detail
    assert "--window-lengthenings 2 allows no more" in check.detail
    assert "--window-lengthenings N" in check.advice


async def test_lengthening_stops_before_a_window_would_pass_the_cap() -> None:
    progress = RecordingProgress()
    spec = WindowSpec(interval_ms=10_000, max_trials=3, lengthenings=3)
    m, _ = await measure(drifting, ClosedLoop(1), spec, progress=progress)
    # 10 s windows double once to 20 s; 40 s would pass MAX_LENGTHENED_WINDOW_S (30 s).
    assert len(progress.notes) == 1
    assert {w.end_ns - w.start_ns for w in m.result.windows} == {20 * S}
    assert "a longer window would pass 30 s" in next(c for c in m.result.checks if c.name == "stable").detail


async def test_count_windows_lengthen_by_doubling_the_count_and_the_minimum_second() -> None:
    progress = RecordingProgress()
    spec = WindowSpec(mode="count_windows", request_count=50, max_trials=4, lengthenings=1)
    m, _ = await measure(per_window(10, 20), ClosedLoop(2), spec, progress=progress)
    assert m.result.stable
    assert "lengthening the windows to 100 requests" in progress.notes[0]
    # Every window after the joined ones waited for 100 answers and 2 s.
    assert all(w.end_ns - w.start_ns >= 2 * S and w.ok_count >= 100 for w in m.result.windows)


async def test_a_level_whose_requests_all_fail_is_not_lengthened() -> None:
    progress = RecordingProgress()
    spec = WindowSpec(interval_ms=1000, max_trials=3, lengthenings=2)
    m, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(1), spec, error=lambda i: "HTTP 500", progress=progress)
    assert progress.notes == [] and len(m.result.windows) == 3 and not m.result.stable


def test_joining_keeps_every_other_edge_counted_back_from_the_last() -> None:
    assert joined_in_pairs([0, 1, 2, 3, 4]) == [0, 2, 4]  # 4 windows -> 2
    assert joined_in_pairs([0, 1, 2, 3]) == [1, 3]  # 3 windows -> 1, the oldest left out
    assert joined_in_pairs([0, 1]) == [1]


# A stalled model: every request fails 10 s after it was sent, in the server's words, long after the
# level's windows (3 x 0.2 s) have closed: its failures arrive only while the level drains.
STALLED = "HTTP 500: execute() did not return within 0.3 s"


async def test_requests_that_fail_after_the_last_window_are_errors_of_their_level() -> None:
    spec = WindowSpec(interval_ms=200, max_trials=3)
    m, client = await measure(lambda now, i: 10 * S, ClosedLoop(4), spec, error=lambda i: STALLED)
    r = m.result
    assert [w.request_count for w in r.windows] == [0, 0, 0]  # nothing ended inside a window
    assert len(client.sent) == len(m.samples) == 4
    assert (r.error_count, r.errors, r.ok_count, r.request_count) == (4, {STALLED: 4}, 0, 4)
    assert (r.late_count, r.late_ok_count) == (4, 0)
    assert r.latency.count == 0 and r.throughput_infer_per_s == 0.0  # window figures: measured windows only
    errors = next(c for c in r.checks if c.name == "errors")
    assert not errors.passed and f"4 of 4 requests failed: {STALLED} × 4" in errors.detail
    assert "4 after the last window" in errors.detail
    sweep = SweepResult("m", "", "fake:0", "fake", "concurrency", (r,), {})
    assert exit_code(sweep) == ExitCode.ERRORS  # "requests failed", not "did not stabilise"
    assert sweep_from_json(sweep_to_json(sweep)).levels[0].late_count == 4
    older = json.loads(sweep_to_json(sweep))  # as written before levels counted late requests
    for field in ("late_count", "late_ok_count"):
        del older["levels"][0][field]
    assert sweep_from_json(json.dumps(older)).levels[0].late_count == 0


async def test_answers_after_the_last_window_are_counted_once_and_left_out_of_the_figures() -> None:
    # 400 ms a request, 2 workers, three 1 s windows: each worker's request sent at 2.8 s is
    # answered at 3.2 s, after the level's last window; every third request fails.
    spec = WindowSpec(interval_ms=1000, max_trials=3)
    m, client = await measure(
        lambda now, i: 400 * MS, ClosedLoop(2), spec, error=lambda i: "HTTP 503" if i % 3 == 2 else ""
    )
    r = m.result
    late = m.samples.select(m.samples.done_ns >= 3 * S)
    assert len(late) == r.late_count == 2
    late_ok = int(late.ok.sum())
    assert r.late_ok_count == late_ok
    # Every request the level sent is counted once: answered in a window, answered late, or failed.
    assert r.ok_count + r.late_ok_count + r.error_count == len(m.samples) == len(client.sent) == 16
    assert r.request_count == r.ok_count + r.error_count
    in_windows = m.samples.select(m.samples.done_ns < 3 * S)
    assert r.ok_count == int(in_windows.ok.sum()) == r.latency.count
    assert r.errors == m.samples.error_counts()
    assert r.throughput_infer_per_s == r.ok_count / 3


async def test_requests_cancelled_at_the_drain_timeout_are_errors_of_a_named_kind() -> None:
    clock = FakeClock()
    client = NeverAnswering()
    loadgen = LoadGenerator(client, [FakePrepared("a")], SampleBuffer(), clock)
    spec = WindowSpec(interval_ms=200, max_trials=3)
    m = await measure_level(loadgen, ClosedLoop(3), spec, batch_size=1, drain_timeout_s=0.01)
    r = m.result
    assert client.sent == 3 and len(m.samples) == 3
    assert r.errors == {CANCELLED_AT_DRAIN: 3} and r.error_count == r.request_count == r.late_count == 3
    assert m.samples.sent_ns.tolist() == [0, 0, 0] and (m.samples.done_ns >= 600 * MS).all()


async def test_failures_before_the_reported_windows_are_the_levels_errors_apart_from_its_figures() -> None:
    # 10 ms a request (2 workers); the requests answered in the second window (1-2 s) are 30 ms each
    # and fail, so windows 0 and 1 disagree and the level reports windows 2-4 (2-5 s): the window-1
    # failures are in no reported window, yet the level's.
    clock = FakeClock()
    slow = lambda now: S <= now < 2 * S  # noqa: E731
    spec = WindowSpec(interval_ms=1000, max_trials=10)
    m, client = await measure(
        lambda now, i: (30 if slow(now) else 10) * MS, ClosedLoop(2), spec, clock=clock,
        error=lambda i: "HTTP 503: model overloaded" if slow(clock.now_ns()) else "",
    )  # fmt: skip
    r = m.result
    assert len(r.windows) == 5 and r.stable
    failed_early = m.samples.select((m.samples.done_ns < 2 * S) & ~m.samples.ok)
    assert len(failed_early) == r.windows[1].error_count > 0
    assert r.early_errors == {"HTTP 503: model overloaded": len(failed_early)}
    assert r.early_error_count == len(failed_early)
    # The reported figures stay the reported span's: its requests, none of which failed.
    assert (r.error_count, r.errors) == (0, {})
    assert r.ok_count + r.error_count == r.request_count == r.latency.count
    errors = next(c for c in r.checks if c.name == "errors")
    assert not errors.passed
    assert f"{len(failed_early)} failed before the reported windows: HTTP 503: model overloaded" in errors.detail
    sweep = SweepResult("m", "", "fake:0", "fake", "concurrency", (r,), {})
    assert exit_code(sweep) == ExitCode.ERRORS


async def test_a_level_without_early_failures_records_none() -> None:
    m, _ = await measure(lambda now, i: 10 * MS, ClosedLoop(2), WindowSpec(interval_ms=1000))
    assert (m.result.early_error_count, m.result.early_errors) == (0, {})
    assert next(c for c in m.result.checks if c.name == "errors").passed


async def test_warm_up_failures_are_failures_before_the_reported_windows() -> None:
    # --request-count 50 after 10 warm-up requests, the first 4 of which fail: never in the counted window.
    spec = WindowSpec(request_limit=50, warmup_request_count=10, interval_ms=100)
    m, client = await measure(lambda now, i: 4 * MS, ClosedLoop(1), spec, error=lambda i: "HTTP 503" if i < 4 else "")
    r = m.result
    assert len(client.sent) == 60 and (r.request_count, r.error_count) == (50, 0)
    assert (r.early_error_count, r.early_errors) == (4, {"HTTP 503": 4})
