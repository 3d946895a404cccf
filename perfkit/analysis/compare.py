"""Baseline against candidate: is the candidate slower, beyond a threshold *and* beyond noise?

Theory of operation
===================

A gate that fails on a fixed percentage alone fails on noise: two runs of the same build on the
same machine differ by a few percent, more on a shared CI runner. A gate on significance alone
fails on differences too small to matter once enough data is collected. So a metric at a level is a
**regression only when both hold** (asv `compare.py::_is_result_better`, pytest-benchmark
`RegressionCheck`; STYLE practice 17):

1. the change is worse than the threshold (`--max-throughput-drop`, `--max-latency-increase`), and
2. the change is larger than the runs' own variability:

   * throughput, and latencies other than p99: each run measured several contiguous windows per
     level (`LevelResult.windows`), which are independent-ish samples of the level's throughput and
     of its stabilising latency (the mean, or `--percentile`'s). The two sets are compared with a
     two-sided **Mann–Whitney U** test when the sample sizes can reach significance at all
     (its smallest p-value is 2 / C(m+n, m): 0.1 for 3 windows against 3, 0.029 for 4 against 4),
     and with **Welch's t** test otherwise, as asv falls back when Mann–Whitney cannot decide
     (asv `_stats.py::is_different`). Both are computed here without scipy: the exact null
     distribution of U by the Mann–Whitney recursion, and Student's t through the regularised
     incomplete beta function (Numerical Recipes, 3rd ed., §6.4, modified Lentz continued fraction).
   * p99 (and p99 from the intended send time): the result stores a distribution-free 95 %
     confidence interval of p99 from order statistics; the change is significant when the two
     intervals do not overlap.

Levels are matched by load mode, level and batch size. Runs that did not measure the same levels
cannot be compared level by level, and that is a usage error (exit 2), not a pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal
from xml.etree import ElementTree as ET

from perfkit.errors import PerfkitError
from perfkit.results.model import LatencyStats, LevelResult, SweepResult, level_name

__all__ = [
    "GATE_METRICS",
    "Comparison",
    "GateMetric",
    "MetricDelta",
    "Significance",
    "Thresholds",
    "compare_sweeps",
    "level_label",
    "mann_whitney_u",
    "parse_percent",
    "JUnitCase",
    "comparison_cases",
    "comparison_properties",
    "render_comparison_lines",
    "render_junit",
    "welch_t_test",
]

DEFAULT_ALPHA = 0.05


# --------------------------------------------------------------------------------------------------
# Two-sample tests


def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings of m x's and n y's give U = u, for u = 0..mn. Built from
    the recursion N(m, n, u) = N(m−1, n, u−n) + N(m, n−1, u) (Mann & Whitney 1947): the largest of
    all m+n values is either an x, beating all n y's, or a y, beating nothing."""
    # rows[j] holds N(i, j, ·) for the current i; start with i = 0: one ordering, U = 0.
    rows = [[1] for _ in range(n + 1)]
    for i in range(1, m + 1):
        new = [[1]]  # N(i, 0, ·): U = 0 only
        for j in range(1, n + 1):
            left = new[j - 1]  # N(i, j−1, ·)
            up = rows[j]  # N(i−1, j, ·), shifted by j
            size = i * j + 1
            counts = [0] * size
            for u, c in enumerate(left):
                counts[u] += c
            for u, c in enumerate(up):
                counts[u + j] += c
            new.append(counts)
        rows = new
    return rows[n]


