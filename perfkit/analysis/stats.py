"""Statistics of a load level, computed after the fact from raw samples: windows, percentiles,
stability, confidence intervals and the validity verdict. Pure functions; no clock, no I/O.

Theory of operation
===================

*Which requests count in a window.* The measurement runs contiguous windows; a request belongs to
the window in which it **completed**, whenever it was sent (perf_analyzer
`InferenceProfiler::ValidLatencyMeasurement`, src/inference_profiler.cc). A request sent in
window 1 that completes in window 2 counts in window 2 only. Windows here are half-open,
[start, end), so a completion on a boundary counts once (perf_analyzer uses closed ranges and
removes records once counted, to the same effect). Failed requests are counted and reported by
kind but excluded from throughput and latency. Throughput = successful requests × batch size /
window seconds.

*Stability* is perf_analyzer's rule exactly (`DetermineStability`, `IsInferWindowStable`,
`IsLatencyWindowStable`): look at the last 3 windows (`stability_window`, hard-coded); the level
is stable when none of them has zero throughput and, for throughput and for the *stabilizing
latency* (the average service latency, or the `--percentile` latency), max/min <= 1 + threshold
(`-s 10` → 0.10; up to `-r 10` windows; command_line_parser.h). A window without a single
successful request gets throughput 0 and latency +inf (perf_analyzer records UINT64_MAX), so it
is never part of a stable triple. One deliberate difference: when max == min the ratio is taken
as 1 even if both are 0, where perf_analyzer's 0.0/0.0 = NaN would call the triple unstable (only
a fake clock produces zero latencies). The reported result merges the last 3 windows as
perf_analyzer's `MergePerfStatusReports` does: counts are summed, latencies concatenated and
percentiles recomputed, throughput = Σ successes × batch / Σ window durations.

*Percentiles* use perf_analyzer's nearest rank on the sorted values, index
`int((p/100)·(n−1) + 0.5)` (`SummarizeLatency`). They are exact over the samples of one process
(STYLE practice 8); mergeable histograms are for long runs and many workers.

*Coordinated omission and why we report two latencies.* Service latency = completion − actual
send is what perf_analyzer reports (`RequestRecord::start_time_` is taken when the request is
sent). When the server stalls, a load generator that cannot send on schedule sends late, and the
requests that *should* have been sent during the stall are timed from their late send: the stall
shows up in one request instead of in all of them (wrk2 README "coordinated omission";
triton-inference-server/server#3113). Latency from the **intended** send time (wrk2; MLPerf
LoadGen's `sched.delta(complete_begin_time)`) charges the generator's lag to the requests, as a
user arriving on schedule would experience it. We report both: `latency` (perf_analyzer
comparable) and `latency_from_intended` (corrected), plus the share of requests sent more than
1 ms late (`delayed_pct`; perf_analyzer's `delay_tolerance_` of 1 ms, PR #312, and its warning
above 1 %). In closed-loop concurrency mode intended == sent, so the two are equal: that mode is
coordinated by construction, which is what it models.

*Confidence intervals.* Throughput: Student-t interval of the mean of the per-window throughputs
of the reported windows, df = n − 1 (windows treated as independent; autocorrelated load makes the
interval optimistic). The t quantile is computed exactly for integer df from the closed-form
Student-t distribution (Abramowitz & Stegun 26.7.3–4; `significance.student_t_quantile`), no scipy. p99: a distribution-free interval
from order statistics (Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2): the number
B of samples at or below the true q-quantile is Binomial(n, q), so [x_(r), x_(s)] covers it with
probability P(r <= B <= s − 1). With the normal approximation, r = ⌊nq − 1.96·√(nq(1−q))⌋ and
s = ⌈nq + 1.96·√(nq(1−q))⌉ + 1 (1-based ranks), clamped to [1, n]. An upper rank clamped to n
means the sample is too small to bound the percentile from above: the bound is just the maximum.

*Minimum sample counts* for a percentile follow MLPerf LoadGen's early stopping
(loadgen/early_stopping.cc, 99 % confidence, one over-latency request tolerated): the smallest n
with P(Binomial(n, 1 − q) <= 1) <= 0.01, which gives 64 for p90, 662 for p99 and 6636 for p99.9.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from perfkit.analysis.server_stats import network_server_us
from perfkit.analysis.significance import student_t_quantile
from perfkit.load.clocks import RealClock
from perfkit.load.samples import SampleArrays, SequenceArrays
from perfkit.results.model import (
    Check,
    EndpointFigures,
    LatencyStats,
    LevelResult,
    ResourceUsage,
    ResponseStats,
    ServerStats,
    WindowResult,
)

#: perf_analyzer's `delay_tolerance_`: a send more than this late is "delayed".
DELAY_TOLERANCE_NS = 1_000_000
#: perf_analyzer's DELAY_PCT_THRESHOLD: above this share of delayed sends the schedule was not kept.
DELAY_PCT_LIMIT = 1.0
#: perf_analyzer's `stability_window`.
STABILITY_WINDOWS = 3
MIN_DURATION_S = 1.0
#: Share of one core above which the (single event loop) client is probably the bottleneck.
CLIENT_CPU_LIMIT_PCT = 90.0
#: MLPerf LoadGen's early-stopping confidence.
EARLY_STOPPING_CONFIDENCE = 0.99

_Z95 = 1.959963984540054
_REPORTED_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile_rank(sorted_values: npt.ArrayLike, p: float) -> float:
    """perf_analyzer's nearest-rank percentile of ascending values: index int((p/100)(n−1) + 0.5).

    Returns 0.0 for no values."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile {p} is outside [0, 100]")
    values = np.asarray(sorted_values)
    n = len(values)
    if n == 0:
        return 0.0
    return float(values[min(int((p / 100.0) * (n - 1) + 0.5), n - 1)])


