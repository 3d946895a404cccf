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
2. The grid. Each member has its own grid (`search.build_space`); the combined grid is their
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

Not here: a one-model tune's checkpoint, Ray workers and request-rate search. The outputs are a
tune.json and summary of their own (`perfkit.report.tune_tables.render_combination_*`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import ExitCode, PerfkitError, TargetError
from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.inputs import build_requests
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop
from perfkit.measure.level import ServerStatsProbe, observe_level, server_gone
from perfkit.measure.probe import check_credentials
from perfkit.progress import Progress
from perfkit.results.model import LevelResult
from perfkit.target import open_target
from perfkit.tune.bayesian import bayesian_search
from perfkit.tune.objectives import (
    Constraint,
    Estimate,
    Figures,
    Objective,
    Ranking,
    best_level,
    combine,
    figures_of,
    rank,
)
from perfkit.tune.search import (
    Space,
    SpaceSpec,
    Variant,
    brute_search,
    build_space,
    concurrency_sweep,
    neighbours_in,
    quick_search,
    variant_of,
)
from perfkit.tune.state import Model, TuneSpec, read_model
from perfkit.wire.client import InferClient, make_client
from v2kit.runtime import eventloop

__all__ = [
    "Combination",
    "CombinationRecord",
    "CombinationResult",
    "CombinedSpace",
    "Study",
    "combined_figures",
    "combined_objective",
    "parse_weights",
    "read_study",
    "run_combination_tune",
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


# --- measuring ------------------------------------------------------------------------------------


class CombinationTuner:
    """Loads each combination on one server and measures its endpoint(s) over concurrency."""

    def __init__(self, spec: TuneSpec, study: Study, client: InferClient, url: str, progress: Progress) -> None:
        self.spec, self.study, self.client, self.url, self.progress = spec, study, client, url, progress
        self.loaded: dict[str, dict[str, Any] | None] = {}  # what the server serves now, as far as we loaded it
        self.prepared: dict[str, list[Any]] = {}
        self.silent = Progress(quiet=True)  # observes the levels measured beside the one shown

    async def run(self, result: CombinationResult, served: Mapping[str, dict[str, Any] | None]) -> None:
        """Search, measure and rank; the default is each member as the server serves it (`served`,
        with -u), else as its config.pbtxt says."""
        if not await self._live():
            raise TargetError(f"cannot reach the server at {self.url}")
        spec, study = self.spec, self.study
        defaults = {m.name: served.get(m.name) or m.base for m in study.members}
        default = Combination(tuple((m.name, variant_of(defaults[m.name])) for m in study.members))
        result.default_key = default.key
        if spec.search == "quick":
            policy = quick_search(result.space, default, result.objective, result.constraints)
        elif spec.search == "bayesian":
            policy = bayesian_search(
                result.space, default, result.objective, result.constraints, budget=spec.budget, seed=spec.seed
            )
        else:
            policy = brute_search(result.space, default)
        combination = next(policy)
        while True:
            is_default = combination.key == result.default_key
            configs = defaults if is_default else combination.configs(study)
            record = result.records[combination.key] = CombinationRecord(combination, configs, is_default)
            self.progress.note(f"combination {len(result.records)} ({spec.search} search): {combination.key}")
            await self._sweep(record, result)
            result.ranking = result.rank()
            self.progress.note(_outcome(record, result))
            try:
                combination = policy.send(record.chosen_figures())
            except StopIteration:
                break
        await self._remeasure(result)
        result.completed = True

    async def _remeasure(self, result: CombinationResult) -> None:
        """The leaders measured again at their chosen concurrency, round-robin (A B C A B C), as a
        one-model tune does, so that one lucky measurement does not name the winner; again for a
        combination that overtakes them meanwhile, so that the leader is always re-measured."""
        for _ in range(3 if self.spec.remeasure_rounds else 0):
            assert result.ranking is not None
            group = [k for k in result.ranking.leaders(self.spec.leaders) if k not in result.leaders]
            if result.ranking.leader in result.leaders or not group or len(group) + len(result.leaders) < 2:
                return
            result.leaders += group
            self.progress.note(f"re-measuring, interleaved: {'; '.join(group)}")
            for _ in range(self.spec.remeasure_rounds):
                for key in group:
                    record = result.records[key]
                    concurrency = record.chosen_concurrency()
                    if concurrency is None or await self._load(record.configs):
                        continue  # it loaded before; a refusal now leaves the first measurement alone
                    figures = self._figures(await self._level(concurrency, record))
                    if figures is not None:
                        record.remeasures.append(figures)
            result.ranking = result.rank()

    def _figures(self, levels: dict[str, LevelResult]) -> dict[str, Estimate] | None:
        if self.study.endpoint is None:
            return combined_figures({name: figures_of(lv) for name, lv in levels.items()})
        return figures_of(levels[self.study.endpoint.name])

    async def _live(self) -> bool:
        try:
            return await self.client.live()
        except TargetError as exc:
            check_credentials(exc)
            return False

    async def _sweep(self, record: CombinationRecord, result: CombinationResult) -> None:
        spec = self.spec
        error = await self._load(record.configs)
        if error:
            record.status, record.error = "failed", error
            return
        policy = concurrency_sweep(spec.concurrency[0], spec.concurrency[1], result.constraints)
        concurrency = next(policy)
        while True:
            levels = await self._level(concurrency, record)
            record.levels.append(levels)
            figures = self._figures(levels)
            record.figures.append(figures)
            try:
                concurrency = policy.send(figures)
            except StopIteration:
                break
        record.chosen = best_level(record.figures, result.objective, result.constraints)
        record.status = "ok" if record.chosen is not None else "failed"
        if record.chosen is None:
            record.error = "no request succeeded"

    async def _load(self, configs: dict[str, dict[str, Any]]) -> str:
        """Load the members whose configuration changed, then the endpoint; "" or the server's reason."""
        wanted: list[tuple[str, dict[str, Any] | None]] = [
            (n, c) for n, c in configs.items() if self.loaded.get(n) != c
        ]
        endpoint = self.study.endpoint
        if endpoint is not None and endpoint.name not in configs and (wanted or endpoint.name not in self.loaded):
            wanted.append((endpoint.name, None))
        for name, config in wanted:
            self.loaded.pop(name, None)
            try:
                await self.client.load_model(name, config)
            except TargetError as exc:
                check_credentials(exc)
                text = str(exc)
                if "not allowed" in text or "polling is enabled" in text:
                    raise TargetError(
                        f"{text}; tune loads each combination through the repository API: start the server with "
                        "--model-control-mode explicit (or leave out -u to use the bundled server)"
                    ) from None
                return f"{name}: {text}"
            self.loaded[name] = config
        for model in self.study.measured:
            if model.name not in self.prepared:
                metadata = await self.client.model_metadata(model.name)
                config = await self.client.model_config(model.name)
                requests = build_requests(
                    metadata, config, model=model.name, shapes={n: list(d) for n, d in self.spec.shapes},
                    input_data=self.spec.input_data, seed=self.spec.seed,
                )  # fmt: skip
                self.prepared[model.name] = [self.client.prepare(r) for r in requests]
        return ""

    async def _level(self, concurrency: int, record: CombinationRecord) -> dict[str, LevelResult]:
        """One level on every measured model at once; each keeps its load until all are measured."""
        measured = self.study.measured
        all_done = asyncio.Event()
        remaining = [len(measured)]

        async def one(model: Model, shown: bool) -> LevelResult:
            client, name = self.client, model.name
            loadgen = LoadGenerator(client, self.prepared[name], SampleBuffer(), RealClock())
            measurement = await observe_level(
                self.progress if shown else self.silent, loadgen, ClosedLoop(concurrency), self.spec.windows,
                batch_size=1, server=ServerStatsProbe(lambda: client.model_statistics(name, ""), name, ""),
                resources=None, drain_timeout_s=self.spec.target.request_timeout_s + 5,
            )  # fmt: skip
            remaining[0] -= 1
            if remaining[0] == 0:
                all_done.set()
            else:  # the neighbours are still measured: keep this model's load on them
                filler = LoadGenerator(client, self.prepared[name], SampleBuffer(), RealClock())
                filler.start(ClosedLoop(concurrency))
                await all_done.wait()
                await filler.stop(self.spec.target.request_timeout_s + 5)
            return measurement.result

        results = await asyncio.gather(*(one(m, i == 0) for i, m in enumerate(measured)))
        for level in results:
            if server_gone(level.errors, level.ok_count):
                raise TargetError(f"the server stopped answering while measuring {record.combination.key}")
        return {m.name: lv for m, lv in zip(measured, results)}

    async def restore(self, served: dict[str, dict[str, Any] | None]) -> None:
        """Leave each model as the server had it before the tune (best effort)."""
        for name, config in served.items():
            try:
                if config is not None:
                    await self.client.load_model(name, config)
                else:
                    await self.client.unload_model(name)
            except (TargetError, OSError) as exc:
                self.progress.note(f"could not restore model '{name}' on {self.url}: {exc}")


def _outcome(record: CombinationRecord, result: CombinationResult) -> str:
    if record.status == "failed":
        text = f"  failed: {record.error}"
    else:
        figures = record.chosen_figures()
        assert figures is not None and result.ranking is not None
        feasible = result.ranking.entry(record.combination.key).status == "feasible"
        text = (
            f"  {figures['throughput'].value:.1f} infer/s at concurrency {record.chosen_concurrency()}"
            f"{'' if feasible else ', breaks the constraints'}"
        )
    return text + (f"; best so far: {result.ranking.leader}" if result.ranking and result.ranking.leader else "")


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


def run_combination_tune(spec: TuneSpec, study: Study) -> tuple[CombinationResult, int]:
    """Run a tune of several models on -u (explicit mode) or the bundled server; the result and exit code."""
    spec.validate()
    if spec.rate_mode or spec.workers or spec.checkpoint is not None or spec.space.params:
        raise PerfkitError(
            "a tune of several models (or of an ensemble) takes the knob flags and measures by concurrency on one "
            "server: leave out --request-rate-range, --workers, --checkpoint and --param"
        )
    result = new_result(spec, study)
    progress = Progress(quiet=spec.quiet)
    t = spec.target
    repository = study.members[0].folder.parent
    try:
        with open_target(t.url, t.protocol, model_repository=repository,
                         server_args=["--model-control-mode", "explicit"]) as target:  # fmt: skip
            client = make_client(
                target.url, target.protocol, request_timeout_s=t.request_timeout_s, headers=dict(t.headers), tls=t.tls
            )
            tuner = CombinationTuner(spec, study, client, target.url, progress)
            eventloop.run(_run(tuner, result, restore=not target.embedded))
    except KeyboardInterrupt:
        return result, ExitCode.INTERRUPTED
    except TargetError as exc:
        if not result.records:
            raise
        result.stop_reason = str(exc)
        result.ranking = result.rank()
        return result, ExitCode.FAILED
    finally:
        progress.close()
    return result, (ExitCode.OK if result.best is not None else ExitCode.FAILED)


async def _run(tuner: CombinationTuner, result: CombinationResult, restore: bool) -> None:
    names = [m.name for m in tuner.study.members] + ([tuner.study.endpoint.name] if tuner.study.endpoint else [])
    served: dict[str, dict[str, Any] | None] = {}
    try:
        if restore:
            for name in dict.fromkeys(names):
                try:
                    served[name] = await tuner.client.model_config(name)
                except TargetError as exc:
                    check_credentials(exc)
                    served[name] = None
        try:
            await tuner.run(result, served)
        finally:
            if restore:
                await tuner.restore(served)
    finally:
        await tuner.client.close()
