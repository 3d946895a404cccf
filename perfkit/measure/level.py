"""One load level: warm up, measure contiguous windows until the last few agree, report them merged.

perf_analyzer's procedure (inference_profiler.cc, ProfileHelper): windows follow each other without
gaps; a request counts in the window in which it completes; after each window the last three are
compared, and the level is stable when their throughputs and their stabilising latencies (average, or
--percentile) each lie within ±stability%; the reported figures merge those last windows. Unlike
perf_analyzer, an unstable level is not dropped: it is reported, flagged, and the exit code says so.

Lengthened windows (`WindowSpec.lengthenings`, sweep's --window-lengthenings). model_analyzer reruns
perf_analyzer with a longer window when it reports "Failed to obtain stable measurement"; here the
level goes on instead. When -r windows have not agreed, the window doubles: the windows measured so
far are joined in pairs, newest first (two contiguous windows of T are exactly one window of 2T under
the completion rule, so nothing is measured twice and the oldest window is dropped when their number
is odd), the stability rule is applied to the joined ones at once, and new windows of 2T follow until
-r windows of that length exist. At most `lengthenings` times, and never to a window longer than
MAX_LENGTHENED_WINDOW_S, so a level measures at most -r x -p x 2^lengthenings. Short windows on a
busy machine mostly fail on throughput swings from CPU contention (in concurrency mode Little's law
ties the average latency to throughput, so both spread alike); a longer window averages over them.
Server statistics are read at every window boundary, so the server-side figures cover exactly the
reported windows. The load may run elsewhere (perfkit.load.cluster.distributed): `sync()` after the start and after
every window end brings every sample completed by then into the buffer before the window is computed.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from perfkit.analysis import server_stats, stats
from perfkit.errors import MissingExtension, PerfkitError
from perfkit.load.generator import Clock
from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.load.schedule import ClosedLoop, Load
from perfkit.measure.resources import ResourceSampler
from perfkit.results.model import Check, LevelResult, ResourceUsage, ServerStats, WindowResult, level_name

log = logging.getLogger(__name__)
_Edge = TypeVar("_Edge")

POLL_NS = 10_000_000  # how often count windows and warmup look at the sample count
#: A lengthened window is never longer than this: with -r it bounds the time one level can take.
MAX_LENGTHENED_WINDOW_S = 30.0
#: How often sweep doubles the windows of a level that has not stabilised (--window-lengthenings).
DEFAULT_LENGTHENINGS = 2
#: perf_analyzer's -r: windows per level at most (here: at each window length).
DEFAULT_MAX_TRIALS = 10
# Error kinds that mean "no server there": a window of nothing else ends the level at once.
CONNECTION_ERRORS = ("connection", "disconnected", "grpc UNAVAILABLE")


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """perf_analyzer's measurement settings, with its defaults."""

    mode: str = "time_windows"  # time_windows | count_windows
    interval_ms: float = 5000.0
    request_count: int = 50
    stability_pct: float = 10.0
    max_trials: int = DEFAULT_MAX_TRIALS
    stable_window_count: int = 3
    percentile: float | None = None  # None: stabilise on (and report) the average latency
    warmup_request_count: int = 0
    delay_tolerance_ms: float = 1.0
    # --request-count N: send N requests (after the warm-up), one window from the first send to the
    # last answer, stable by definition (perf_analyzer's). 0: windows until stable.
    request_limit: int = 0
    # How often the window may double when -r windows have not agreed (module header); 0 is
    # perf_analyzer's rule: the level ends unstable after -r windows.
    lengthenings: int = 0

    def validate(self) -> None:
        """The measurement flags' rules, shared by sweep and tune."""
        if self.mode not in ("time_windows", "count_windows"):
            raise PerfkitError("--measurement-mode must be time_windows or count_windows")
        if self.interval_ms <= 0:
            raise PerfkitError("-p/--measurement-interval must be a positive number of milliseconds")
        if self.request_count < 1:
            raise PerfkitError("--measurement-request-count must be at least 1")
        if not 0 < self.stability_pct:
            raise PerfkitError("-s/--stability-percentage must be positive")
        if self.max_trials < self.stable_window_count:
            raise PerfkitError(
                f"-r/--max-trials must be at least {self.stable_window_count}: stability compares the last "
                f"{self.stable_window_count} windows"
            )
        if self.percentile is not None and not 0 < self.percentile < 100:
            raise PerfkitError("--percentile must be between 0 and 100 (e.g. 99 or 99.9)")
        if self.warmup_request_count < 0:
            raise PerfkitError("--warmup-request-count must not be negative")
        if self.request_limit < 0:
            raise PerfkitError(f"--request-count must be > 0, got {self.request_limit}")
        if self.lengthenings < 0:
            raise PerfkitError(f"--window-lengthenings must not be negative, got {self.lengthenings}")

    def length_text(self, scale: int = 1) -> str:
        """A window's length, `scale` times the first: "2 s", or "100 requests" for count windows."""
        if self.mode == "count_windows":
            return f"{self.request_count * scale} requests"
        return f"{self.interval_ms * scale / 1000:g} s"


