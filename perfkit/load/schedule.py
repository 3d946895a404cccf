"""When to send: closed-loop concurrency, or an open-loop schedule of intended send times.

Theory of operation. A closed-loop client (concurrency N) sends a request only when one of its N
outstanding requests completes, so a server stall also stalls the client: the requests that would
have arrived during the stall are never sent and their waiting is never measured. This is
coordinated omission (Gil Tene; wrk2 README), and it makes closed-loop tail latency optimistic by
construction. An open-loop client decides every send time ahead of the run (a schedule), keeps to it
whatever the server does, and measures latency from the *intended* send time, as wrk2 and MLPerf
LoadGen's Server scenario do. perfkit reports both that corrected latency and the service latency
(from the actual send, perf_analyzer's definition), plus the share of sends that left late.

Schedules are numpy arrays of offsets (ns from the level's start), built from a seeded
`numpy.random.Generator` so that a run and its report are reproducible (perf_analyzer seeds a
default-constructed mt19937 and cannot vary it; MLPerf fixes `schedule_rng_seed`). They are produced
in chunks, so a level can run as long as the stability rule needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from perfkit.errors import PerfkitError

DISTRIBUTIONS = ("constant", "poisson")


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """N requests outstanding at all times, each replaced when it completes."""

    concurrency: int


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Requests sent at intended times: `rate` per second with `distribution`, or `intervals_ns`
    cycled (perf_analyzer's --request-intervals)."""

    rate: float = 0.0
    distribution: str = "constant"
    seed: int = 0
    intervals_ns: tuple[int, ...] = ()
    # (k, n): keep only arrivals i with i % n == k. The n shares of one schedule are disjoint and
    # together are exactly that schedule, so n load workers each sending one share offer, merged,
    # the arrival process asked for (a deterministic thinning; see ScheduleStream).
    share: tuple[int, int] = (0, 1)

    @property
    def label(self) -> float:
        """The load level as reported: the requested rate, or the intervals' mean rate."""
        if self.intervals_ns:
            return 1e9 * len(self.intervals_ns) / sum(self.intervals_ns)
        return self.rate


Load = ClosedLoop | OpenLoop


class ScheduleStream:
    """Intended send offsets of an open-loop load, produced chunk by chunk without end."""

    def __init__(self, load: OpenLoop) -> None:
        if load.intervals_ns:
            if any(i <= 0 for i in load.intervals_ns):
                raise PerfkitError("--request-intervals: every interval must be a positive number of microseconds")
        elif load.rate <= 0:
            raise PerfkitError("--request-rate-range: rates must be positive")
        elif load.distribution not in DISTRIBUTIONS:
            raise PerfkitError(f"--request-distribution must be one of {', '.join(DISTRIBUTIONS)}")
        part, parts = load.share
        if not 0 <= part < parts:
            raise ValueError(f"share {part} of {parts}: want 0 <= k < n")
        self.load = load
        self._rng = np.random.default_rng(load.seed)
        self._last_ns = 0
        self._index = 0

    def next_chunk(self, count: int) -> npt.NDArray[np.int64]:
        """The next `count` offsets (ns since the level's start) of this load's share, increasing."""
        part, parts = self.load.share
        if parts == 1:
            return self._next_offsets(count)
        # Whole rounds of `parts` arrivals, so every chunk starts at an index that is a multiple of
        # `parts` and arrival i = round·parts + part is the share's.
        return self._next_offsets(count * parts)[part::parts]

    def _next_offsets(self, count: int) -> npt.NDArray[np.int64]:
        load = self.load
        if load.intervals_ns:
            cycle = np.asarray(load.intervals_ns, dtype=np.int64)
            idx = (np.arange(self._index, self._index + count) % len(cycle)).astype(np.int64)
            gaps = cycle[idx]
        elif load.distribution == "constant":
            period = 1e9 / load.rate
            # From absolute positions, so rounding never accumulates over a long run.
            ends = np.round(period * np.arange(self._index + 1, self._index + count + 1)).astype(np.int64)
            gaps = np.diff(ends, prepend=self._last_ns)
        else:
            gaps = np.maximum(1, np.round(self._rng.exponential(1e9 / load.rate, size=count))).astype(np.int64)
        offsets = self._last_ns + np.cumsum(gaps, dtype=np.int64)
        self._last_ns = int(offsets[-1])
        self._index += count
        return offsets


def build_schedule(load: OpenLoop, count: int) -> npt.NDArray[np.int64]:
    """The first `count` intended offsets of `load` (ns)."""
    return ScheduleStream(load).next_chunk(count)


def read_intervals(path: Path) -> tuple[int, ...]:
    """perf_analyzer's --request-intervals file: one interval in microseconds per line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise PerfkitError(f"--request-intervals {path}: cannot read the file ({exc.strerror})") from exc
    intervals = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise PerfkitError(
                f"--request-intervals {path}:{number}: '{text}' is not a number of microseconds"
            ) from None
        if value <= 0:
            raise PerfkitError(f"--request-intervals {path}:{number}: intervals must be positive, got {text}")
        intervals.append(int(round(value * 1000)))
    if not intervals:
        raise PerfkitError(f"--request-intervals {path}: the file holds no interval")
    return tuple(intervals)


def parse_range(text: str, flag: str, *, integer: bool) -> tuple[float, float, float]:
    """perf_analyzer's START[:END[:STEP]] (END defaults to START, STEP to 1)."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise PerfkitError(f"{flag} '{text}' must look like START[:END[:STEP]], e.g. 1:8 or 1:16:2")
    try:
        values = [int(p) if integer else float(p) for p in parts]
    except ValueError:
        kind = "integers" if integer else "numbers"
        raise PerfkitError(f"{flag} '{text}': START, END and STEP must be {kind}") from None
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else 1
    if start <= 0 or step <= 0:
        raise PerfkitError(f"{flag} '{text}': START and STEP must be positive")
    if end != 0 and end < start:
        raise PerfkitError(f"{flag} '{text}': END must be at least START (or 0: until --latency-threshold)")
    return float(start), float(end), float(step)


def linear_levels(start: float, end: float, step: float) -> Sequence[float]:
    """START, START+STEP, ... up to END inclusive."""
    count = int((end - start) // step) + 1
    return [start + i * step for i in range(count)]
