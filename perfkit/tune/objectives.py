"""What `perfkit tune` optimises: the measured figures, objectives with weights, constraints, and the
noise-aware ranking of variants. Pure: no I/O, so the search policies and their tests use it as is.

Figures. A load level is reduced to `Figures`, a mapping from the figure names of `FIGURES` to an
`Estimate` (a value and its 95 % interval): throughput with the Student-t interval of its windows,
p99 with its order-statistics interval, mean latency with a normal interval; p50/p90/p95 and the
GPU figures come without an interval (zero width), because a level keeps no per-window percentiles.
The figures are the metrics of the catalogue (`analysis.metrics`) that have a figure name, and any
spelling of one names it (`latency`, `p99`, `p99_ms`). In a tune of several models the figures of
model M are named `M/throughput`, `M/p99_ms`, …, and objectives and constraints over them are the
per-model ones with the models' weights folded in (`perfkit.tune.multi.study`).

Objectives. model_analyzer compares two measurements by Σ wᵢ·(aᵢ − bᵢ)/mean(aᵢ, bᵢ) with the sign
of each metric's direction (result/model_config_measurement.py). perfkit scores each measurement on
its own instead, by Σ wᵢ·sᵢ·ln(valueᵢ) with sᵢ = +1 when higher is better and −1 when lower is
better: the difference of two such scores is the weighted log-ratio, which is model_analyzer's
relative difference to first order, but a score is a number per variant that can carry an interval
and be sorted. exp(score difference) − 1 is "X % better". With one objective, throughput, the score
is ln(throughput). Weights are normalised to sum to 1, as model_analyzer does.

Constraints (`p99_ms<=20`, `throughput>=500`) filter: a measurement that breaks one is infeasible,
kept and reported with what it broke. A constraint on a figure the server did not report (GPU
memory on a CPU-only machine) is not checked. Among infeasible measurements the one that breaks
its constraints by the least (the sum of relative excesses) is preferred, as model_analyzer's quick
search does with `compare_constraints`.

Ranking (`rank`). Feasible variants by score, then infeasible ones, then those that failed. The
leader is the feasible variant with the highest score; every feasible variant whose score interval
overlaps the leader's is tied with it, and the tie is resolved toward the variant that uses the
fewest resources (its cost key: instances, then batch size, then batching delay). Before a winner
is declared the leaders are re-measured, interleaved, and their measurements merged by `combine`,
whose interval is the wider of the merged within-run interval (shrunk by √n) and the Student-t
interval of the per-run values, which catches the drift between runs on a shared machine that the
windows of one run cannot see. Only re-measured variants can then tie: comparing a leader's honest
interval with another variant's single-run interval makes tie membership, and so the cheapest tied
variant, flip from run to run (tests/unit/test_objectives.py simulates it). A variant measured once
whose interval still overlaps the leader's is not tied, and the reports say so of it
(`perfkit.tune.verdict`, which tells the ranking to the console and the HTML report by one rule).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from perfkit.analysis.metrics import METRICS, Metric, find, ms
from perfkit.analysis.significance import student_t_quantile
from perfkit.errors import PerfkitError
from perfkit.results.model import LevelResult

__all__ = [
    "FIGURES",
    "Constraint",
    "Estimate",
    "Figures",
    "Objective",
    "Ranked",
    "Ranking",
    "best_level",
    "combine",
    "figures_of",
    "merit",
    "metric_of",
    "parse_constraint",
    "parse_objective",
    "rank",
]

_FLOOR = 1e-9  # logarithms of figures at or below 0 (an empty interval bound, 0 % utilisation)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A measured figure and its 95 % interval (low <= value <= high)."""

    value: float
    low: float
    high: float

    @staticmethod
    def exact(value: float) -> Estimate:
        return Estimate(value, value, value)

    def overlaps(self, other: Estimate) -> bool:
        return self.low <= other.high and other.low <= self.high


Figures = Mapping[str, Estimate]


def _mean_ci(level: LevelResult) -> Estimate:
    lat = level.latency
    half = 1.96 * lat.std_us / math.sqrt(lat.count) if lat.count > 1 else 0.0
    return Estimate(ms(lat.mean_us), ms(max(0.0, lat.mean_us - half)), ms(lat.mean_us + half))


def _p99(level: LevelResult) -> Estimate:
    lat = level.latency
    low, high = min(lat.p99_ci_low_us, lat.p99_us), max(lat.p99_ci_high_us, lat.p99_us)
    return Estimate(ms(lat.p99_us), ms(low), ms(high))


def _throughput(level: LevelResult) -> Estimate:
    value = level.throughput_infer_per_s
    return Estimate(value, min(level.throughput_ci_low, value), max(level.throughput_ci_high, value))