def percentile_ci(sorted_values: npt.ArrayLike, p: float, z: float = _Z95) -> tuple[float, float]:
    """Distribution-free confidence interval of the p-th percentile from order statistics (module
    header); (0.0, 0.0) for no values."""
    values = np.asarray(sorted_values)
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    q = p / 100.0
    half = z * math.sqrt(n * q * (1.0 - q))
    low_rank = min(max(math.floor(n * q - half), 1), n)
    high_rank = min(max(math.ceil(n * q + half) + 1, 1), n)
    return float(values[low_rank - 1]), float(values[high_rank - 1])


def latency_stats(latencies_ns: npt.ArrayLike, custom_percentile: float | None = None) -> LatencyStats:
    """Distribution of latencies given in ns, reported in µs. Empty input gives zeros."""
    values = np.sort(np.asarray(latencies_ns, dtype=np.int64))
    n = len(values)
    if n == 0:
        return LatencyStats(custom_percentile=custom_percentile, custom_us=None if custom_percentile is None else 0.0)
    p50, p90, p95, p99, p999 = (percentile_rank(values, p) / 1e3 for p in _REPORTED_PERCENTILES)
    ci_low, ci_high = percentile_ci(values, 99.0)
    return LatencyStats(
        count=n,
        mean_us=float(values.mean()) / 1e3,
        std_us=float(values.std(ddof=1)) / 1e3 if n > 1 else 0.0,
        min_us=float(values[0]) / 1e3,
        max_us=float(values[-1]) / 1e3,
        p50_us=p50,
        p90_us=p90,
        p95_us=p95,
        p99_us=p99,
        p999_us=p999,
        p99_ci_low_us=ci_low / 1e3,
        p99_ci_high_us=ci_high / 1e3,
        custom_percentile=custom_percentile,
        custom_us=None if custom_percentile is None else percentile_rank(values, custom_percentile) / 1e3,
    )


