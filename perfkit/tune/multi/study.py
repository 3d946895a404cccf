"""Tunes of several models at once: `perfkit tune A/config.pbtxt B/config.pbtxt` (models that share a
server, measured concurrently) and `perfkit tune ENSEMBLE/config.pbtxt` (or a BLS model with
`--composing-models`: the composing models' configurations searched, the ensemble measured).

Theory of operation, after model_analyzer's config_search.md:

1. Members and the endpoint. A tune of several models searches *combinations*: one variant of each
   member model, loaded together through the repository API. Concurrent mode (model_analyzer's
   `run_config_profile_models_concurrently_enable`): the members are the models named, and each
   is measured under its own load at the same time (its own generator and samples; closed loop,
   the same concurrency level on each), so that each combination is judged with its neighbours
   competing for the same cores. Composite mode (model_analyzer's ensemble and
   `bls_composing_models` search): the members are the composing models (and a BLS model itself,
   which is a model with a configuration of its own; an ensemble's steps are not searched), and the
   only load is on the ensemble or BLS model, the endpoint a client calls.
2. The grid. Each member has its own grid (`space.build_space`); the combined grid is their
   product and its coordinates are the members' coordinates end to end, so brute search walks the
   product, quick search climbs it one member's knob at a time (or two diagonally), and bayesian
   search models all coordinates together: model_analyzer's quick search concatenates the models'
   dimensions the same way. The search policies run unchanged on a `CombinedSpace`.
3. Figures, weights and ranking. In concurrent mode a level's figures are each model's, named
   `MODEL/figure` (`objectives.metric_of`), plus `throughput`, their sum, which the concurrency
   sweep's plateau rule reads. model_analyzer ranks concurrent combinations by the models'
   objective comparisons weighted by each model's `weighting` (normalised to sum to 1); with
   perfkit's log scores that is one objective over the `MODEL/figure` names with weight
   w_model × w_figure (`combined_objective`). A constraint holds for every model (`p99_ms<=20` is
   checked on each). In composite mode the figures are the endpoint's, under their plain names,
   and the objective and constraints are the user's as given. An ensemble's composing models are
   searched only at max_batch_size values no smaller than the ensemble's (Triton's rule).
4. Measuring. Each combination is swept over concurrency by `search.concurrency_sweep` as a
   single-model variant is. A member is reloaded only when its configuration changes; in composite
   mode the endpoint is loaded again after its members, so that it is ready over the new ones
   whether or not the server reloads it by itself. In concurrent mode the
   models' levels start together, and a model whose level is stable before the others' keeps
   its load running, unrecorded, until all are done, so that no model is measured on a machine
   its neighbours have left.
5. Verdict. As in a one-model tune, the leaders are re-measured at their chosen concurrency,
   interleaved, their figures merged (`objectives.combine`), and the cheapest combination tied
   with the leader is recommended.

With -u, the default combination is each member as the server serves it (its `/config`), else
its config.pbtxt, and each model is left as the server had it (its config loaded back, or unloaded).

This module holds what a tune of several models is asked for and keeps (the study, the combined
grid, the records and result); `perfkit.tune.multi.tuner` measures, `perfkit.tune.multi.checkpoint`
saves the levels as they come so that `--checkpoint` resumes a tune. Not here: Ray workers and
request-rate search. The outputs are rendered by `perfkit.report.tune_tables.render_combination_*`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.results.model import LevelResult
from perfkit.tune.objectives import Constraint, Estimate, Figures, Objective, Ranking, combine, figures_of, rank
from perfkit.tune.space import Space, SpaceSpec, Variant, build_space, neighbours_in, variant_of
from perfkit.tune.state import Model, TuneSpec, read_model

__all__ = [
    "Combination",
    "CombinationRecord",
    "CombinationResult",
    "CombinedSpace",
    "Study",
    "combined_figures",
    "combined_objective",
    "level_figures",
    "new_result",
    "parse_weights",
    "read_study",
]


@dataclass(frozen=True, slots=True)
class Study:
    """What a tune of several models searches and measures: the member models whose configs vary,
    and the endpoint (None: each member under its own load; else the model a client calls)."""

    members: tuple[Model, ...]
    endpoint: Model | None = None
    weights: tuple[tuple[str, float], ...] = ()  # concurrent mode: model -> weight, summing to 1

    @property
    def mode(self) -> str:
        if self.endpoint is None:
            return "concurrent"
        return "ensemble" if self.endpoint.base.get("platform") == "ensemble" else "bls"

    @property
    def measured(self) -> tuple[Model, ...]:
        return self.members if self.endpoint is None else (self.endpoint,)


def parse_weights(text: str, models: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """`--weights A:3,B:1` (model_analyzer's per-model `weighting`; unnamed models weigh 1),
    normalised to sum to 1, in the order of `models`."""
    weights = dict.fromkeys(models, 1.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.rpartition(":")
        if not sep or name not in weights:
            raise PerfkitError(
                f"--weights {part!r}: give MODEL:WEIGHT for a model being tuned ({', '.join(models)}), e.g. "
                f"{models[0]}:3"
            )
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not 0 < weight < float("inf"):
            raise PerfkitError(f"--weights {part!r}: the weight must be a positive number, as in {name}:3")
        weights[name] = weight
    total = sum(weights.values())
    return tuple((name, w / total) for name, w in weights.items())


def _composing(config: dict[str, Any]) -> list[str]:
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return list(dict.fromkeys(str(step.get("model_name", "")) for step in steps))


def read_study(paths: Sequence[Path], composing: Sequence[str] = (), weights: str = "") -> Study | None:
    """The study of the configs named (and `--composing-models`, `--weights`); None when it is a
    plain one-model tune. Every model must be in one repository folder: they share a server."""
    models = [read_model(path) for path in paths]
    folders = {m.folder.parent for m in models}
    if len(folders) > 1:
        raise PerfkitError(
            "the models of one tune share a server, so their folders must be in one model repository; "
            f"got {', '.join(sorted(map(str, folders)))}"
        )
    repository = folders.pop()
    if len({m.name for m in models}) < len(models):
        raise PerfkitError("a model is named twice; give each config.pbtxt once")
    ensemble = [m for m in models if m.base.get("platform") == "ensemble"]
    if len(models) > 1:
        if composing or ensemble:
            raise PerfkitError(
                "tune an ensemble or a BLS model (--composing-models) on its own: its composing models are "
                "searched with it; give its config.pbtxt alone"
            )
        return Study(tuple(models), None, parse_weights(weights, [m.name for m in models]))
    if weights:
        raise PerfkitError("--weights weighs several models measured together; give two or more config.pbtxt")
    (top,) = models
    if ensemble and composing:
        raise PerfkitError("--composing-models names a BLS model's models; an ensemble's are read from its steps")
    names = _composing(top.base) if ensemble else list(composing)
    if not names:
        return None
    members = []
    for name in names:
        path = repository / name / "config.pbtxt"
        if name == top.name or not path.is_file():
            raise PerfkitError(
                f"composing model '{name}' of '{top.name}': no {path}; "
                + ("fix the ensemble's steps" if ensemble else "--composing-models names models of the same repository")
            )
        members.append(read_model(path))
    if not ensemble:
        members.append(top)  # a BLS model has instances and batching of its own: searched with its models
    return Study(tuple(members), top)


# --- combinations and their grid ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Combination:
    """One variant per member model, in the members' order."""

    variants: tuple[tuple[str, Variant], ...]

    @property
    def key(self) -> str:
        return " | ".join(f"{name}: {variant.key}" for name, variant in self.variants)

    @property
    def cost(self) -> tuple[float, ...]:
        """The members' costs added position by position: fewer instances in all first."""
        costs = [variant.cost for _, variant in self.variants]
        return tuple(map(sum, itertools.zip_longest(*costs, fillvalue=0.0)))

    def configs(self, study: Study) -> dict[str, dict[str, Any]]:
        return {m.name: v.apply(m.base) for m, (_, v) in zip(study.members, self.variants)}


@dataclass(frozen=True, slots=True)
class CombinedSpace:
    """The product of the members' grids; a coordinate is theirs end to end."""

    spaces: tuple[tuple[str, Space], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(n for _, space in self.spaces for n in space.shape)

    @property
    def size(self) -> int:
        size = 1
        for _, space in self.spaces:
            size *= space.size
        return size

    def _split(self, coord: Sequence[int]) -> list[Sequence[int]]:
        parts, at = [], 0
        for _, space in self.spaces:
            parts.append(coord[at : at + len(space.shape)])
            at += len(space.shape)
        return parts

    def variant(self, coord: Sequence[int]) -> Combination:
        return Combination(
            tuple((name, space.variant(part)) for (name, space), part in zip(self.spaces, self._split(coord)))
        )

    def coordinates(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n) for n in self.shape)))

    def neighbours(self, coord: Sequence[int], dims: int = 1) -> list[tuple[int, ...]]:
        return neighbours_in(self.shape, coord, dims)

    def nearest(self, variant: Combination) -> tuple[int, ...]:
        return tuple(i for (_, space), (_, v) in zip(self.spaces, variant.variants) for i in space.nearest(v))