#: The figures with an interval, by canonical name; a level keeps no per-window percentiles or GPU
#: figures, so the others are exact.
_INTERVALS: dict[str, Callable[[LevelResult], Estimate]] = {
    "throughput_infer_per_s": _throughput,
    "p99_ms": _p99,
    "mean_ms": _mean_ci,
}

#: The figures tune can optimise or constrain: the catalogue's metrics with a figure name, by it.
FIGURES: dict[str, Metric] = {m.figure: m for m in METRICS if m.figure}


def metric_of(name: str) -> Metric:
    """The metric a figure name stands for; `MODEL/figure` names one model's figure in a tune of
    several models (`perfkit.tune.multi.study`)."""
    return FIGURES[name.rpartition("/")[2]]


def _figure_name(name: str, flag: str) -> str:
    """The figure `name` spells (any of its metric's spellings); the error names `flag` and lists them."""
    found = find(name)
    if found is None or found.figure is None:
        known = ", ".join(f"{key} ({m.unit})" for key, m in FIGURES.items())
        raise PerfkitError(f"{flag}: unknown figure '{name}'; use one of {known} (latency means p99_ms)")
    return found.figure


def figures_of(level: LevelResult) -> dict[str, Estimate] | None:
    """The figures of one measured level; None when no request of it succeeded. An open-loop
    level's latencies are taken from the intended send times (wrk2's correction), so that a server
    that falls behind its schedule is judged by the wait its clients saw."""
    if level.ok_count == 0 or level.latency.count == 0:
        return None
    if level.mode != "concurrency":
        level = dataclasses.replace(level, latency=level.latency_from_intended)
    figures = {}
    for name, metric in FIGURES.items():
        value = metric.value(level)
        if value is not None:
            interval = _INTERVALS.get(metric.name)
            figures[name] = interval(level) if interval is not None else Estimate.exact(value)
    return figures


# --- objectives and constraints -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Objective:
    """Weighted metrics to optimise; weights sum to 1."""

    weights: tuple[tuple[str, float], ...] = (("throughput", 1.0),)

    def score(self, figures: Figures) -> Estimate:
        """Σ w·s·ln(value), with its interval from the figures' intervals (each at its worst and
        best end). Figures the measurement lacks count as neutral."""
        value = low = high = 0.0
        for name, weight in self.weights:
            est = figures.get(name)
            if est is None:
                continue
            ln = [math.log(max(x, _FLOOR)) for x in (est.value, est.low, est.high)]
            if metric_of(name).better == "higher":
                value, low, high = value + weight * ln[0], low + weight * ln[1], high + weight * ln[2]
            else:
                value, low, high = value - weight * ln[0], low - weight * ln[2], high - weight * ln[1]
        return Estimate(value, low, high)

    def describe(self) -> str:
        if len(self.weights) == 1:
            name = self.weights[0][0]
            return f"{'maximising' if metric_of(name).better == 'higher' else 'minimising'} {name}"
        return "the weighted objective " + " + ".join(f"{w:.2g}×{name}" for name, w in self.weights)


def parse_objective(text: str) -> Objective:
    """`throughput`, `latency`, or `throughput:3,p99_ms:1` (NAME[:WEIGHT], comma separated)."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight_text = part.partition(":")
        figure = _figure_name(name, "--objective")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            weight = -1.0
        if not weight > 0 or not math.isfinite(weight):
            raise PerfkitError(f"--objective {part}: the weight must be a positive number, as in throughput:3")
        if figure in weights:
            raise PerfkitError(f"--objective names {figure} twice; give each figure once")
        weights[figure] = weight
    if not weights:
        raise PerfkitError("--objective is empty; give e.g. throughput, latency or throughput:3,p99_ms:1")
    total = sum(weights.values())
    return Objective(tuple((name, w / total) for name, w in weights.items()))


_CONSTRAINT = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True, slots=True)
class Constraint:
    metric: str
    op: Literal["<=", ">="]
    bound: float

    @property
    def tightens_with_load(self) -> bool:
        """An upper bound on a figure that rises with concurrency: it holds below some level only."""
        return self.op == "<=" and metric_of(self.metric).grows_with_load

    def excess(self, figures: Figures) -> float | None:
        """How far the figure is past the bound, relative to it (0 when it holds); None: not measured."""
        est = figures.get(self.metric)
        if est is None:
            return None
        over = est.value - self.bound if self.op == "<=" else self.bound - est.value
        return max(0.0, over) / max(abs(self.bound), _FLOOR)

    def holds(self, figures: Figures) -> bool:
        return not self.excess(figures)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_constraint(text: str) -> Constraint:
    """`p99_ms<=20`, `throughput>=500`, `gpu_memory_mb<=2000`."""
    match = _CONSTRAINT.match(text)
    if match is None:
        raise PerfkitError(
            f"--constraint '{text}' must look like FIGURE<=BOUND or FIGURE>=BOUND, e.g. 'p99_ms<=20' or 'throughput>=500'"
        )
    figure = _figure_name(match.group(1), "--constraint")
    try:
        bound = float(match.group(3))
    except ValueError:
        raise PerfkitError(f"--constraint '{text}': '{match.group(3)}' is not a number") from None
    op: Literal["<=", ">="] = "<=" if match.group(2) == "<=" else ">="
    return Constraint(figure, op, bound)


def violations(figures: Figures, constraints: Iterable[Constraint]) -> list[str]:
    """What each broken constraint measured, e.g. 'p99_ms 25.31 > 20'."""
    out = []
    for c in constraints:
        if c.excess(figures):
            shown = metric_of(c.metric).fmt.format(figures[c.metric].value)
            out.append(f"{c.metric} {shown} {'>' if c.op == '<=' else '<'} {c.bound:g}")
    return out


def merit(figures: Figures | None, objective: Objective, constraints: Sequence[Constraint]) -> tuple[float, ...]:
    """A sort key, higher is better: feasible before infeasible (the least excess first), by score;
    a failed measurement below everything."""
    if figures is None:
        return (-1.0, 0.0, 0.0)
    excess = sum(c.excess(figures) or 0.0 for c in constraints)
    return (0.0 if excess else 1.0, -excess, objective.score(figures).value)


def best_level(levels: Sequence[Figures | None], objective: Objective, constraints: Sequence[Constraint]) -> int | None:
    """Index of the best of a variant's levels (the earliest, i.e. lowest load, among equals)."""
    best: int | None = None
    for i, figures in enumerate(levels):
        if figures is not None and (
            best is None or merit(figures, objective, constraints) > merit(levels[best], objective, constraints)
        ):
            best = i
    return best