def window_result(
    samples: SampleArrays, start_ns: int, end_ns: int, batch_size: int, stabilizing_percentile: float | None = None
) -> WindowResult:
    """One window: the requests that completed in [start_ns, end_ns), perf_analyzer's rule.

    The stabilizing latency is the mean service latency (done − sent) of the successful requests,
    or their `stabilizing_percentile`; a window without a successful request has throughput 0 and
    latency +inf, and is never stable."""
    if end_ns <= start_ns:
        raise ValueError(f"window end {end_ns} is not after its start {start_ns}")
    counted = samples.completed_between(start_ns, end_ns)
    ok = counted.ok
    ok_count = int(ok.sum())
    if ok_count == 0:
        throughput, latency_us = 0.0, math.inf
    else:
        throughput = ok_count * batch_size / ((end_ns - start_ns) / 1e9)
        latencies = counted.done_ns[ok] - counted.sent_ns[ok]
        if stabilizing_percentile is None:
            latency_us = float(latencies.mean()) / 1e3
        else:
            latency_us = percentile_rank(np.sort(latencies), stabilizing_percentile) / 1e3
    return WindowResult(
        start_ns=start_ns,
        end_ns=end_ns,
        request_count=len(counted),
        ok_count=ok_count,
        error_count=len(counted) - ok_count,
        throughput_infer_per_s=throughput,
        stabilizing_latency_us=latency_us,
    )


def spread(values: Sequence[float]) -> float:
    """max/min as the stability rule compares it: 1.0 when all are equal, +inf when min <= 0 or
    a value is infinite."""
    high, low = max(values), min(values)
    if high == low and math.isfinite(high):
        return 1.0
    if low <= 0.0 or not math.isfinite(high):
        return math.inf
    return high / low


def is_stable(windows: Sequence[WindowResult], threshold: float, count: int = STABILITY_WINDOWS) -> bool:
    """perf_analyzer's rule: the last `count` windows exist, none has zero throughput, and max/min
    of their throughputs and of their stabilizing latencies are both <= 1 + threshold."""
    if count < 1:
        raise ValueError(f"stability needs at least one window, not {count}")
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.throughput_infer_per_s == 0.0 for w in last):
        return False
    limit = 1.0 + threshold
    return (
        spread([w.throughput_infer_per_s for w in last]) <= limit
        and spread([w.stabilizing_latency_us for w in last]) <= limit
    )


