"""Progress output: exact plain lines when piped, nothing when quiet, rich's live line on a terminal."""

from __future__ import annotations

import io

import pytest

from perfkit.progress import Progress
from perfkit.results.model import Check, LatencyStats, LevelResult, ResourceUsage, level_name


def make_result(**overrides: object) -> LevelResult:
    fields: dict[str, object] = dict(
        mode="concurrency", level=4.0, batch_size=1, stable=True, duration_s=1.5,
        request_count=1000, ok_count=1000, error_count=0, errors={},
        throughput_infer_per_s=1234.56, throughput_ci_low=1200.0, throughput_ci_high=1250.0, send_rate_per_s=1234.0,
        latency=LatencyStats(count=1000, p99_us=2310.4), latency_from_intended=LatencyStats(count=1000),
        delayed_pct=0.0, max_send_lag_us=0.0, client_send_us=0.0, client_recv_us=0.0, network_server_us=0.0,
        server=None, resources=ResourceUsage(), windows=(), checks=(Check("stable", True, ""),),
    )  # fmt: skip
    fields.update(overrides)
    return LevelResult(**fields)  # type: ignore[arg-type]


def drive(progress: Progress) -> None:
    progress.level_started("concurrency", 4)
    progress.window_done(4, 0, 10, 1200.04, 2500.0, False)
    progress.window_done(4, 1, 10, 1234.56, 2310.4, True)
    progress.level_done(make_result())
    progress.note("the server reported 2 GPUs")
    progress.level_started("request_rate", 12.5)
    progress.window_done(12.5, 0, 10, 12.2, 900.0, False)
    failed = (Check("errors", False, "5 errors"), Check("delayed", False, "3% delayed"))
    progress.level_done(
        make_result(mode="request_rate", level=12.5, stable=False, error_count=5, checks=failed,
                    latency=LatencyStats(), throughput_infer_per_s=12.2)
    )  # fmt: skip
    progress.close()


def test_plain_lines_when_not_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress(quiet=False, stream=stream)
    assert not progress.live
    drive(progress)
    assert stream.getvalue().splitlines() == [
        "concurrency 4: measuring",
        "concurrency 4: window 1/10: 1200.0 infer/s, latency 2.500 ms, not stable yet",
        "concurrency 4: window 2/10: 1234.6 infer/s, latency 2.310 ms, stable",
        "concurrency 4: 1234.6 infer/s, p99 2.310 ms, stable, valid",
        "the server reported 2 GPUs",
        "request rate 12.5/s: measuring",
        "request rate 12.5/s: window 1/10: 12.2 infer/s, latency 0.900 ms, not stable yet",
        "request rate 12.5/s: 12.2 infer/s, 5 errors, UNSTABLE, INVALID (errors, delayed)",
    ]


def test_quiet_prints_nothing() -> None:
    stream = io.StringIO()
    drive(Progress(quiet=True, stream=stream))
    quiet_tty = io.StringIO()
    drive(Progress(quiet=True, stream=quiet_tty, force_terminal=True))
    assert stream.getvalue() == "" and quiet_tty.getvalue() == ""


def test_terminal_mode_uses_rich_and_leaves_verdict_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = io.StringIO()
    with Progress(quiet=False, stream=stream, force_terminal=True) as progress:
        assert progress.live
        drive(progress)
    out = stream.getvalue()
    assert "concurrency 4: 1234.6 infer/s, p99 2.310 ms, stable, valid" in out
    assert "the server reported 2 GPUs" in out
    assert "\x1b[32m" in out  # the good verdict in green


def test_no_color_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    stream = io.StringIO()
    drive(Progress(quiet=False, stream=stream, force_terminal=True))
    out = stream.getvalue()
    assert "concurrency 4: 1234.6 infer/s" in out
    assert "\x1b[32m" not in out and "\x1b[31m" not in out and "\x1b[33m" not in out


def test_close_without_a_level_and_twice() -> None:
    progress = Progress(quiet=False, stream=io.StringIO(), force_terminal=True)
    progress.close()
    progress.close()


def test_level_labels() -> None:
    assert level_name("concurrency", 8.0) == "concurrency 8"
    assert level_name("request_rate", 250.0) == "request rate 250/s"
    assert level_name("custom_intervals", 6.0) == "custom intervals"


def test_short_level_names_are_the_comparisons() -> None:
    assert level_name("concurrency", 8.0, short=True) == "concurrency 8"
    assert level_name("request_rate", 12.5, short=True) == "rate 12.5/s"
    assert level_name("custom_intervals", 6.0, short=True) == "intervals 6/s"


@pytest.mark.parametrize("terminal", [False, True])
def test_verbose_keeps_every_window_and_lists_each_levels_checks(terminal: bool) -> None:
    stream = io.StringIO()
    drive(Progress(stream=stream, force_terminal=terminal, no_color=True, verbose=1))
    out = stream.getvalue()
    assert "concurrency 4: window 1/10: 1200.0 infer/s, latency 2.500 ms, not stable yet\n" in out
    assert "concurrency 4: 1234.6 infer/s, p99 2.310 ms, stable, valid\n  passed stable\n" in out
    assert out.endswith("  FAILED errors: 5 errors\n  FAILED delayed: 3% delayed\n")
    plain = io.StringIO()
    drive(Progress(stream=plain))
    assert "passed" not in plain.getvalue() and "FAILED" not in plain.getvalue()


def test_a_levels_line_says_how_many_of_its_errors_came_after_its_last_window() -> None:
    stream = io.StringIO()
    progress = Progress(quiet=False, stream=stream)
    progress.level_done(make_result(ok_count=0, error_count=64, request_count=64, late_count=64, stable=False,
                                    latency=LatencyStats(), throughput_infer_per_s=0.0))  # fmt: skip
    assert stream.getvalue() == "concurrency 4: 0.0 infer/s, 64 errors (64 after the last window), UNSTABLE, valid\n"


def test_a_levels_line_counts_the_failures_before_its_reported_windows() -> None:
    stream = io.StringIO()
    progress = Progress(quiet=False, stream=stream)
    progress.level_done(make_result(early_error_count=7, early_errors={"HTTP 503": 7}))
    progress.level_done(make_result(error_count=3, late_count=1, early_error_count=7))
    assert stream.getvalue().splitlines() == [
        "concurrency 4: 1234.6 infer/s, p99 2.310 ms, 7 errors (7 before the reported windows), stable, valid",
        "concurrency 4: 1234.6 infer/s, p99 2.310 ms, 10 errors (7 before the reported windows, 1 after the last "
        "window), stable, valid",
    ]