def combine(measurements: Sequence[Figures]) -> dict[str, Estimate]:
    """Several measurements of one variant at one load, merged (see the module header)."""
    if len(measurements) == 1:
        return dict(measurements[0])
    out = {}
    names = set.intersection(*(set(m) for m in measurements))
    for name in sorted(names):
        ests = [m[name] for m in measurements]
        n = len(ests)
        mean = sum(e.value for e in ests) / n
        sd = math.sqrt(sum((e.value - mean) ** 2 for e in ests) / (n - 1))
        between = student_t_quantile(0.95, n - 1) * sd / math.sqrt(n)
        below = sum(e.value - e.low for e in ests) / n / math.sqrt(n)
        above = sum(e.high - e.value for e in ests) / n / math.sqrt(n)
        out[name] = Estimate(mean, max(0.0, mean - max(below, between)), mean + max(above, between))
    return out


# --- ranking --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ranked:
    key: str
    status: Literal["feasible", "infeasible", "failed"]
    score: Estimate | None
    violations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Ranking:
    entries: tuple[Ranked, ...]  # feasible by score, infeasible by least excess, failed
    leader: str | None  # the highest feasible score
    tie: tuple[str, ...]  # feasible variants whose interval overlaps the leader's, in rank order
    best: str | None  # the recommendation: the cheapest of the tie

    def entry(self, key: str) -> Ranked:
        return next(e for e in self.entries if e.key == key)

    def leaders(self, count: int) -> list[str]:
        """The first `count` feasible variants: the ones to re-measure."""
        return [e.key for e in self.entries if e.status == "feasible"][:count]


def rank(
    candidates: Iterable[tuple[str, tuple[float, ...], Figures | None]],
    objective: Objective,
    constraints: Sequence[Constraint],
    remeasured: Collection[str] | None = None,
) -> Ranking:
    """Rank (key, cost, figures) triples; figures None means the variant failed. A lower cost tuple
    means fewer resources and breaks exact ties. Once leaders have been re-measured, pass them as
    `remeasured`: only they (and the leader) can tie, because a single measurement's interval from
    its windows says nothing of the drift between runs, and a variant that was not among the
    leaders was already told apart from them."""
    items = list(candidates)
    cost = {key: c for key, c, _ in items}
    items.sort(key=lambda item: (tuple(-x for x in merit(item[2], objective, constraints)), item[1]))
    entries = []
    for key, _, figures in items:
        if figures is None:
            entries.append(Ranked(key, "failed", None))
            continue
        broken = tuple(violations(figures, constraints))
        entries.append(Ranked(key, "infeasible" if broken else "feasible", objective.score(figures), broken))
    feasible = [e for e in entries if e.status == "feasible"]
    if not feasible:
        return Ranking(tuple(entries), None, (), None)
    leader = feasible[0]
    assert leader.score is not None
    tie = tuple(
        e.key
        for e in feasible
        if e.score is not None
        and e.score.overlaps(leader.score)
        and (remeasured is None or e.key in remeasured or e is leader)
    )
    return Ranking(tuple(entries), leader.key, tie, min(tie, key=lambda k: cost[k]))