def throughput_ci(windows: Sequence[WindowResult], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean per-window throughput (df = n − 1), floored at 0; one window
    gives (x, x) and none (0, 0)."""
    values = np.array([w.throughput_infer_per_s for w in windows], dtype=np.float64)
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = float(values.mean())
    if n == 1:
        return mean, mean
    half = student_t_quantile(confidence, n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
    return max(mean - half, 0.0), mean + half


def reported_windows(windows: Sequence[WindowResult], count: int = STABILITY_WINDOWS) -> tuple[WindowResult, ...]:
    """The windows a level reports: the last `count`, or all when fewer."""
    return tuple(windows[-count:])


def min_requests_for_percentile(p: float, confidence: float = EARLY_STOPPING_CONFIDENCE) -> int:
    """MLPerf early stopping's minimum sample count for percentile p (0 < p < 100): the smallest n
    with P(Binomial(n, 1 − p/100) <= 1) <= 1 − confidence. 64 for p90, 662 for p99."""
    if not 0.0 < p < 100.0:
        raise ValueError(f"percentile {p} is outside (0, 100)")
    q = p / 100.0
    log_alpha = math.log(1.0 - confidence)
    # P = q^n + n(1−q)q^(n−1) >= q^n, so no n below log(alpha)/log(q) can pass.
    n = max(1, math.floor(log_alpha / math.log(q)))
    while (n - 1) * math.log(q) + math.log(q + n * (1.0 - q)) > log_alpha:
        n += 1
    return n


def response_stats(ok: SampleArrays, duration_s: float) -> ResponseStats | None:
    """Every response of the streamed requests among `ok` (successful requests of the reported
    windows), or None when none was streamed. A request whose final flag came with no response
    before it counts in `responses_per_request` as 0 and has no first-response latency."""
    streamed = ok.select(ok.responses >= 0)
    if not len(streamed):
        return None
    count = int(streamed.responses.sum())
    answered = streamed.responses > 0
    return ResponseStats(
        response_count=count,
        responses_per_request=count / len(streamed),
        throughput_response_per_s=count / duration_s if duration_s > 0 else 0.0,
        first_response=latency_stats(streamed.first_ns[answered] - streamed.sent_ns[answered]),
        gap=latency_stats(streamed.gaps_ns),
    )


def _in_windows(times_ns: npt.NDArray[np.int64], windows: Sequence[WindowResult]) -> npt.NDArray[np.bool_]:
    mask = np.zeros(len(times_ns), dtype=np.bool_)
    for w in windows:
        mask |= (times_ns >= w.start_ns) & (times_ns < w.end_ns)
    return mask


def level_result(
    *,
    mode: str,
    level: float,
    batch_size: int,
    windows: Sequence[WindowResult],
    samples: SampleArrays,
    server: ServerStats | None,
    resources: ResourceUsage,
    stable: bool,
    custom_percentile: float | None = None,
    delay_tolerance_ns: int = DELAY_TOLERANCE_NS,
    stability_threshold: float = 0.1,
    stability_count: int = STABILITY_WINDOWS,
    all_windows: Sequence[WindowResult] | None = None,
    sequences: SequenceArrays | None = None,
    late: SampleArrays | None = None,
    early: SampleArrays | None = None,
) -> LevelResult:
    """The result of one load level from its reported windows (see `reported_windows`).

    `samples` may hold every sample of the level: statistics use the requests that completed in a
    reported window, and the send rate counts the requests *sent* in one (including those that
    completed later, which only a superset can show). `all_windows`, every window measured, is
    what the result records as `windows` when given; the statistics use `windows` only.
    `sequences` (a sequence model's finished sequences) count in the window of their last answer.
    `late`: the requests that ended after the last window (while the level drained). They are in no
    window's figures, but each is counted once: its failure in `errors` (and in `request_count`),
    its answer in `late_ok_count`, both in `late_count`. `early`: the requests that ended before the
    reported windows (earlier windows, the warm-up); their failures are `early_errors`, apart from
    the reported span's counts."""
    windows = tuple(windows)
    duration_s = sum(w.end_ns - w.start_ns for w in windows) / 1e9
    counted = samples.select(_in_windows(samples.done_ns, windows))
    ok = counted.select(counted.ok)
    n, ok_count = len(counted), len(ok)
    lag_ns = counted.sent_ns - counted.intended_ns
    latency = latency_stats(ok.done_ns - ok.sent_ns, custom_percentile)
    send_us = float(ok.send_ns.mean()) / 1e3 if ok_count else 0.0
    recv_us = float(ok.recv_ns.mean()) / 1e3 if ok_count else 0.0
    if server is not None:
        network_us = network_server_us(latency.mean_us, send_us, recv_us, server)
    else:
        network_us = max(latency.mean_us - send_us - recv_us, 0.0)
    ci_low, ci_high = throughput_ci(windows)
    late_ok = int(late.ok.sum()) if late is not None else 0
    late_failed = len(late) - late_ok if late is not None else 0
    errors = _errors_of(counted, *([late] if late is not None else []))
    result = LevelResult(
        mode=mode,
        level=level,
        batch_size=batch_size,
        stable=stable,
        duration_s=duration_s,
        request_count=n + late_failed,
        ok_count=ok_count,
        error_count=n - ok_count + late_failed,
        errors=errors,
        throughput_infer_per_s=ok_count * batch_size / duration_s if duration_s > 0 else 0.0,
        throughput_ci_low=ci_low,
        throughput_ci_high=ci_high,
        send_rate_per_s=int(_in_windows(samples.sent_ns, windows).sum()) / duration_s if duration_s > 0 else 0.0,
        latency=latency,
        latency_from_intended=latency_stats(ok.done_ns - ok.intended_ns, custom_percentile),
        delayed_pct=100.0 * int((lag_ns > delay_tolerance_ns).sum()) / n if n else 0.0,
        max_send_lag_us=max(float(lag_ns.max()), 0.0) / 1e3 if n else 0.0,
        client_send_us=send_us,
        client_recv_us=recv_us,
        network_server_us=network_us,
        server=server,
        resources=resources,
        windows=tuple(all_windows) if all_windows is not None else windows,
        checks=(),
        bytes_out_per_request=float(counted.bytes_out.mean()) if n else 0.0,
        bytes_in_per_request=float(counted.bytes_in.mean()) if n else 0.0,
        responses=response_stats(ok, duration_s),
        late_count=len(late) if late is not None else 0,
        late_ok_count=late_ok,
        early_error_count=int((~early.ok).sum()) if early is not None else 0,
        early_errors=early.error_counts() if early is not None else {},
    )
    if sequences is not None and len(sequences):
        result = _with_sequences(result, sequences, windows, duration_s, custom_percentile)
    checks = validity_checks(
        result,
        stability_threshold=stability_threshold,
        stability_count=stability_count,
        delay_tolerance_ns=delay_tolerance_ns,
    )
    return dataclasses.replace(result, checks=checks)


def _with_sequences(
    result: LevelResult,
    sequences: SequenceArrays,
    windows: Sequence[WindowResult],
    duration_s: float,
    custom_percentile: float | None,
) -> LevelResult:
    """The per-sequence figures: sequences whose last answer came in a reported window."""
    inside = _in_windows(sequences.done_ns, windows)
    ok = inside & sequences.ok
    latency = latency_stats(sequences.done_ns[ok] - sequences.first_sent_ns[ok], custom_percentile)
    return dataclasses.replace(
        result,
        sequence_count=int(inside.sum()),
        sequence_throughput_per_s=int(ok.sum()) / duration_s if duration_s > 0 else 0.0,
        sequence_latency=latency,
    )


_STABILITY_ADVICE = (
    "measure longer windows (-p / --measurement-interval MS), allow more windows (-r / --max-trials N), "
    "or accept more spread (-s / --stability-percentage PCT)"
)


# A client under this share of one core that still sent late, by less than this, was waiting for
# its CPU to wake, not short of CPU.
IDLE_CLIENT_CPU_PCT = 30.0
WAKE_LAG_US = 50_000.0


def _schedule_advice(client_cpu_pct: float | None, max_lag_us: float) -> str:
    if client_cpu_pct is not None and client_cpu_pct < IDLE_CLIENT_CPU_PCT and max_lag_us < WAKE_LAG_US:
        return (
            f"the client was mostly idle ({client_cpu_pct:.0f}% of one core) and the lags short: this machine "
            "wakes its CPUs late from idle (usual on VMs; perfkit's clock already wakes early by its own "
            f"lateness, up to {RealClock.MAX_LEAD_NS / 1e6:g} ms); latency_from_intended carries the lag and stays right; for sends on time "
            "to the millisecond, measure from a machine whose CPUs do not idle deeply (bare metal, a busier "
            "client, or a VM with guest halt-polling)"
        )
    return (
        "the load generator could not keep the schedule: results understate latency (compare "
        "latency_from_intended) and the offered rate was not reached; lower --request-rate-range "
        "or run the client on a machine with spare CPU"
    )


def _check(name: str, passed: bool, detail: str, advice: str) -> Check:
    return Check(name, passed, detail, "" if passed else advice)


def _early_failures_text(level: LevelResult) -> str:
    """The failures before the reported windows, which the counts before it leave out."""
    if not level.early_error_count:
        return ""
    kinds = ", ".join(f"{kind} × {count}" for kind, count in sorted(level.early_errors.items()))
    return f"; {level.early_error_count} failed before the reported windows: {kinds}"


def validity_checks(
    level: LevelResult,
    *,
    stability_threshold: float = 0.1,
    stability_count: int = STABILITY_WINDOWS,
    percentile: float | None = None,
    delay_tolerance_ns: int = DELAY_TOLERANCE_NS,
) -> tuple[Check, ...]:
    """The validity verdict of a level, each criterion with what to do when it fails.

    The stability detail looks at the last `stability_count` of `level.windows`. `percentile` is
    the one the result is judged on (default: `--percentile`, else 99). Criteria that do not apply
    are left out: late sends outside rate modes, client CPU when not measured."""
    if percentile is None:
        percentile = level.latency.custom_percentile if level.latency.custom_percentile is not None else 99.0
    checks = [_stability_check(level, stability_threshold, stability_count)]
    if 0.0 < percentile < 100.0:
        needed = min_requests_for_percentile(percentile)
        checks.append(_check(
            "sample_count", level.ok_count >= needed,
            f"{level.ok_count} successful requests measured; a p{percentile:g} needs {needed} "
            "(MLPerf early stopping, 99% confidence)",
            "measure longer (-p / --measurement-interval MS), or use --measurement-mode count_windows "
            f"with --measurement-request-count {math.ceil(needed / STABILITY_WINDOWS)}",
        ))  # fmt: skip
    kinds = ", ".join(f"{kind} × {count}" for kind, count in sorted(level.errors.items()))
    checks.append(_check(
        "errors", level.error_count == 0 and level.early_error_count == 0,
        f"{level.error_count} of {level.request_count} requests failed" + (f": {kinds}" if kinds else "")
        + (f" ({late} after the last window)" if (late := level.late_count - level.late_ok_count) else "")
        + _early_failures_text(level),
        "failed requests are left out of throughput and latency; read the server's log, and lower the load "
        "(--concurrency-range / --request-rate-range) if the server is rejecting or timing out requests",
    ))  # fmt: skip
    cpu = level.resources.client_cpu_pct
    if level.mode != "concurrency":
        checks.append(_check(
            "schedule", level.delayed_pct <= DELAY_PCT_LIMIT,
            f"{level.delayed_pct:.2f}% of requests were sent more than {delay_tolerance_ns / 1e6:g} ms late "
            f"(limit {DELAY_PCT_LIMIT:g}%; largest lag {level.max_send_lag_us / 1e3:.1f} ms)",
            _schedule_advice(cpu, level.max_send_lag_us),
        ))  # fmt: skip
    if cpu is not None:
        checks.append(_check(
            "client_cpu", cpu <= CLIENT_CPU_LIMIT_PCT,
            f"the client used {cpu:.0f}% of one CPU core (limit {CLIENT_CPU_LIMIT_PCT:g}%)",
            "the client may be the bottleneck; lower the load (--concurrency-range / --request-rate-range) "
            "or run perfkit on a machine with spare CPU",
        ))  # fmt: skip
    checks.append(_check(
        "duration", level.duration_s >= MIN_DURATION_S,
        f"the reported windows last {level.duration_s:.2f} s (minimum {MIN_DURATION_S:g} s)",
        "measure longer windows (-p / --measurement-interval MS)",
    ))  # fmt: skip
    return tuple(checks)


def _stability_check(level: LevelResult, threshold: float, count: int) -> Check:
    windows = level.windows[-count:]
    limit = f"{threshold * 100:g}%"
    if level.stable:
        return Check("stable", True, f"the last {len(windows)} windows agree within {limit}")
    if len(level.windows) < count:
        detail = f"only {len(level.windows)} window(s) measured; stability needs {count}"
    elif any(w.ok_count == 0 for w in windows):
        detail = "a window completed no successful request"
    else:
        tp = spread([w.throughput_infer_per_s for w in windows]) - 1.0
        lat = spread([w.stabilizing_latency_us for w in windows]) - 1.0
        detail = (
            f"the last {len(windows)} windows differ by {tp * 100:.1f}% in throughput and {lat * 100:.1f}% "
            f"in latency (limit {limit})"
        )
    return Check("stable", False, detail, _STABILITY_ADVICE)


def _errors_of(*parts: SampleArrays) -> dict[str, int]:
    """The failures of several sets of samples, by kind (a level's reported span and its late ones)."""
    errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part.error_counts())
    return dict(errors)


def endpoint_figures(
    url: str, samples: SampleArrays, start_ns: int, end_ns: int, batch_size: int, percentile: float | None = None
) -> EndpointFigures:
    """One endpoint's share of a level (`-u A,B`): its requests that completed in [start_ns, end_ns),
    counted, timed and divided by the span as the level's own figures are; and, as the level counts
    them, its requests sent before `end_ns` that failed after it."""
    span = samples.completed_between(start_ns, end_ns)
    ok = span.ok
    ok_count = int(ok.sum())
    late = samples.select((samples.sent_ns < end_ns) & (samples.done_ns >= end_ns))
    late_failed = len(late) - int(late.ok.sum())
    seconds = (end_ns - start_ns) / 1e9
    return EndpointFigures(
        url=url,
        request_count=len(span) + late_failed,
        ok_count=ok_count,
        error_count=len(span) - ok_count + late_failed,
        errors=_errors_of(span, late),
        throughput_infer_per_s=ok_count * batch_size / seconds if seconds > 0 else 0.0,
        latency=latency_stats((span.done_ns - span.sent_ns)[ok], percentile),
    )


# --------------------------------------------------------------------------------------------------
# Generative levels

#: The percentile a generative level is judged on when --percentile is not given. Its figures are
#: per-request distributions (TTFT, ITL, end-to-end latency, each one value a request, as AIPerf
#: defines them), and requests come a few per second at LLM speeds: a p99 needs 662 of them
#: (minutes a level), a p90 64. p90 is what genai-perf and AIPerf print beside p99 and what
#: DistServe's SLO attainment uses; --percentile 99 asks for p99 (and the default windows grow).
GENERATIVE_PERCENTILE = 90.0

#: A generative level's default windows: count windows (perf_analyzer's count_windows) of at
#: least this many requests. The stability rule compares windows' mean latency and throughput; the
#: mean of N requests varies as CV/sqrt(N), so 100 a window keep three windows within 10% for a
#: latency CV up to about 0.3 (outputs of varying length), where 5 s time windows at LLM speeds hold
#: 20 requests and differ by whichever requests happened to finish inside (13 vs 16 req/s). Count
#: windows start and end on a completion, so that edge effect is gone too. AIPerf measures a
#: request count, max(10, 2 x concurrency), with no stability rule at all.
GENERATIVE_WINDOW_REQUESTS = 100
#: ... and at least this many per request in flight (closed loop), so that each slot finishes many
#: requests a window and a continuous-batching engine's bursts of completions (up to its batch at
#: one decode step) stay a small part of a window.
GENERATIVE_REQUESTS_PER_SLOT = 10
#: ... and, on a schedule (open loop), at least this many seconds of arrivals (perf_analyzer's 5 s).
GENERATIVE_WINDOW_S = 5.0


def token_sample_check(level: LevelResult) -> Check:
    """`sample_count` for a generative level: enough requests behind each of its per-request
    figures that were measured (TTFT and ITL need streaming; ITL a second output token) for the
    judged percentile (--percentile, else GENERATIVE_PERCENTILE)."""
    tokens = level.tokens
    percentile = level.latency.custom_percentile or GENERATIVE_PERCENTILE
    needed = min_requests_for_percentile(percentile)
    counts = {"latency": level.ok_count}
    if tokens is not None:
        counts |= {name: n for name, n in (("TTFT", tokens.ttft_ms.count), ("ITL", tokens.itl_ms.count)) if n}
    short = [name for name, n in counts.items() if n < needed]
    output_tokens = round(tokens.output_tokens.mean * tokens.output_tokens.count) if tokens is not None else 0
    figures = "; ".join(f"{n:,} with {'an' if name == 'ITL' else 'a'} {name}" for name, n in counts.items() if name != "latency")
    detail = (f"{level.ok_count:,} successful requests measured ({figures + '; ' if figures else ''}"
              f"{output_tokens:,} output tokens); a p{percentile:g} needs {needed} (MLPerf early stopping, 99% "
              "confidence)")  # fmt: skip
    if short:
        detail += f": too few for the {', '.join(short)} p{percentile:g}"
    return _check(
        "sample_count", not short, detail,
        f"measure more requests a window (--measurement-request-count N, or --measurement-mode time_windows "
        f"with a longer -p); three windows need {needed} requests in all",
    )  # fmt: skip