class LevelLoad(Protocol):
    """What a level needs of the load generator (perfkit.load.generator or perfkit.load.cluster.distributed)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def buffer(self) -> SampleBuffer: ...

    def start(self, load: Load, request_limit: int = 0) -> None: ...

    async def sync(self) -> None: ...

    async def stop(self, drain_timeout_s: float | None = None) -> None: ...


class LevelObserver(Protocol):
    """What watches a level being measured (the console progress): its start, windows and result."""

    def level_started(self, mode: str, level: float) -> None: ...

    def window_done(
        self, level: float, window_index: int, max_trials: int, throughput: float, latency_us: float, stable: bool
    ) -> None: ...

    def level_done(self, result: LevelResult) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class LevelMeasurement:
    """A level's result plus what the profile export needs: its samples and window boundaries."""

    result: LevelResult
    samples: SampleArrays
    window_boundaries_ns: tuple[int, ...]


#: How a server answers for an extension it does not have: no such route, or no such RPC (the text
#: of the wire's TargetError, whose message quotes the status).
_NOT_OFFERED = re.compile(r"\bHTTP (?:404|405|501)\b|: UNIMPLEMENTED\b")


class ServerStatsProbe:
    """Reads the entries of the model and of the models it is composed of (`composing`) from the
    statistics extension; a failure is noted once, never raised. `fetch` must return every model's
    statistics when `composing` names any.

    A server without the extension (MLServer, KServe) answers HTTP 404 or gRPC UNIMPLEMENTED: that
    answer is trusted first, and the probe stops asking. `offered` is what the server's metadata
    says (its `extensions` lists `statistics`, or not; None: it does not say): a server that lists
    no statistics extension and fails to answer in any other way has none either. `server` names the
    server in the note (its metadata's name and version)."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[dict[str, Any]]],
        model: str,
        version: str,
        composing: server_stats.ComposingMap | None = None,
        *,
        server: str = "the server",
        offered: bool | None = None,
    ) -> None:
        self._fetch = fetch
        self.model = model
        self.version = version
        self.composing: server_stats.ComposingMap = composing or {}
        self.server = server
        self.offered = offered
        self.missing = False  # the server has no statistics extension: never asked again
        self._previous: dict[str, Any] | None = None
        self.note = ""
        self._said = ""

    def difference(self, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> ServerStats:
        """The server's figures between two snapshots, composing models included."""
        return server_stats.tree_diff(before, after, self.model, self.composing)

    async def snapshot(self) -> dict[str, dict[str, Any]] | None:
        if self.missing:
            return None
        try:
            everything = await self._fetch()
        except Exception as exc:  # the server may not offer the statistics extension
            answer = _NOT_OFFERED.search(str(exc))
            if answer or isinstance(exc, MissingExtension) or self.offered is False:
                self.missing = True
                why = "its metadata lists no statistics extension" if self.offered is False else str(exc)
                if answer:
                    why = "gRPC UNIMPLEMENTED" if answer.group().endswith("UNIMPLEMENTED") else answer.group()
                self.note = f"{self.server} has no statistics extension ({why}): no server-side latency breakdown"
            elif not self.note:
                self.note = f"no server-side statistics: {exc}"
            log.info(self.note)
            return None
        entries = server_stats.pick_tree(everything, self.model, self.version, self.composing, self._previous)
        self._previous = everything
        return entries

    def news(self) -> str:
        """The note when it has not been said yet, else "": what the console says once."""
        if self.note == self._said:
            return ""
        self._said = self.note
        return self.note


