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
     of its stabilising latency (the mean, or `--percentile`'s). The two sets are compared by
     `significance.windows_differ`: Mann–Whitney U when the sample sizes can reach significance,
     Welch's t otherwise.
   * p99 (and p99 from the intended send time): the result stores a distribution-free 95 %
     confidence interval of p99 from order statistics; the change is significant when the two
     intervals do not overlap.

A run read from a perf_analyzer `-f` CSV (`results.pa_csv`) has one figure per level and no
per-window samples, so there is no noise to test against: when either run is one, the gate is on the
thresholds alone (`Comparison.without_samples`), and the verdicts say so. Such a run takes the batch
size and the custom-intervals mode, which its file cannot hold, from the other run.

The metrics a gate can look at are the catalogue's (`analysis.metrics`) that have a gate name; any
spelling of one names it (`p99`, `p99_ms`), and the verdicts carry the gate name.

Levels are matched by load mode, level and batch size (by mode and level alone when each run used
one batch size and the two differ). Runs that did not measure the same levels cannot be compared
level by level, and that is a usage error (exit 2), not a pass.

Runs set up differently (protocol, server, endpoint type, batch size, model, machine) and runs with
levels that failed their checks are compared all the same, with `Comparison.warnings` saying so
(`analysis.run_setup`); every output shows them before the verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from perfkit.analysis.metrics import METRICS, TOKEN_METRICS, Metric, find, ms, throughput_unit
from perfkit.analysis.run_setup import invalid_levels, setup_differences
from perfkit.analysis.significance import Significance, windows_differ
from perfkit.errors import PerfkitError
from perfkit.results.model import LevelResult, SweepResult, level_name
from perfkit.results.pa_csv import has_window_samples

__all__ = [
    "GATE_METRICS",
    "Comparison",
    "MetricDelta",
    "Thresholds",
    "compare_sweeps",
    "gated",
    "level_label",
    "parse_percent",
]

DEFAULT_ALPHA = 0.05

Noise = Callable[[LevelResult, LevelResult, float], Significance]


# --------------------------------------------------------------------------------------------------
# How a gate tells a metric's change from noise


def _throughput_noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
    a, b = ([w.throughput_infer_per_s for w in lv.windows] for lv in (base, cand))
    return windows_differ(a, b, alpha, "windows")


def _latency_noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
    a, b = ([w.stabilizing_latency_us for w in lv.windows] for lv in (base, cand))
    return windows_differ(a, b, alpha, "window latencies")


def _p99_ci_noise(corrected: bool) -> Noise:
    def noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
        a = base.latency_from_intended if corrected else base.latency
        b = cand.latency_from_intended if corrected else cand.latency
        disjoint = b.p99_ci_low_us > a.p99_ci_high_us or a.p99_ci_low_us > b.p99_ci_high_us
        detail = (
            f"95% CIs [{ms(a.p99_ci_low_us):.3g}, {ms(a.p99_ci_high_us):.3g}] and "
            f"[{ms(b.p99_ci_low_us):.3g}, {ms(b.p99_ci_high_us):.3g}] ms "
            + ("do not overlap" if disjoint else "overlap")
        )
        return Significance(disjoint, "p99 CI", None, detail)

    return noise


def _token_ci_noise(attr: str, stat: str) -> Noise:
    """A token timing's change is significant when the two 95% CIs do not overlap: p99's
    (order statistics), or for the other statistics the mean's (Student t over requests)."""
    bound = "p99_ci" if stat == "p99" else "mean_ci"

    def noise(base: LevelResult, cand: LevelResult, alpha: float) -> Significance:
        a, b = (getattr(lv.tokens, attr) for lv in (base, cand))
        a_low, a_high, b_low, b_high = (getattr(v, f"{bound}_{side}") for v in (a, b) for side in ("low", "high"))
        disjoint = b_low > a_high or a_low > b_high
        detail = (f"95% CIs of the {'p99' if stat == 'p99' else 'mean'} [{a_low:.3g}, {a_high:.3g}] and "
                  f"[{b_low:.3g}, {b_high:.3g}] {'do not overlap' if disjoint else 'overlap'}")  # fmt: skip
        return Significance(disjoint, f"{bound.replace('_', ' ')}", None, detail)

    return noise


#: What each gated metric's change is tested against, by canonical name; the other latencies use
#: the windows' stabilising latencies, and the token rates the windows' throughputs.
_NOISE: dict[str, Noise] = {
    "throughput_infer_per_s": _throughput_noise,
    "p99_ms": _p99_ci_noise(False),
    "p99_from_intended_ms": _p99_ci_noise(True),
    **{
        m.name: _token_ci_noise(m.name.rsplit("_", 2)[0] + "_ms", m.name.rsplit("_", 2)[1])
        for m in TOKEN_METRICS
        if m.unit == "ms"
    },
    **{m.name: _throughput_noise for m in TOKEN_METRICS if m.better == "higher" and m.unit != "ms"},
}

#: The metrics a gate can compare, by the name compare prints.
GATE_METRICS: dict[str, Metric] = {m.gate: m for m in METRICS if m.gate}


def gated(name: str) -> Metric | None:
    """The gated metric `name` spells (its gate name, canonical name or an alias); None if none."""
    metric = find(name)
    return metric if metric is not None and metric.gate else None


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
        unknown = [m for m in self.metrics if gated(m) is None]
        if unknown:
            raise PerfkitError(f"--metric {', '.join(unknown)}: choose from {', '.join(GATE_METRICS)}")
        if not self.metrics:
            raise PerfkitError("--metric: name at least one metric")
        if not 0.0 < self.alpha < 1.0:
            raise PerfkitError(f"--alpha must be between 0 and 1, not {self.alpha}")

    def gates(self) -> tuple[Metric, ...]:
        """The gated metrics `metrics` name, in their order; raises PerfkitError on an unknown one."""
        self.validate()
        return tuple(m for m in map(gated, self.metrics) if m is not None)

    def limit_pct(self, metric: Metric) -> float:
        return self.max_throughput_drop_pct if metric.better == "higher" else self.max_latency_increase_pct


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """One metric at one level: the two values, the change, and the verdict."""

    level: str
    metric: str
    unit: str
    better: Literal["higher", "lower"]
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
    #: The runs (by name) without per-window samples (read from a perf_analyzer CSV): when there
    #: is one, every change worse than its limit is a regression, with no significance test.
    without_samples: tuple[str, ...] = ()
    #: How the runs' setups differ, and runs with levels that failed a check: compared all the
    #: same, but every output says so before the verdict.
    warnings: tuple[str, ...] = ()

    @property
    def thresholds_only(self) -> bool:
        return bool(self.without_samples)

    @property
    def regressions(self) -> tuple[MetricDelta, ...]:
        return tuple(d for d in self.deltas if d.regression)


def level_label(level: LevelResult) -> str:
    text = level_name(level.mode, level.level, short=True)
    return text if level.batch_size == 1 else f"{text} (batch {level.batch_size})"


def _key(level: LevelResult, batch: bool = True) -> tuple[str, float, int]:
    return level.mode, level.level, level.batch_size if batch else 0


def _match_levels(baseline: SweepResult, candidate: SweepResult) -> list[tuple[LevelResult, LevelResult]]:
    # Each run of one batch size, the two different: a level is its load (the warnings say so).
    sizes = [{lv.batch_size for lv in r.levels} for r in (baseline, candidate)]
    batch = not (len(sizes[0]) == len(sizes[1]) == 1 and sizes[0] != sizes[1])
    base = {_key(lv, batch): lv for lv in baseline.levels}
    cand = {_key(lv, batch): lv for lv in candidate.levels}
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


#: The noise verdict when a run has no per-window samples: the threshold alone decides.
THRESHOLDS_ONLY = Significance(True, "thresholds only", None, "no per-window samples: thresholds only")


def _delta(
    base: LevelResult, cand: LevelResult, metric: Metric, thresholds: Thresholds, samples: bool = True
) -> MetricDelta:
    label, limit, name = level_label(base), thresholds.limit_pct(metric), metric.gate or metric.name
    notes = tuple(f"{side} level not valid" for side, lv in (("baseline", base), ("candidate", cand)) if not lv.valid)
    b, c = metric.value(base), metric.value(cand)
    # NaN: a figure the run's file does not hold (a perf_analyzer CSV has no p99.9)
    b, c = (None if v is None or math.isnan(v) else v for v in (b, c))
    if b is None or c is None:
        return MetricDelta(label, name, metric.unit, metric.better, b, c, None, limit, False,
                           Significance(False, "none"), "not measured", notes)  # fmt: skip
    if b == 0.0:
        change = 0.0 if c == 0.0 else math.copysign(math.inf, c)
    else:
        change = (c - b) / abs(b) * 100.0
    worse = -change if metric.better == "higher" else change  # positive: the candidate is worse
    noise = _NOISE.get(metric.name, _latency_noise)(base, cand, thresholds.alpha) if samples else THRESHOLDS_ONLY
    if worse > limit:
        verdict: Literal["regression", "within noise", "improved", "ok"] = (
            "regression" if noise.significant else "within noise"
        )
    elif -worse > limit and noise.significant:
        verdict = "improved"
    else:
        verdict = "ok"
    return MetricDelta(label, name, metric.unit, metric.better, b, c, change, limit, worse > limit, noise, verdict,
                       notes)  # fmt: skip


def compare_sweeps(
    baseline: SweepResult,
    candidate: SweepResult,
    thresholds: Thresholds = Thresholds(),
    *,
    names: tuple[str, str] = ("baseline", "candidate"),
) -> Comparison:
    """Each gated metric at each level of two sweeps. Raises PerfkitError (exit 2) when the runs
    cannot be compared: different load modes or levels, or an unknown metric."""
    gates = thresholds.gates()
    without = tuple(name for name, result in zip(names, (baseline, candidate)) if not has_window_samples(result))
    baseline, candidate = _adopt(baseline, candidate), _adopt(candidate, baseline)
    if baseline.mode != candidate.mode:
        raise PerfkitError(
            f"the baseline measured {baseline.mode} levels and the candidate {candidate.mode}; "
            "compare runs of the same load mode"
        )
    pairs = _match_levels(baseline, candidate)
    warnings = setup_differences(baseline, candidate, names)
    warnings += [w for role, name, r in zip(("baseline", "candidate"), names, (baseline, candidate))
                 if (w := invalid_levels(r, role, name))]  # fmt: skip
    notes: list[str] = []
    if without:
        notes.append(f"{' and '.join(without)} {'has' if len(without) == 1 else 'have'} no per-window samples "
                     "(a perf_analyzer CSV): gated on thresholds only, no significance test")  # fmt: skip
    for name, result in zip(names, (baseline, candidate)):
        if not result.completed:
            notes.append(f"the {name} sweep stopped early: {result.stop_reason}")
    notes += [note for base, cand in pairs for note in composing_changes(base, cand)]
    deltas = tuple(_delta(base, cand, metric, thresholds, not without) for base, cand in pairs for metric in gates)
    if throughput_unit(baseline, candidate) == "req/s":  # both generative: a request is one completion
        deltas = tuple(dataclasses.replace(d, unit="req/s") if d.unit == "infer/s" else d for d in deltas)
    return Comparison(names[0], names[1], thresholds, deltas, tuple(notes), without, tuple(warnings))


def composing_changes(base: LevelResult, cand: LevelResult) -> list[str]:
    """For an ensemble, how each composing model's server-side time changed at a level (said, not
    gated: the server's averages carry no samples to test)."""
    if base.server is None or cand.server is None:
        return []
    theirs = {(c.model, c.version): c.server for c in cand.server.composing}
    lines = []
    for c in base.server.composing:
        other = theirs.get((c.model, c.version))
        if other is None:
            continue
        figures = []
        for label, attr in (("queue", "queue_us"), ("compute infer", "compute_infer_us"), ("overhead", "overhead_us")):
            b, n = getattr(c.server, attr), getattr(other, attr)
            change = f" ({(n - b) / b * 100:+.1f}%)" if b > 0 else ""
            figures.append(f"{label} {b:.0f} -> {n:.0f} us{change}")
        lines.append(f"{level_label(base)}, composing model {c.model} v{c.version or '-'}: {', '.join(figures)}")
    return lines


def _adopt(result: SweepResult, other: SweepResult) -> SweepResult:
    """What a CSV cannot say, taken from the run it is compared with: the batch size (a CSV reads as
    1) when that run used one throughout, and custom intervals (a CSV names them Request Rate)."""
    sizes = {lv.batch_size for lv in other.levels}
    if has_window_samples(result):
        return result
    intervals = result.mode == "request_rate" and other.mode == "custom_intervals"
    mode = other.mode if intervals else result.mode
    size = next(iter(sizes)) if len(sizes) == 1 else None
    levels = tuple(
        dataclasses.replace(lv, mode=mode, batch_size=lv.batch_size if size is None else size) for lv in result.levels
    )
    return dataclasses.replace(result, mode=mode, levels=levels)