def mann_whitney_u(x: Sequence[float], y: Sequence[float], exact: bool | None = None) -> tuple[float, float]:
    """Two-sided Mann–Whitney U test: (U of x, p). Exact (by default up to 20 values a side; ties
    counted as one half, then the p-value rounded the conservative way), else the normal
    approximation with tie and continuity corrections."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("Mann–Whitney U needs values on both sides")
    u = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    extreme = min(u, m * n - u)  # distance into the nearer tail
    if exact if exact is not None else max(m, n) <= 20:
        counts = _u_counts(m, n)
        tail = sum(counts[: math.ceil(extreme) + 1])
        return u, min(1.0, 2.0 * tail / math.comb(m + n, m))
    values = sorted([*x, *y])
    tie_term = 0.0
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        t = j - i
        tie_term += t**3 - t
        i = j
    total = m + n
    variance = m * n / 12.0 * ((total + 1) - tie_term / (total * (total - 1)))
    if variance <= 0:
        return u, 1.0
    z = (abs(u - m * n / 2.0) - 0.5) / math.sqrt(variance)  # continuity correction
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def mann_whitney_min_p(m: int, n: int) -> float:
    """The smallest two-sided p-value the exact test can give for these sample sizes."""
    return min(1.0, 2.0 / math.comb(m + n, m))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function, modified Lentz's method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for k in range(1, 500):
        for numerator in (
            k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k)),
            -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def welch_t_test(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t test, two-sided: (t, degrees of freedom, p). Needs two values a
    side; identical constant samples give p = 1, different constant samples p = 0."""
    m, n = len(x), len(y)
    if m < 2 or n < 2:
        raise ValueError("Welch's t test needs at least two values a side")
    mean_x, mean_y = sum(x) / m, sum(y) / n
    var_x = sum((v - mean_x) ** 2 for v in x) / (m - 1)
    var_y = sum((v - mean_y) ** 2 for v in y) / (n - 1)
    se2 = var_x / m + var_y / n
    if se2 == 0.0:
        return (
            (0.0, float(m + n - 2), 1.0) if mean_x == mean_y else (math.copysign(math.inf, mean_x - mean_y), 0.0, 0.0)
        )
    t = (mean_x - mean_y) / math.sqrt(se2)
    df = se2**2 / ((var_x / m) ** 2 / (m - 1) + (var_y / n) ** 2 / (n - 1))
    return t, df, regularized_beta(df / 2.0, 0.5, df / (df + t * t))


# --------------------------------------------------------------------------------------------------
# The metrics a gate can look at


@dataclass(frozen=True, slots=True)
class Significance:
    """Whether two runs differ beyond their own variability, and how that was decided."""

    significant: bool
    method: str
    p_value: float | None = None
    detail: str = ""


def windows_differ(a: Sequence[float], b: Sequence[float], alpha: float, what: str) -> Significance:
    """Mann–Whitney U on per-window values when it can reach `alpha`, else Welch's t."""
    a = [v for v in a if math.isfinite(v)]
    b = [v for v in b if math.isfinite(v)]
    if len(a) < 2 or len(b) < 2:
        return Significance(False, "none", None, f"fewer than 2 {what} in a run: no noise estimate")
    if mann_whitney_min_p(len(a), len(b)) < alpha:
        _, p = mann_whitney_u(a, b)
        method = "Mann-Whitney U"
    else:
        _, _, p = welch_t_test(a, b)
        method = "Welch t"
    return Significance(p < alpha, method, p, f"p={p:.3g} ({method}, {len(a)} vs {len(b)} {what})")


def _window_throughputs(level: LevelResult) -> list[float]:
    return [w.throughput_infer_per_s for w in level.windows]


def _window_latencies(level: LevelResult) -> list[float]:
    return [w.stabilizing_latency_us for w in level.windows]


def _throughput_noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
    return windows_differ(_window_throughputs(base), _window_throughputs(cand), alpha, "windows")


def _latency_noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
    return windows_differ(_window_latencies(base), _window_latencies(cand), alpha, "window latencies")


def _p99_ci_noise(corrected: bool) -> Callable[[LevelResult, LevelResult, float], Significance]:
    def noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
        a = base.latency_from_intended if corrected else base.latency
        b = cand.latency_from_intended if corrected else cand.latency
        disjoint = b.p99_ci_low_us > a.p99_ci_high_us or a.p99_ci_low_us > b.p99_ci_high_us
        detail = (
            f"95% CIs [{a.p99_ci_low_us / 1e3:.3g}, {a.p99_ci_high_us / 1e3:.3g}] and "
            f"[{b.p99_ci_low_us / 1e3:.3g}, {b.p99_ci_high_us / 1e3:.3g}] ms "
            + ("do not overlap" if disjoint else "overlap")
        )
        return Significance(disjoint, "p99 CI", None, detail)

    return noise