def _mode_name(load: Load) -> str:
    if isinstance(load, ClosedLoop):
        return "concurrency"
    return "custom_intervals" if load.intervals_ns else "request_rate"


def _level_value(load: Load) -> float:
    return float(load.concurrency) if isinstance(load, ClosedLoop) else load.label


async def measure_level(
    loadgen: LevelLoad,
    load: Load,
    spec: WindowSpec,
    *,
    batch_size: int,
    server: ServerStatsProbe | None = None,
    resources: ResourceSampler | None = None,
    progress: LevelObserver | None = None,
    drain_timeout_s: float | None = None,
) -> LevelMeasurement:
    """Measure one level (module header); `progress` hears of every window."""
    clock, buffer = loadgen.clock, loadgen.buffer
    mode, level = _mode_name(load), _level_value(load)
    first_index = len(buffer)
    if spec.request_limit:
        loadgen.start(load, spec.warmup_request_count + spec.request_limit)
    else:
        loadgen.start(load)
    try:
        await loadgen.sync()
        if spec.warmup_request_count:
            # Warm-up requests are sent under the same load and simply not counted.
            while len(buffer) - first_index < spec.warmup_request_count:
                await clock.sleep_until(clock.now_ns() + POLL_NS)
        window_start = clock.now_ns()
        boundaries = [window_start]
        snapshots = [await server.snapshot() if server else None]
        windows: list[WindowResult] = []
        stable = False
        threshold = spec.stability_pct / 100.0
        percentile = spec.percentile
        while spec.request_limit and not windows:
            counted = await _counted_window(loadgen, spec, first_index, batch_size)
            boundaries[0] = counted.start_ns
            windows.append(counted)
            boundaries.append(counted.end_ns)
            snapshots.append(await server.snapshot() if server else None)
            stable = True
        scale = 1  # the windows' length, in first windows (doubled by each lengthening)
        failed_lengths: list[str] = []  # each length whose -r windows did not agree
        while not spec.request_limit:
            if len(windows) >= spec.max_trials:
                if not _may_lengthen(spec, windows, len(failed_lengths), scale):
                    break
                failed_lengths.append(f"{len(windows)} of {spec.length_text(scale)}")
                if progress is not None:
                    progress.note(_lengthening_note(mode, level, spec, windows, scale, len(failed_lengths)))
                boundaries, snapshots = joined_in_pairs(boundaries), joined_in_pairs(snapshots)
                arrays = buffer.arrays(first_index)
                windows = [
                    stats.window_result(arrays, start, end, batch_size, percentile)
                    for start, end in zip(boundaries, boundaries[1:])
                ]
                scale *= 2
                stable = stats.is_stable(windows, threshold, spec.stable_window_count)
                if stable:
                    break
                continue
            await _wait_window_end(loadgen, spec, window_start, scale)
            window_end = clock.now_ns()
            await loadgen.sync()
            snapshot = await server.snapshot() if server else None
            window = stats.window_result(buffer.arrays(first_index), window_start, window_end, batch_size, percentile)
            windows.append(window)
            boundaries.append(window_end)
            snapshots.append(snapshot)
            stable = stats.is_stable(windows, threshold, spec.stable_window_count)
            if progress is not None:
                progress.window_done(
                    level, len(windows) - 1, spec.max_trials, window.throughput_infer_per_s,
                    window.stabilizing_latency_us, stable,
                )  # fmt: skip
            window_start = window_end
            if stable or _window_server_gone(buffer.arrays(first_index).completed_between(boundaries[-2], window_end)):
                break
    finally:
        await loadgen.stop(drain_timeout_s)
    reported = min(spec.stable_window_count, len(windows))
    first = len(windows) - reported
    span_start, span_end = boundaries[first], boundaries[-1]
    # --request-count: the warm-up's answers are the first ones recorded; they never count.
    all_samples = buffer.arrays(first_index + (spec.warmup_request_count if spec.request_limit else 0))
    reported_count = len(all_samples.completed_between(span_start, span_end))
    # Requests that ended while the level drained (answered, failed, or cancelled at the drain
    # timeout): in no window, yet each counted once in the level (stats.level_result).
    late = all_samples.select(all_samples.done_ns >= span_end)
    # Requests that ended before the reported span (earlier windows, the warm-up): their failures
    # are the level's too, apart from the span's figures (stats.level_result's `early`).
    measured = buffer.arrays(first_index)
    warmed = np.arange(len(measured)) < (spec.warmup_request_count if spec.request_limit else 0)
    early = measured.select(warmed | (measured.done_ns < span_start))
    before, after = snapshots[first], snapshots[-1]
    server_figures = server.difference(before, after) if server and before is not None and after is not None else None
    usage = resources.usage_between(span_start, span_end, reported_count) if resources is not None else ResourceUsage()
    if server is not None and server.note:
        usage = _with_note(usage, server.note)
    result = stats.level_result(
        mode=mode,
        level=level,
        batch_size=batch_size,
        windows=windows[first:],
        samples=all_samples,
        server=server_figures,
        resources=usage,
        stable=stable,
        all_windows=windows,
        custom_percentile=percentile,
        delay_tolerance_ns=int(spec.delay_tolerance_ms * 1e6),
        stability_threshold=threshold,
        stability_count=spec.stable_window_count,
        sequences=buffer.sequences(),
        late=late,
        early=early,
    )
    if failed_lengths:
        result = _with_lengthening(result, spec, failed_lengths, scale)
    return LevelMeasurement(result, all_samples, tuple(boundaries))