def combined_objective(
    study: Study, objective: Objective, constraints: Sequence[Constraint]
) -> tuple[Objective, tuple[Constraint, ...]]:
    """The objective and constraints over a combination's figures (see the module header)."""
    if study.endpoint is not None:
        return objective, tuple(constraints)
    weights = tuple((f"{m}/{f}", wm * wf) for m, wm in study.weights for f, wf in objective.weights)
    per_model = tuple(Constraint(f"{m.name}/{c.metric}", c.op, c.bound) for m in study.members for c in constraints)
    return Objective(weights), per_model


def combined_figures(per_model: Mapping[str, Figures | None]) -> dict[str, Estimate] | None:
    """One level's figures of several models measured together; None when any had no success."""
    out: dict[str, Estimate] = {}
    total = [0.0, 0.0, 0.0]
    for name, figures in per_model.items():
        if figures is None:
            return None
        out.update((f"{name}/{key}", est) for key, est in figures.items())
        tp = figures["throughput"]
        total = [total[0] + tp.value, total[1] + tp.low, total[2] + tp.high]
    out["throughput"] = Estimate(*total)
    return out


def level_figures(study: Study, levels: Mapping[str, LevelResult]) -> dict[str, Estimate] | None:
    """A level's figures: the endpoint's, or every model's under `MODEL/figure` (`combined_figures`)."""
    if study.endpoint is None:
        return combined_figures({name: figures_of(lv) for name, lv in levels.items()})
    return figures_of(levels[study.endpoint.name])