@dataclass(frozen=True, slots=True)
class GateMetric:
    """A metric a gate can compare: where to read it and how to tell its change from noise."""

    name: str
    label: str
    unit: str
    better: Literal["higher", "lower"]
    value: Callable[[LevelResult], float | None]
    noise: Callable[[LevelResult, LevelResult, float], Significance]


def _latency_ms(attr: str, corrected: bool = False) -> Callable[[LevelResult], float | None]:
    def get(level: LevelResult) -> float | None:
        stats: LatencyStats = level.latency_from_intended if corrected else level.latency
        return getattr(stats, attr) / 1e3 if stats.count > 0 else None

    return get


GATE_METRICS: dict[str, GateMetric] = {
    m.name: m
    for m in (
        GateMetric("throughput", "throughput", "infer/s", "higher", lambda lv: lv.throughput_infer_per_s,
                   _throughput_noise),
        GateMetric("p50", "p50 latency", "ms", "lower", _latency_ms("p50_us"), _latency_noise),
        GateMetric("p90", "p90 latency", "ms", "lower", _latency_ms("p90_us"), _latency_noise),
        GateMetric("p95", "p95 latency", "ms", "lower", _latency_ms("p95_us"), _latency_noise),
        GateMetric("p99", "p99 latency", "ms", "lower", _latency_ms("p99_us"), _p99_ci_noise(False)),
        GateMetric("p999", "p99.9 latency", "ms", "lower", _latency_ms("p999_us"), _latency_noise),
        GateMetric("mean", "mean latency", "ms", "lower", _latency_ms("mean_us"), _latency_noise),
        GateMetric("p99_from_intended", "p99 latency from intended send", "ms", "lower",
                   _latency_ms("p99_us", corrected=True), _p99_ci_noise(True)),
    )
}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Comparing two sweeps


