from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perfkit.errors import PerfkitError
from perfkit.load.schedule import OpenLoop, ScheduleStream, build_schedule, linear_levels, parse_range, read_intervals


def test_constant_schedule_is_evenly_spaced_without_drift() -> None:
    offsets = build_schedule(OpenLoop(rate=3.0), 9)
    assert offsets.tolist() == [333333333, 666666667, 1000000000, 1333333333, 1666666667, 2000000000,
                                2333333333, 2666666667, 3000000000]  # fmt: skip
    stream = ScheduleStream(OpenLoop(rate=3.0))
    chunks = np.concatenate([stream.next_chunk(4), stream.next_chunk(5)])
    assert chunks.tolist() == offsets.tolist()


def test_poisson_schedule_is_seeded_and_has_the_asked_rate() -> None:
    a = build_schedule(OpenLoop(rate=1000.0, distribution="poisson", seed=7), 20000)
    b = build_schedule(OpenLoop(rate=1000.0, distribution="poisson", seed=7), 20000)
    c = build_schedule(OpenLoop(rate=1000.0, distribution="poisson", seed=8), 20000)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    gaps = np.diff(a)
    assert np.all(gaps > 0)
    assert abs(len(a) / (a[-1] / 1e9) - 1000.0) < 30  # 20000 draws: the rate is within 3%
    # Exponential gaps: the coefficient of variation is close to 1 (constant would be 0).
    assert 0.95 < gaps.std() / gaps.mean() < 1.05


def test_intervals_cycle_like_perf_analyzer() -> None:
    # perf_analyzer's docs: 100000/200000/500000 us → sends at 0.1, 0.3, 0.8, 0.9, 1.1, 1.6 s
    load = OpenLoop(intervals_ns=(100_000_000, 200_000_000, 500_000_000))
    assert (build_schedule(load, 6) / 1e6).tolist() == [100, 300, 800, 900, 1100, 1600]
    assert load.label == pytest.approx(3 / 0.8)


def test_read_intervals(tmp_path: Path) -> None:
    path = tmp_path / "intervals.txt"
    path.write_text("100000\n\n200000\n500000\n")
    assert read_intervals(path) == (100_000_000, 200_000_000, 500_000_000)
    path.write_text("100\nabc\n")
    with pytest.raises(PerfkitError, match=r"intervals.txt:2: 'abc' is not a number"):
        read_intervals(path)
    with pytest.raises(PerfkitError, match="cannot read"):
        read_intervals(tmp_path / "missing.txt")


def test_parse_range_follows_perf_analyzer() -> None:
    assert parse_range("4", "--concurrency-range", integer=True) == (4, 4, 1)
    assert parse_range("1:8", "--concurrency-range", integer=True) == (1, 8, 1)
    assert parse_range("1:16:4", "--concurrency-range", integer=True) == (1, 16, 4)
    assert parse_range("50:200:50", "--request-rate-range", integer=False) == (50.0, 200.0, 50.0)
    assert linear_levels(1, 16, 4) == [1, 5, 9, 13]
    for bad, message in [("0:4", "positive"), ("8:2", "END must be at least START"), ("a:b", "integers"),
                         ("1:2:3:4", "START"), ("1:4:0", "positive")]:  # fmt: skip
        with pytest.raises(PerfkitError, match=message):
            parse_range(bad, "--concurrency-range", integer=True)


def test_rejects_bad_loads() -> None:
    with pytest.raises(PerfkitError, match="rates must be positive"):
        ScheduleStream(OpenLoop(rate=0))
    with pytest.raises(PerfkitError, match="--request-distribution"):
        ScheduleStream(OpenLoop(rate=1, distribution="uniform"))
