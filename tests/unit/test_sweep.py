"""perfkit.sweep.engine on virtual time: the levels a sweep measures (linear with -l, binary search), how it
stops when the server is gone, and how request errors are counted without stopping it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from perfkit.cli.sweep.command import failure_lines
from perfkit.errors import ExitCode
from perfkit.load.generator import FakeClock
from perfkit.measure.level import LevelMeasurement, WindowSpec
from perfkit.report.export import render_pa_csv, render_summary_table
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.model import LevelResult, SweepResult, sweep_from_json, sweep_to_json
from perfkit.sweep.engine import Sweep, stabilizing_latency_us
from perfkit.sweep.run import SweepRun, exit_code
from perfkit.sweep.spec import LoadSpec, SweepSpec
from perfkit.target import TargetSpec
from perfkit.wire.replies import FailureLog
from tests.fakes import FakeClient, FakePrepared

MS = 1_000_000
WINDOWS = WindowSpec(interval_ms=100, max_trials=5)


class QueueingServer(FakeClient):
    """One request at a time, `service_ms` each: with N requests outstanding each takes N × service_ms,
    so latency grows linearly with concurrency and throughput stays at 1000 / service_ms per second.
    Offers the statistics extension (of a server that reports nothing) as a real client does."""

    def __init__(self, clock: FakeClock, service_ms: float = 1.0, error: Callable[[int], str] = lambda i: "") -> None:
        super().__init__(clock, lambda now, index: int(self.in_flight * service_ms * MS), error)
        self.statistics_calls = 0

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        self.statistics_calls += 1
        return {"model_stats": []}


class RecordingProgress:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def window_done(self, level: float, window_index: int, max_trials: int, throughput: float, latency_us: float,
                    stable: bool) -> None:  # fmt: skip
        self.calls.append(("window_done", (level, window_index)))

    def level_started(self, mode: str, level: float) -> None:
        self.calls.append(("level_started", (mode, level)))

    def level_done(self, result: LevelResult) -> None:
        self.calls.append(("level_done", result.level))

    def note(self, text: str) -> None:
        self.calls.append(("note", text))

    def named(self, name: str) -> list[Any]:
        return [args for call, args in self.calls if call == name]


class Saved:
    """on_level: what the runner would write, every time it is called."""

    def __init__(self) -> None:
        self.results: list[SweepResult] = []
        self.measurements: list[LevelMeasurement] = []

    def __call__(self, result: SweepResult, measurement: LevelMeasurement) -> None:
        self.results.append(result)
        self.measurements.append(measurement)


def make_sweep(
    client: FakeClient, load: LoadSpec, windows: WindowSpec = WINDOWS
) -> tuple[Sweep, RecordingProgress, Saved]:
    """As runner._sweep builds one, with a fake clock, client, progress and output."""
    spec = SweepSpec(target=TargetSpec(url=client.url, model="m"), load=load, windows=windows)
    spec.validate()
    progress, saved = RecordingProgress(), Saved()
    sweep = Sweep(
        spec, client=client, prepared=[FakePrepared("a")], model="m", model_version="", provenance={"seed": 0},
        clock=client.clock, progress=progress, on_level=saved,
    )  # fmt: skip
    return sweep, progress, saved


def levels(result: SweepResult) -> list[float]:
    return [level.level for level in result.levels]


def failed_checks(result: SweepResult) -> set[str]:
    """The checks some level failed: 0.3 s of fake windows are stable but too short for a valid p99,
    which makes the exit code 3 as any invalid level does."""
    return {c.name for level in result.levels for c in level.checks if not c.passed}


async def test_a_linear_sweep_measures_every_level_in_order() -> None:
    client = QueueingServer(FakeClock())
    sweep, progress, saved = make_sweep(client, LoadSpec("concurrency", 1, 4, 1))
    result = await sweep.run()
    assert levels(result) == [1.0, 2.0, 3.0, 4.0]
    assert result.completed and result.stop_reason == ""
    assert (result.model, result.url, result.protocol, result.mode) == ("m", "fake:0", "fake", "concurrency")
    assert result.provenance == {"seed": 0}
    # Every finished level is handed over at once, the sweep so far with it.
    assert [levels(r) for r in saved.results] == [[1.0], [1.0, 2.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]
    assert [m.result.level for m in saved.measurements] == [1.0, 2.0, 3.0, 4.0]
    assert progress.named("level_started") == [("concurrency", float(c)) for c in (1, 2, 3, 4)]
    assert progress.named("level_done") == [1.0, 2.0, 3.0, 4.0]
    assert progress.named("note") == []
    assert client.max_in_flight == 4
    assert client.statistics_calls == sum(len(level.windows) + 1 for level in result.levels)
    # Throughput stays at 1000/s, latency grows by 1 ms per outstanding request.
    for level in result.levels:
        assert level.stable
        assert level.throughput_infer_per_s == pytest.approx(1000.0, rel=0.02)
        assert stabilizing_latency_us(level) == pytest.approx(1000.0 * level.level, rel=0.02)
    assert exit_code(result) == ExitCode.UNSTABLE and failed_checks(result) == {"sample_count", "duration"}


async def test_the_latency_threshold_stops_at_the_first_level_over_it() -> None:
    client = QueueingServer(FakeClock())
    sweep, progress, _ = make_sweep(client, LoadSpec("concurrency", 1, 8, 1, latency_threshold_ms=4.5))
    result = await sweep.run()
    # 1 .. 4 ms are within 4.5 ms; 5 ms is over: measured, kept, and the last.
    assert levels(result) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stabilizing_latency_us(result.levels[-1]) > 4500
    assert result.completed  # reaching -l is how such a sweep is meant to end
    [note] = progress.named("note")
    assert "passed -l 4.5 ms at level 5: stopping" in note
    assert exit_code(result) == ExitCode.UNSTABLE and failed_checks(result) == {"sample_count", "duration"}


async def test_an_open_ended_range_runs_until_the_latency_threshold() -> None:
    client = QueueingServer(FakeClock())
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 2, 0, 2, latency_threshold_ms=5.5))
    result = await sweep.run()
    assert levels(result) == [2.0, 4.0, 6.0]


async def test_binary_search_finds_the_highest_level_within_the_threshold_in_few_levels() -> None:
    client = QueueingServer(FakeClock())
    sweep, progress, saved = make_sweep(
        client, LoadSpec("concurrency", 1, 64, 1, latency_threshold_ms=20.5, binary_search=True)
    )
    result = await sweep.run()
    # perf_analyzer's order: START, END, then midpoints (rounded down) until high − low <= STEP.
    assert levels(result) == [1.0, 64.0, 32.0, 16.0, 24.0, 20.0, 22.0, 21.0]
    within = [lv.level for lv in result.levels if stabilizing_latency_us(lv) <= 20_500]
    assert max(within) == 20.0  # the boundary: 20 ms at concurrency 20, 21 ms at 21
    assert min(lv.level for lv in result.levels if lv.level not in within) == 21.0
    assert len(result.levels) < 21 // 2  # a linear sweep would measure 1 .. 21
    assert result.completed
    assert len(saved.results) == 8 and progress.named("note") == []


async def test_binary_search_with_a_coarser_step_stops_within_that_step() -> None:
    client = QueueingServer(FakeClock())
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 1, 64, 8, latency_threshold_ms=20.5, binary_search=True))
    result = await sweep.run()
    # 16 is within and 24 over: 8 apart, as precise as STEP 8 asks, so the search ends there.
    assert levels(result) == [1.0, 64.0, 32.0, 16.0, 24.0]
    within = max(lv.level for lv in result.levels if stabilizing_latency_us(lv) <= 20_500)
    over = min(lv.level for lv in result.levels if stabilizing_latency_us(lv) > 20_500)
    assert (within, over) == (16.0, 24.0)


async def test_binary_search_stops_early_when_the_ends_decide_it() -> None:
    # Everything within the threshold: START and END only.
    client = QueueingServer(FakeClock())
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 1, 8, 1, latency_threshold_ms=100, binary_search=True))
    assert levels(await sweep.run()) == [1.0, 8.0]
    # Even START is over it: nothing more to search.
    client = QueueingServer(FakeClock(), service_ms=10)
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 1, 8, 1, latency_threshold_ms=5, binary_search=True))
    assert levels(await sweep.run()) == [1.0]


async def test_a_server_refusing_every_connection_stops_the_sweep_after_one_level() -> None:
    client = QueueingServer(FakeClock(), error=lambda i: "connection refused")
    sweep, progress, saved = make_sweep(client, LoadSpec("concurrency", 1, 8, 1))
    result = await sweep.run()
    assert levels(result) == [1.0]
    [level] = result.levels
    assert level.ok_count == 0 and level.error_count == level.request_count > 0
    assert level.errors == {"connection refused": level.request_count}
    # One window of nothing but refused connections ends the level: more would only wait.
    assert not level.stable and len(level.windows) == 1
    assert result.completed is False
    assert result.stop_reason == f"the server stopped answering (connection refused ×{level.request_count})"
    # The finished level is handed over, then the sweep once more, marked as stopped.
    assert [(r.completed, len(r.levels)) for r in saved.results] == [(True, 1), (False, 1)]
    assert progress.named("level_started") == [("concurrency", 1.0)]
    assert exit_code(result) == ExitCode.FAILED


async def test_a_server_that_goes_away_mid_sweep_keeps_the_levels_before() -> None:
    clock = FakeClock()
    gone_at = 3 * WINDOWS.max_trials * 100 * MS  # after the first levels, whatever their windows

    class DyingServer(QueueingServer):
        def __init__(self) -> None:
            super().__init__(clock, error=lambda i: "connection refused" if self.clock.now_ns() >= gone_at else "")

    sweep, _, _ = make_sweep(DyingServer(), LoadSpec("concurrency", 1, 20, 1))
    result = await sweep.run()
    assert not result.completed and "the server stopped answering" in result.stop_reason
    *served, gone = result.levels
    # The level during which it went keeps its successes beside its errors; the next one had none.
    assert served[0].error_count == 0 and all(lv.ok_count > 0 for lv in served)
    assert served[-1].errors.keys() <= {"connection refused"}
    assert gone.ok_count == 0 and gone.errors == {"connection refused": gone.request_count}
    assert levels(result) == [float(c) for c in range(1, len(result.levels) + 1)]
    assert len(result.levels) < 20


async def test_some_failed_requests_are_counted_by_kind_and_the_sweep_goes_on() -> None:
    client = QueueingServer(FakeClock(), error=lambda i: "HTTP 503" if i % 5 == 4 else "")
    sweep, _, saved = make_sweep(client, LoadSpec("concurrency", 1, 3, 1))
    result = await sweep.run()
    assert levels(result) == [1.0, 2.0, 3.0]
    assert result.completed and result.stop_reason == ""
    for level, measurement in zip(result.levels, saved.measurements):
        # Exactly the failed requests that completed in the reported windows or after the last
        # (while the level drained), by kind; the answers after it are counted apart.
        start, end = level.windows[-3].start_ns, level.windows[-1].end_ns
        s = measurement.samples
        counted = s.select(s.done_ns >= start)
        assert level.errors == counted.error_counts() == {"HTTP 503": level.error_count}
        assert level.late_count == int((s.done_ns >= end).sum())
        assert level.ok_count + level.late_ok_count == int(counted.ok.sum())
        assert level.error_count == pytest.approx(level.request_count / 5, abs=1)
        assert level.ok_count == level.request_count - level.error_count
        assert level.latency.count == level.ok_count
        errors = next(c for c in level.checks if c.name == "errors")
        assert not errors.passed and f"HTTP 503 × {level.error_count}" in errors.detail
    assert exit_code(result) == ExitCode.ERRORS
    # They show in every output: the tidy CSV, the summary table, and the perf_analyzer CSV's
    # throughput (successes only).
    tidy = render_tidy_csv(result).splitlines()
    header = tidy[0].split(",")
    for line, level in zip(tidy[1:], result.levels):
        row = dict(zip(header, line.split(",")))
        assert row["errors"] == f"HTTP 503={level.error_count}"
        assert row["error_count"] == str(level.error_count)
        assert "errors" in row["failed_checks"].split(";")
    table = render_summary_table(result.levels)
    assert all(f" {level.error_count} " in line for line, level in zip(table[2:], result.levels))
    assert len(render_pa_csv(result.levels).splitlines()) == 4


async def test_a_level_whose_requests_all_fail_after_its_windows_exits_4_in_the_servers_words() -> None:
    # A stalled model: each request fails 10 s after it was sent, in the server's words; the
    # level's windows (5 x 0.1 s) close first, so its failures arrive only while it drains.
    stalled = "execute() did not return within 0.3 s"

    class StalledServer(QueueingServer):
        def __init__(self) -> None:
            super().__init__(FakeClock(), error=lambda i: "HTTP 500")
            self.latency = lambda now, i: 10_000 * MS
            self.failures = FailureLog()

        async def send(self, prepared: FakePrepared) -> Any:
            outcome = await super().send(prepared)
            self.failures.note(outcome.error, stalled)
            return outcome

    sweep, progress, _ = make_sweep(StalledServer(), LoadSpec("concurrency", 2, 2, 1))
    result = await sweep.run()
    [level] = result.levels
    assert all(w.request_count == 0 for w in level.windows)
    assert (level.request_count, level.error_count, level.errors) == (2, 2, {"HTTP 500": 2})
    assert (level.ok_count, level.late_count, level.late_ok_count) == (0, 2, 0)
    assert result.completed and exit_code(result) == ExitCode.ERRORS  # requests failed: 4, not 3
    assert [note for note in progress.named("note") if stalled in note] == [f"requests failed: {sweep.failures[0]}"]
    assert stalled in sweep.failures[0]


async def test_failures_before_a_levels_reported_windows_exit_4_in_the_servers_words() -> None:
    # The requests answered in the level's second window (0.1-0.2 s) take 3 ms and fail, in the
    # server's words; the level reports windows 2-4 (0.2-0.5 s), in which none fails.
    overloaded = "the model's queue is full (max_queue_size 4)"

    class OverloadedAWhile(QueueingServer):
        def __init__(self) -> None:
            super().__init__(FakeClock(), error=lambda i: "HTTP 503" if self.slow() else "")
            self.latency = lambda now, i: (3 if self.slow() else 1) * MS
            self.failures = FailureLog()

        def slow(self) -> bool:
            return 100 * MS <= self.clock.now_ns() < 200 * MS

        async def send(self, prepared: FakePrepared) -> Any:
            outcome = await super().send(prepared)
            if outcome.error:
                self.failures.note(outcome.error, overloaded)
            return outcome

    sweep, _, _ = make_sweep(OverloadedAWhile(), LoadSpec("concurrency", 1, 1, 1))
    result = await sweep.run()
    [level] = result.levels
    assert len(level.windows) == 5 and level.windows[1].error_count > 0
    assert (level.error_count, level.errors) == (0, {})  # the reported span's counts
    assert level.early_errors == {"HTTP 503": level.early_error_count} and level.early_error_count > 0
    assert result.completed and exit_code(result) == ExitCode.ERRORS
    lines = failure_lines(SweepRun(result, None, tuple(sweep.failures)), exit_code(result))
    assert len(lines) == 1 and lines[0].startswith("error: requests failed: ") and overloaded in lines[0]
    # Saved and loaded, the level keeps them; a result saved before they were recorded loads with none.
    [loaded] = sweep_from_json(sweep_to_json(result)).levels
    assert (loaded.early_error_count, loaded.early_errors) == (level.early_error_count, level.early_errors)
    old = json.loads(sweep_to_json(result))
    for entry in old["levels"]:
        del entry["early_error_count"], entry["early_errors"]
    [old_level] = sweep_from_json(json.dumps(old)).levels
    assert (old_level.early_error_count, old_level.early_errors) == (0, {})


async def test_a_level_answered_only_after_its_windows_is_not_a_server_gone() -> None:
    # 10 s a request: one answer and one timeout, both after the windows. The server answered.
    client = QueueingServer(FakeClock(), error=lambda i: "timeout" if i % 2 == 0 else "")
    client.latency = lambda now, i: 10_000 * MS
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 2, 2, 1))
    result = await sweep.run()
    [level] = result.levels
    assert (level.ok_count, level.late_ok_count, level.errors) == (0, 1, {"timeout": 1})
    assert result.completed and result.stop_reason == "" and exit_code(result) == ExitCode.ERRORS


async def test_a_level_that_never_stabilises_gives_exit_code_3() -> None:
    # Service time alternates between 1 ms and 3 ms every window: never within 10 %.
    clock = FakeClock()
    client = QueueingServer(clock)
    client.latency = lambda now, i: (1 if (now // (100 * MS)) % 2 == 0 else 3) * MS
    sweep, _, _ = make_sweep(client, LoadSpec("concurrency", 1, 2, 1))
    result = await sweep.run()
    assert levels(result) == [1.0, 2.0]
    assert result.completed
    assert all(not lv.stable and len(lv.windows) == WINDOWS.max_trials for lv in result.levels)
    assert all(not next(c for c in lv.checks if c.name == "stable").passed for lv in result.levels)
    assert exit_code(result) == ExitCode.UNSTABLE


async def test_an_exception_marks_the_sweep_as_not_completed_and_propagates() -> None:
    clock = FakeClock()

    class BrokenServer(QueueingServer):
        async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
            if len(self.sent) > 300:
                raise KeyboardInterrupt
            return await super().model_statistics(model, version)

    sweep, _, saved = make_sweep(BrokenServer(clock), LoadSpec("concurrency", 1, 8, 1))
    with pytest.raises(KeyboardInterrupt):
        await sweep.run()
    assert sweep.result.completed is False and sweep.result.stop_reason == "interrupted"
    assert sweep.result.levels == saved.results[-1].levels


async def test_a_cancelled_sweep_says_it_was_interrupted() -> None:
    # asyncio.run delivers Ctrl-C as a cancellation of the main task.
    client = QueueingServer(FakeClock())
    sweep, _, saved = make_sweep(client, LoadSpec("concurrency", 1, 8, 1))
    task = asyncio.get_running_loop().create_task(sweep.run())

    def cancel_after_two(result: SweepResult, measurement: LevelMeasurement) -> None:
        saved(result, measurement)
        if len(result.levels) == 2:
            task.cancel()

    sweep.on_level = cancel_after_two
    with pytest.raises(asyncio.CancelledError):
        await task
    assert levels(sweep.result) == [1.0, 2.0]
    assert sweep.result.completed is False and sweep.result.stop_reason == "interrupted"
    assert client.in_flight == 0  # the third level's requests were drained, none left behind