# --- what a combination tune keeps ----------------------------------------------------------------


@dataclass(slots=True)
class CombinationRecord:
    combination: Combination
    configs: dict[str, dict[str, Any]]
    default: bool
    status: str = "pending"  # ok | failed
    error: str = ""
    levels: list[dict[str, LevelResult]] = field(default_factory=list)  # per level: measured model -> level
    figures: list[dict[str, Estimate] | None] = field(default_factory=list)  # per level, combined
    chosen: int | None = None
    remeasures: list[dict[str, Estimate]] = field(default_factory=list)  # the chosen level, measured again
    remeasure_levels: list[dict[str, LevelResult]] = field(default_factory=list)  # what `remeasures` came from
    measured: int = 0  # levels measured by this run (the rest came from the checkpoint)
    refused: bool = False  # the server would not load it (`error` is its reason)

    def chosen_figures(self) -> dict[str, Estimate] | None:
        return None if self.chosen is None else self.figures[self.chosen]

    def combined(self) -> dict[str, Estimate] | None:
        """The chosen level's figures merged with its re-measurements (`objectives.combine`)."""
        first = self.chosen_figures()
        return None if first is None else combine([first, *self.remeasures])

    def chosen_concurrency(self) -> int | None:
        return None if self.chosen is None else int(next(iter(self.levels[self.chosen].values())).level)


@dataclass(slots=True)
class CombinationResult:
    spec: TuneSpec
    study: Study
    space: CombinedSpace
    objective: Objective
    constraints: tuple[Constraint, ...]
    default_key: str
    records: dict[str, CombinationRecord] = field(default_factory=dict)
    ranking: Ranking | None = None
    completed: bool = False
    stop_reason: str = ""
    started_at: str = ""
    leaders: list[str] = field(default_factory=list)  # re-measured, interleaved, before the verdict

    def rank(self) -> Ranking:
        """The ranking; once leaders were re-measured, by the merged figures, and only they can tie."""
        final = any(self.records[k].remeasures for k in self.leaders)
        candidates = [
            (k, r.combination.cost, r.combined() if final else r.chosen_figures()) for k, r in self.records.items()
        ]
        return rank(candidates, self.objective, self.constraints, self.leaders if final else None)

    @property
    def best(self) -> CombinationRecord | None:
        return None if self.ranking is None or self.ranking.best is None else self.records[self.ranking.best]


def _member_space(spec: SpaceSpec, study: Study) -> SpaceSpec:
    """An ensemble's batch size bounds its composing models' (Triton refuses an ensemble whose
    max_batch_size exceeds a step's): smaller ones are left out of the grid, not measured to fail."""
    if study.mode != "ensemble" or study.endpoint is None:
        return spec
    least = int(study.endpoint.base.get("max_batch_size", 0))
    if least > spec.max_batch:
        raise PerfkitError(
            f"--max-batch-size {spec.max_batch} is below ensemble '{study.endpoint.name}''s max_batch_size {least}, "
            f"which its composing models must allow: give --max-batch-size {least} or more"
        )
    return dataclasses.replace(spec, min_batch=max(spec.min_batch, least))


def new_result(spec: TuneSpec, study: Study) -> CombinationResult:
    space = _member_space(spec.space, study)
    spaces = tuple((m.name, build_space(space, variant_of(m.base), m.base)) for m in study.members)
    objective, constraints = combined_objective(study, spec.objective, spec.constraints)
    default = Combination(tuple((m.name, variant_of(m.base)) for m in study.members))
    result = CombinationResult(spec, study, CombinedSpace(spaces), objective, constraints, default.key)
    result.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return result