def parse_percent(text: str | float, flag: str) -> float:
    """'5%', '5' or 5 → 5.0; negative or malformed values name the flag."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise PerfkitError(f"{flag} takes a percentage such as 5% or 12.5, not '{text}'") from None
    if not math.isfinite(value) or value < 0:
        raise PerfkitError(f"{flag} must be a non-negative percentage, not '{text}'")
    return value


@dataclass(frozen=True, slots=True)
class Thresholds:
    max_throughput_drop_pct: float = 5.0
    max_latency_increase_pct: float = 10.0
    metrics: tuple[str, ...] = ("throughput", "p99")
    alpha: float = DEFAULT_ALPHA

    def validate(self) -> None:
        unknown = [m for m in self.metrics if m not in GATE_METRICS]
        if unknown:
            raise PerfkitError(f"--metric {', '.join(unknown)}: choose from {', '.join(GATE_METRICS)}")
        if not self.metrics:
            raise PerfkitError("--metric: name at least one metric")
        if not 0.0 < self.alpha < 1.0:
            raise PerfkitError(f"--alpha must be between 0 and 1, not {self.alpha}")

    def limit_pct(self, metric: GateMetric) -> float:
        return self.max_throughput_drop_pct if metric.better == "higher" else self.max_latency_increase_pct


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """One metric at one level: the two values, the change, and the verdict."""

    level: str
    metric: str
    unit: str
    baseline: float | None
    candidate: float | None
    change_pct: float | None  # signed: (candidate − baseline) / baseline
    limit_pct: float
    worse_than_limit: bool
    noise: Significance
    verdict: Literal["regression", "within noise", "improved", "ok", "not measured"]
    notes: tuple[str, ...] = ()

    @property
    def regression(self) -> bool:
        return self.verdict == "regression"


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline: str
    candidate: str
    thresholds: Thresholds
    deltas: tuple[MetricDelta, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def regressions(self) -> tuple[MetricDelta, ...]:
        return tuple(d for d in self.deltas if d.regression)


def level_label(level: LevelResult) -> str:
    text = level_name(level.mode, level.level, short=True)
    return text if level.batch_size == 1 else f"{text} (batch {level.batch_size})"


def _key(level: LevelResult) -> tuple[str, float, int]:
    return level.mode, level.level, level.batch_size


def _match_levels(baseline: SweepResult, candidate: SweepResult) -> list[tuple[LevelResult, LevelResult]]:
    base = {_key(lv): lv for lv in baseline.levels}
    cand = {_key(lv): lv for lv in candidate.levels}
    if not base or not cand:
        empty = "baseline" if not base else "candidate"
        raise PerfkitError(f"the {empty} measured no level; nothing to compare")
    if base.keys() != cand.keys():
        missing = [level_label(base[k]) for k in base if k not in cand]
        extra = [level_label(cand[k]) for k in cand if k not in base]
        parts = [f"the candidate lacks {', '.join(missing)}" if missing else "",
                 f"the baseline lacks {', '.join(extra)}" if extra else ""]  # fmt: skip
        argv = " ".join(str(a) for a in baseline.provenance.get("argv", []))
        hint = f" (the baseline ran: perfkit {argv})" if argv else ""
        raise PerfkitError(
            f"the two runs did not measure the same levels: {'; '.join(p for p in parts if p)}. "
            f"Re-run the candidate with the baseline's load settings{hint}"
        )
    return [(base[k], cand[k]) for k in base]


def _delta(base: LevelResult, cand: LevelResult, metric: GateMetric, thresholds: Thresholds) -> MetricDelta:
    label, limit = level_label(base), thresholds.limit_pct(metric)
    notes = tuple(f"{side} level not valid" for side, lv in (("baseline", base), ("candidate", cand)) if not lv.valid)
    b, c = metric.value(base), metric.value(cand)
    if b is None or c is None:
        return MetricDelta(label, metric.name, metric.unit, b, c, None, limit, False,
                           Significance(False, "none"), "not measured", notes)  # fmt: skip
    if b == 0.0:
        change = 0.0 if c == 0.0 else math.copysign(math.inf, c)
    else:
        change = (c - b) / abs(b) * 100.0
    worse = -change if metric.better == "higher" else change  # positive: the candidate is worse
    noise = metric.noise(base, cand, thresholds.alpha)
    if worse > limit:
        verdict: Literal["regression", "within noise", "improved", "ok"] = (
            "regression" if noise.significant else "within noise"
        )
    elif -worse > limit and noise.significant:
        verdict = "improved"
    else:
        verdict = "ok"
    return MetricDelta(label, metric.name, metric.unit, b, c, change, limit, worse > limit, noise, verdict, notes)


def compare_sweeps(
    baseline: SweepResult,
    candidate: SweepResult,
    thresholds: Thresholds = Thresholds(),
    *,
    names: tuple[str, str] = ("baseline", "candidate"),
) -> Comparison:
    """Each gated metric at each level of two sweeps. Raises PerfkitError (exit 2) when the runs
    cannot be compared: different load modes or levels, or an unknown metric."""
    thresholds.validate()
    if baseline.mode != candidate.mode:
        raise PerfkitError(
            f"the baseline measured {baseline.mode} levels and the candidate {candidate.mode}; "
            "compare runs of the same load mode"
        )
    pairs = _match_levels(baseline, candidate)
    notes: list[str] = []
    if baseline.model != candidate.model:
        notes.append(f"different models: {baseline.model} and {candidate.model}")
    hosts = [r.provenance.get("machine", {}).get("hostname") for r in (baseline, candidate)]
    if hosts[0] and hosts[1] and hosts[0] != hosts[1]:
        notes.append(f"measured on different machines ({hosts[0]} and {hosts[1]}): differences may be the machine's")
    for name, result in zip(names, (baseline, candidate)):
        if not result.completed:
            notes.append(f"the {name} sweep stopped early: {result.stop_reason}")
    deltas = tuple(
        _delta(base, cand, GATE_METRICS[name], thresholds) for base, cand in pairs for name in thresholds.metrics
    )
    return Comparison(names[0], names[1], thresholds, deltas, tuple(notes))


# --------------------------------------------------------------------------------------------------
# Renderers


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _fmt_change(change: float | None) -> str:
    if change is None:
        return "-"
    return f"{change:+.1f}%" if math.isfinite(change) else ("+inf%" if change > 0 else "-inf%")


def comparison_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """The comparison as a header and rows of text, for the console and the HTML report."""
    header = ["level", "metric", "baseline", "candidate", "change", "limit", "noise", "verdict"]
    rows = []
    for d in comparison.deltas:
        metric = GATE_METRICS[d.metric]
        sign = "-" if metric.better == "higher" else "+"
        rows.append([
            d.level, f"{d.metric} {d.unit}", _fmt(d.baseline), _fmt(d.candidate), _fmt_change(d.change_pct),
            f"{sign}{d.limit_pct:g}%", d.noise.detail or d.noise.method,
            d.verdict.upper() if d.regression else d.verdict,
        ])  # fmt: skip
    return header, rows


def render_comparison_lines(comparison: Comparison) -> list[str]:
    header, rows = comparison_rows(comparison)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
    lines += [f"note: {note}" for note in comparison.notes]
    regressions = comparison.regressions
    if regressions:
        lines.append(
            f"REGRESSION: {len(regressions)} of {len(comparison.deltas)} comparisons are worse than their limit "
            "and beyond the runs' noise"
        )
    else:
        noisy = sum(1 for d in comparison.deltas if d.verdict == "within noise")
        tail = f" ({noisy} worse than the limit but within the runs' noise)" if noisy else ""
        lines.append(f"no regression in {len(comparison.deltas)} comparisons{tail}")
    return lines


@dataclass(frozen=True, slots=True)
class JUnitCase:
    """One test case of a JUnit report: failed when `failure` is set, skipped when `skipped` is."""

    classname: str
    name: str
    summary: str
    failure: bool = False
    skipped: bool = False


def comparison_cases(comparison: Comparison) -> list[JUnitCase]:
    """A test case per metric and level: failed where it regressed, skipped where not measured."""
    cases = []
    for d in comparison.deltas:
        summary = (
            f"{d.metric} at {d.level}: {_fmt(d.baseline)} -> {_fmt(d.candidate)} {d.unit} "
            f"({_fmt_change(d.change_pct)}, limit {d.limit_pct:g}%); {d.noise.detail or d.noise.method}: {d.verdict}"
        )
        classname = "perfkit.analysis.compare." + d.level.replace(" ", "_").replace(".", "_").replace("/", "_per_")
        cases.append(JUnitCase(classname, d.metric, summary, d.regression, d.verdict == "not measured"))
    return cases


def render_junit(
    suite: str,
    cases: Sequence[JUnitCase],
    properties: Sequence[tuple[str, str]] = (),
    output: str = "",
) -> str:
    """JUnit XML that CI systems (GitLab, Jenkins, GitHub test reporters) show as tests."""
    counts = {
        "tests": str(len(cases)),
        "failures": str(sum(c.failure for c in cases)),
        "errors": "0",
        "skipped": str(sum(c.skipped and not c.failure for c in cases)),
    }
    root = ET.Element("testsuites", {"name": "perfkit", **counts})
    element = ET.SubElement(root, "testsuite", {"name": suite, "time": "0", **counts})
    if properties:
        props = ET.SubElement(element, "properties")
        for name, value in properties:
            ET.SubElement(props, "property", name=name, value=value)
    for case in cases:
        node = ET.SubElement(element, "testcase", classname=case.classname, name=case.name, time="0")
        if case.failure:
            ET.SubElement(node, "failure", message=case.summary, type="PerformanceRegression").text = case.summary
        elif case.skipped:
            ET.SubElement(node, "skipped", message=case.summary)
        else:
            ET.SubElement(node, "system-out").text = case.summary
    if output:
        ET.SubElement(element, "system-out").text = output
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def comparison_properties(comparison: Comparison) -> list[tuple[str, str]]:
    t = comparison.thresholds
    return [
        ("baseline", comparison.baseline),
        ("candidate", comparison.candidate),
        ("max_throughput_drop_pct", f"{t.max_throughput_drop_pct:g}"),
        ("max_latency_increase_pct", f"{t.max_latency_increase_pct:g}"),
        ("alpha", f"{t.alpha:g}"),
    ]