async def _counted_window(loadgen: LevelLoad, spec: WindowSpec, first_index: int, batch_size: int) -> WindowResult:
    """--request-count: once every request sent has its answer, one window from the first counted
    send to the last answer."""
    clock, buffer = loadgen.clock, loadgen.buffer
    wanted = spec.warmup_request_count + spec.request_limit
    while len(buffer) - first_index < wanted:
        await clock.sleep_until(clock.now_ns() + POLL_NS)
    counted = buffer.arrays(first_index + spec.warmup_request_count)
    start, end = int(counted.sent_ns.min()), int(counted.done_ns.max()) + 1
    return stats.window_result(counted, start, end, batch_size, spec.percentile)


async def _wait_window_end(loadgen: LevelLoad, spec: WindowSpec, window_start: int, scale: int = 1) -> None:
    """Until the window ends: `scale` times the first window's length (lengthened windows)."""
    clock, buffer = loadgen.clock, loadgen.buffer
    if spec.mode == "time_windows":
        await clock.sleep_until(window_start + int(spec.interval_ms * 1e6) * scale)
        return
    # count_windows: at least N completions in the window, and at least one second (perf_analyzer),
    # both times `scale`, as two joined windows would be.
    # Samples are recorded at completion, so those appended since the window began completed in it.
    recorded_at_start = len(buffer)
    min_end = window_start + 1_000_000_000 * scale
    while True:
        now = clock.now_ns()
        if now >= min_end and len(buffer) - recorded_at_start >= spec.request_count * scale:
            return
        await clock.sleep_until(min_end if now < min_end else now + POLL_NS)


def joined_in_pairs(edges: list[_Edge]) -> list[_Edge]:
    """What is kept at the edges of windows (their boundaries, or the server snapshots taken there)
    when the windows are joined in pairs, newest first: every other edge, counted back from the
    last; an odd oldest window has no partner and is left out."""
    return edges[(len(edges) - 1) % 2 :: 2]


def _may_lengthen(spec: WindowSpec, windows: list[WindowResult], done: int, scale: int) -> bool:
    """Whether the level's windows may double once more: lengthenings left, a doubled window within
    MAX_LENGTHENED_WINDOW_S (count windows: judged by the ones measured), and the newest window
    answered something (a level whose requests all fail has nothing to stabilise)."""
    if done >= spec.lengthenings or not windows or windows[-1].ok_count == 0:
        return False
    if spec.mode == "time_windows":
        seconds = spec.interval_ms * scale / 1000
    else:
        seconds = sum(w.end_ns - w.start_ns for w in windows) / len(windows) / 1e9
    return 2 * seconds <= MAX_LENGTHENED_WINDOW_S


