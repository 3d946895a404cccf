"""Measuring a tune of several models (`perfkit.tune.multi.study` says what is searched and how
it is ranked): each combination loaded on one server through the repository API and swept over
concurrency, every measured model under its own load at once, the leaders re-measured interleaved.

Every level is saved to the checkpoint (`perfkit.tune.multi.checkpoint`) and handed to the sink
(which writes results.csv and tune.json) as it comes; a resumed tune takes the saved levels instead
of measuring them, and loads a combination only when one of its levels is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfkit.errors import ExitCode, MissingExtension, PerfkitError, TargetError
from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.inputs import build_requests
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop
from perfkit.measure.level import ServerStatsProbe, observe_level, server_gone
from perfkit.measure.probe import check_credentials
from perfkit.measure.served import config_needed
from perfkit.progress import Progress
from perfkit.results.model import LevelResult
from perfkit.target import open_target
from perfkit.tune.bayesian import bayesian_search
from perfkit.tune.multi.checkpoint import CombinationCheckpoint, fingerprint
from perfkit.tune.multi.study import (
    Combination,
    CombinationRecord,
    CombinationResult,
    Study,
    level_figures,
    new_result,
)
from perfkit.tune.objectives import best_level
from perfkit.tune.search import brute_search, concurrency_sweep, quick_search
from perfkit.tune.space import variant_of
from perfkit.tune.state import DefaultRefused, Model, TuneSpec
from perfkit.tune.tuner import TUNE_FIX
from perfkit.wire.client import InferClient, make_client
from v2kit.runtime import eventloop

__all__ = ["CombinationTuner", "run_combination_tune"]

Sink = Callable[[CombinationResult], None]


class CombinationTuner:
    """Loads each combination on one server and measures its endpoint(s) over concurrency."""

    def __init__(
        self, spec: TuneSpec, study: Study, client: InferClient, url: str, progress: Progress,
        checkpoint: CombinationCheckpoint, sink: Sink,
    ) -> None:  # fmt: skip
        self.spec, self.study, self.client, self.url, self.progress = spec, study, client, url, progress
        self.checkpoint, self.sink = checkpoint, sink  # the sink writes the outputs after every change
        self.served: dict[str, dict[str, Any] | None] = {}  # what the server had before the tune (-u)
        self.loaded: dict[str, dict[str, Any] | None] = {}  # what the server serves now, as far as we loaded it
        self.prepared: dict[str, list[Any]] = {}
        self.stats: dict[str, ServerStatsProbe] = {}  # each model's for the whole tune: a missing extension said once
        self.silent = Progress(quiet=True)  # observes the levels measured beside the one shown

    def save(self, result: CombinationResult) -> None:
        self.checkpoint.save(result, self.served)
        self.sink(result)

    async def run(self, result: CombinationResult, served: Mapping[str, dict[str, Any] | None]) -> None:
        """Search, measure and rank; the default is each member as the server serves it (`served`,
        with -u), else as its config.pbtxt says."""
        if not await self._live():
            raise TargetError(f"cannot reach the server at {self.url}")
        spec, study = self.spec, self.study
        self.served = dict(served)
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
            if is_default and record.refused:  # every combination would be refused the same way
                raise DefaultRefused("the models with their own configurations", record.error)
            result.ranking = result.rank()
            self.save(result)
            self.progress.note(_outcome(record, result))
            try:
                combination = policy.send(record.chosen_figures())
            except StopIteration:
                break
        await self._remeasure(result)
        result.completed = True
        self.save(result)

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
            for round_ in range(self.spec.remeasure_rounds):
                for key in group:
                    await self._remeasure_one(result, result.records[key], round_)
            result.ranking = result.rank()

    async def _remeasure_one(self, result: CombinationResult, record: CombinationRecord, round_: int) -> None:
        saved = self.checkpoint.remeasures.get(record.combination.key, [])
        if round_ < len(saved):
            levels = saved[round_]
        else:
            concurrency = record.chosen_concurrency()
            if concurrency is None or await self._load(record.configs):
                return  # it loaded before; a refusal now leaves the first measurement alone
            levels = await self._level(concurrency, record)
            record.measured += 1
        record.remeasure_levels.append(levels)
        figures = level_figures(self.study, levels)
        if figures is not None:
            record.remeasures.append(figures)
        self.save(result)

    async def _live(self) -> bool:
        try:
            return await self.client.live()
        except TargetError as exc:
            check_credentials(exc)
            return False

    async def _sweep(self, record: CombinationRecord, result: CombinationResult) -> None:
        """Sweep concurrency, taking the checkpoint's levels; loaded only when a level must be measured."""
        spec, key = self.spec, record.combination.key
        if key in self.checkpoint.failures and not record.default:  # a refused default stopped that tune
            record.status, record.error = "failed", self.checkpoint.failures[key]
            return
        cached = self.checkpoint.levels.get(key, {})
        policy = concurrency_sweep(spec.concurrency[0], spec.concurrency[1], result.constraints)
        concurrency, loaded = next(policy), False
        while True:
            levels = cached.get(concurrency)
            if levels is None:
                if not loaded:
                    error = await self._load(record.configs)
                    if error:
                        record.status, record.error, record.refused = "failed", error, True
                        return
                    loaded = True
                levels = await self._level(concurrency, record)
                record.measured += 1
            record.levels.append(levels)
            figures = level_figures(self.study, levels)
            record.figures.append(figures)
            self.save(result)
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
            if name not in self.stats:
                self.stats[name] = ServerStatsProbe(lambda: client.model_statistics(name, ""), name, "")
            measurement = await observe_level(
                self.progress if shown else self.silent, loadgen, ClosedLoop(concurrency), self.spec.windows,
                batch_size=1, server=self.stats[name], resources=None,
                drain_timeout_s=self.spec.target.request_timeout_s + 5,
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
            if server_gone(level.errors, level.ok_count + level.late_ok_count):
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


def run_combination_tune(
    spec: TuneSpec, study: Study, sink: Sink, checkpoint_path: Path
) -> tuple[CombinationResult, int]:
    """Run a tune of several models on -u (explicit mode) or the bundled server, saving to
    `checkpoint_path` (and resuming from it) and handing the result to `sink` after every change;
    the result and exit code."""
    spec.validate()
    if spec.rate_mode or spec.workers or spec.space.params:
        raise PerfkitError(
            "a tune of several models (or of an ensemble) takes the knob flags and measures by concurrency on one "
            "server: leave out --request-rate-range, --workers and --param"
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
            server = "embedded" if target.embedded else target.url
            checkpoint = CombinationCheckpoint(checkpoint_path, fingerprint(spec, study, server))
            tuner = CombinationTuner(spec, study, client, target.url, progress, checkpoint, sink)
            eventloop.run(_run(tuner, result, restore=not target.embedded))
    except KeyboardInterrupt:
        return result, ExitCode.INTERRUPTED
    except TargetError as exc:
        if not result.records:
            raise
        result.stop_reason = str(exc)
        result.ranking = result.rank()
        sink(result)
        return result, ExitCode.FAILED
    finally:
        progress.close()
    return result, (ExitCode.OK if result.best is not None else ExitCode.FAILED)


async def _run(tuner: CombinationTuner, result: CombinationResult, restore: bool) -> None:
    names = [m.name for m in tuner.study.members] + ([tuner.study.endpoint.name] if tuner.study.endpoint else [])
    served: dict[str, dict[str, Any] | None] = {}
    try:
        if tuner.checkpoint.served is not None:  # a resumed tune: the server may hold any combination now
            served = tuner.checkpoint.served
        elif restore:
            for name in dict.fromkeys(names):
                try:
                    served[name] = await tuner.client.model_config(name)
                except MissingExtension as missing:
                    raise config_needed("perfkit tune", tuner.url, missing, TUNE_FIX) from None
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