def _spread_text(windows: list[WindowResult], count: int) -> str:
    last = windows[-count:]
    tp = stats.spread([w.throughput_infer_per_s for w in last]) - 1.0
    lat = stats.spread([w.stabilizing_latency_us for w in last]) - 1.0
    return f"throughput {tp * 100:.0f}%, latency {lat * 100:.0f}% apart"


def _lengthening_note(mode: str, level: float, spec: WindowSpec, windows: list[WindowResult], scale: int,
                      nth: int) -> str:  # fmt: skip
    return (
        f"{level_name(mode, level)}: {len(windows)} windows of {spec.length_text(scale)} did not agree within "
        f"{spec.stability_pct:g}% (last {spec.stable_window_count}: {_spread_text(windows, spec.stable_window_count)}): "
        f"lengthening the windows to {spec.length_text(scale * 2)}, the ones measured joined in pairs "
        f"({nth} of --window-lengthenings {spec.lengthenings})"
    )


_LENGTHENED_ADVICE = (
    "start with longer windows (-p / --measurement-interval MS), lengthen them more often (--window-lengthenings N), "
    "allow more windows (-r / --max-trials N), or accept more spread (-s / --stability-percentage PCT); on a busy "
    "machine, measure when it is quieter"
)


def _with_lengthening(result: LevelResult, spec: WindowSpec, failed: list[str], scale: int) -> LevelResult:
    """The level's stability check says its windows were lengthened, from what to what and why."""
    how = (
        f"windows lengthened from {spec.length_text()} to {spec.length_text(scale)} "
        f"({' and '.join(failed)} did not agree)"
    )
    if not result.stable and len(failed) >= spec.lengthenings:
        how += f"; --window-lengthenings {spec.lengthenings} allows no more"
    elif not result.stable:
        how += f"; a longer window would pass {MAX_LENGTHENED_WINDOW_S:g} s"

    def noted(check: Check) -> Check:
        if check.name != "stable":
            return check
        advice = _LENGTHENED_ADVICE if check.advice else ""
        return dataclasses.replace(check, detail=f"{check.detail}; {how}", advice=advice)

    return dataclasses.replace(result, checks=tuple(noted(check) for check in result.checks))


def server_gone(errors: Mapping[str, int], ok_count: int, *, timeouts: bool = True) -> bool:
    """Every request failed for lack of a server: refused, reset, unavailable, or (with `timeouts`)
    timed out; `ok_count` counts every answer (a level's: its late answers too, `late_ok_count`). A level like that ends a sweep or a tune. A level's windows end early on connection
    failures only: timeouts there may be a stall the server recovers from within the level."""
    kinds = (*CONNECTION_ERRORS, "timeout") if timeouts else CONNECTION_ERRORS
    return ok_count == 0 and bool(errors) and all(kind.startswith(kinds) for kind in errors)


def _window_server_gone(window: SampleArrays) -> bool:
    """The window's requests all failed for lack of a server: more windows would only wait."""
    errors = window.error_counts()
    return server_gone(errors, len(window) - sum(errors.values()), timeouts=False)


async def observe_level(observer: LevelObserver, loadgen: LevelLoad, load: Load, spec: WindowSpec, *, batch_size: int,
                        server: ServerStatsProbe | None, resources: ResourceSampler | None, drain_timeout_s: float,
                        finish: Callable[[LevelMeasurement], LevelMeasurement] | None = None) -> LevelMeasurement:  # fmt: skip
    """`measure_level` as sweep and tune run it, with `observer` told of the level's start, its
    windows and its result; `finish` completes and keeps the level before it is reported."""
    observer.level_started(_mode_name(load), _level_value(load))
    measurement = await measure_level(loadgen, load, spec, batch_size=batch_size, server=server, resources=resources,
                                      progress=observer, drain_timeout_s=drain_timeout_s)  # fmt: skip
    if server is not None and (news := server.news()):
        observer.note(news)  # once per run: the probe lives as long as the sweep or the tune
    if finish is not None:
        measurement = finish(measurement)
    observer.level_done(measurement.result)
    return measurement


def _with_note(usage: ResourceUsage, note: str) -> ResourceUsage:
    return dataclasses.replace(usage, notes=(*usage.notes, note))
