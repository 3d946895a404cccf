"""`perfkit tune`: measure variants of a model's configuration and recommend the best, as
model_analyzer's `profile` does, with perfkit's own measurement.

Theory of operation:

1. Target. Without -u, the bundled server runs in explicit model-control mode on the model
   folder's parent, with nothing loaded. With -u, a running server in explicit mode (ours or
   Triton) is used and its configuration of the model (`/config`) is the default variant; the tune
   ends by loading that configuration back. Every variant is loaded through the repository load
   API with a `config` override, the model's own config.pbtxt changed by `Variant.apply`: no file
   is written on the server, and a reload replaces the previous variant.
2. Search. The policy of `perfkit.tune.search` (brute or quick) yields variants; each is swept over
   concurrency by `search.concurrency_sweep`, one `measure.measure_level` per level (warmup,
   windows, stability: the statistics of `perfkit sweep`). The best level (feasible first, by the
   objective) stands for the variant and its figures go back to the policy. A variant the server
   refuses is recorded as failed, with the server's reason, and the policy is told (None).
3. Checkpoint. Every level and every failure is saved at once to the checkpoint (JSON, with a
   fingerprint of what makes measurements comparable: model, base config, server, protocol,
   windows, inputs). A resumed tune replays the policies against the saved levels and measures
   only what is missing; the objective, constraints and search may change between the runs.
4. Ranking. The leaders of the first pass are re-measured at their chosen concurrency, round-robin
   (A B C A B C, so that a slow spell of the machine does not favour one of them), and ranked by
   `objectives.rank`: the leader, the variants tied with it, and the cheapest of them recommended.
5. Several servers. With --workers, `perfkit.tune.distributed.RayTuner` keeps steps 2–4 and
   measures the independent variants of a batch (see `perfkit.tune.search`) on several endpoints at
   once, one Ray actor each, with this module's `TuneServer` and `sweep_variant`. Which tuner runs
   is chosen by whoever opens it (`perfkit.tune.distributed.open_tuner`), so this module never
   imports the Ray one.

This module measures and ranks; what a tune is asked for and keeps (`TuneSpec`, `Model`, `Record`,
`TuneResult`, `Checkpoint`, `read_model`) is in `perfkit.tune.state`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from perfkit.errors import ExitCode, MissingExtension, PerfkitError, TargetError
from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.inputs import build_requests
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, OpenLoop
from perfkit.measure.level import ServerStatsProbe, observe_level, server_gone
from perfkit.measure.metrics_source import server_label, with_server_metrics
from perfkit.measure.probe import check_credentials
from perfkit.measure.resources import ResourceSampler
from perfkit.measure.served import config_needed
from perfkit.progress import Progress
from perfkit.results.model import LevelResult, level_name, to_jsonable
from perfkit.target import Target, lists_extension, open_target
from perfkit.tune.bayesian import bayesian_search, default_budget
from perfkit.tune.objectives import best_level, figures_of
from perfkit.tune.search import brute_search, concurrency_sweep, quick_search, rate_sweep, sustains
from perfkit.tune.space import Space, Variant, build_space, default_variant, variant_of
from perfkit.tune.state import Checkpoint, DefaultRefused, Model, Record, TuneResult, TuneSpec, read_model
from perfkit.wire.client import InferClient, make_client
from v2kit.runtime import eventloop

#: What to do where the server has no model configuration: tune reads and loads variants of it.
TUNE_FIX = (
    "tune loads variants of the model's configuration through Triton's repository API: tune on Triton or the "
    "bundled server (leave out -u), and measure this server with perfkit sweep"
)

# --- the tuner ------------------------------------------------------------------------------------


class TuneServer:
    """One server that variants are loaded on and measured against: its client, the model's
    requests (prepared at the first load that succeeds), and the resource sampler."""

    def __init__(self, spec: TuneSpec, model: Model, target: Target, progress: Progress) -> None:
        self.spec, self.model, self.target, self.progress = spec, model, target, progress
        self.client: InferClient = make_client(
            target.url, target.protocol, request_timeout_s=spec.target.request_timeout_s,
            headers=dict(spec.target.headers), tls=spec.target.tls,
        )  # fmt: skip
        self.prepared: list[Any] | None = None
        self.resources = self._sampler()
        # One for the whole tune, so that a server without the statistics extension is said once.
        self.stats = ServerStatsProbe(lambda: self.client.model_statistics(model.name, ""), model.name, "")

    def _sampler(self) -> ResourceSampler:
        t = self.target
        return ResourceSampler(interval_s=0.5, metrics_urls=t.metrics_urls, server_pid=t.server_pid, local_gpu=t.embedded)

    def know_server(self, metadata: dict[str, Any]) -> str:
        """Name the server in the statistics note and read its metrics where its identity says
        (--collect-metrics without --metrics-url), before the sampling starts; the console line
        to say about its metrics ("" when none)."""
        self.stats.server = server_label(metadata)
        self.stats.offered = lists_extension(metadata, "statistics")
        self.target, note = with_server_metrics(self.target, metadata, self.spec.collect_metrics)
        self.resources = self._sampler()
        return note

    async def server_metadata(self) -> dict[str, Any]:
        """The server's metadata ({} when it gives none). Being the first call that needs
        credentials, it stops the tune when the server refuses them."""
        try:
            return await self.client.server_metadata()
        except TargetError as exc:
            check_credentials(exc)
            return {}

    async def served_config(self) -> dict[str, Any] | None:
        """The configuration the server has loaded for the model; None when it has none. A server
        without the model configuration extension (MLServer, KServe) cannot be tuned: refused."""
        try:
            return await self.client.model_config(self.model.name)
        except MissingExtension as missing:
            raise config_needed("perfkit tune", self.target.url, missing, TUNE_FIX) from None
        except TargetError as exc:
            check_credentials(exc)
            return None

    async def load(self, config: dict[str, Any]) -> str:
        """Load a variant; "" when it is ready, else the server's reason."""
        try:
            await self.client.load_model(self.model.name, config)
        except TargetError as exc:
            check_credentials(exc)  # not the variant's fault: every other load would be refused too
            try:
                alive = await self.client.live()
            except TargetError:
                alive = False
            if not alive:
                raise TargetError(f"the server at {self.target.url} stopped answering during a load: {exc}") from None
            text = str(exc)
            if "not allowed" in text or "polling is enabled" in text:
                raise TargetError(
                    f"{text}; tune loads each variant through the repository API: start the server with "
                    "--model-control-mode explicit (or leave out -u to use the bundled server)"
                ) from None
            return text
        if self.prepared is None:
            metadata = await self.client.model_metadata(self.model.name)
            config = await self.client.model_config(self.model.name)
            if "sequence_batching" in config:  # its requests need ids and START/END: sweep sends them
                raise PerfkitError(
                    f"model '{self.model.name}' is a sequence model (sequence_batching): perfkit tune does not "
                    "drive sequences; measure its variants with perfkit sweep --sequence-length N"
                )
            requests = build_requests(
                metadata, config, model=self.model.name, shapes={n: list(d) for n, d in self.spec.shapes},
                input_data=self.spec.input_data, seed=self.spec.seed,
            )  # fmt: skip
            self.prepared = [self.client.prepare(r) for r in requests]
        return ""

    async def level(self, value: int, record: Record) -> LevelResult:
        """One level of the variant: `value` clients (closed loop), or requests per second (open loop)."""
        assert self.prepared is not None
        spec = self.spec
        loadgen = LoadGenerator(self.client, self.prepared, SampleBuffer(), RealClock())
        load = OpenLoop(value, spec.request_distribution, spec.seed) if spec.rate_mode else ClosedLoop(value)
        measurement = await observe_level(
            self.progress, loadgen, load, self.spec.windows, batch_size=1, server=self.stats,
            resources=self.resources, drain_timeout_s=self.spec.target.request_timeout_s + 5,
        )  # fmt: skip
        level = measurement.result
        if server_gone(level.errors, level.ok_count + level.late_ok_count):
            raise TargetError(f"the server stopped answering while measuring {record.variant.key}")
        return level

    async def restore(self, config: dict[str, Any] | None) -> None:
        """Leave the server serving `config` (None: the model unloaded), as before the tune (best effort)."""
        try:
            if config is not None:
                await self.client.load_model(self.model.name, config)
            else:
                await self.client.unload_model(self.model.name)
        except (TargetError, OSError) as exc:
            self.progress.note(f"could not restore model '{self.model.name}' on {self.target.url}: {exc}")


async def sweep_variant(
    record: Record,
    cached: dict[int, LevelResult],
    spec: TuneSpec,
    load: Callable[[dict[str, Any]], Awaitable[str]],
    level: Callable[[int, Record], Awaitable[LevelResult]],
    on_level: Callable[[], None],
) -> None:
    """Measure one variant over concurrency (`search.concurrency_sweep`) or request rate
    (`search.rate_sweep`), taking the levels in `cached` instead of measuring them; the variant is
    loaded only when a level must be measured."""
    if spec.rate_mode:
        policy = rate_sweep(spec.request_rates[0], spec.request_rates[1], spec.constraints)
    else:
        policy = concurrency_sweep(spec.concurrency[0], spec.concurrency[1], spec.constraints)
    loaded = False
    value = next(policy)
    while True:
        found = cached.get(value)
        if found is None:
            if not loaded:
                error = await load(record.config)
                if error:
                    record.status, record.error, record.refused = "failed", error, True
                    return
                loaded = True
            found = await level(value, record)
            record.measured += 1
        record.levels.append(found)
        on_level()
        try:
            value = policy.send(figures_of(found))
        except StopIteration:
            break
    record.chosen = choose_level(record.levels, spec)
    if record.chosen is None:
        errors = "; ".join(f"{k} ×{n}" for lv in record.levels for k, n in lv.errors.items())
        record.status, record.error = "failed", f"no request succeeded ({errors or 'no requests'})"
    else:
        record.status = "ok"


def choose_level(levels: list[LevelResult], spec: TuneSpec) -> int | None:
    """The level that stands for a variant: the best by the objective, feasible first. In rate
    mode, among the rates the variant sustained when there are any (a rate it fell behind is not
    one it can serve, whatever it completed meanwhile)."""
    figures = [figures_of(lv) for lv in levels]
    if spec.rate_mode:
        kept = [f if sustains(f, lv.level, spec.constraints) else None for f, lv in zip(figures, levels)]
        if any(f is not None for f in kept):
            figures = kept
    return best_level(figures, spec.objective, spec.constraints)


class Tuner:
    """Drives a tune on one server, one variant at a time. `perfkit.tune.distributed.RayTuner`
    keeps the same search, checkpoint and ranking, and measures on several servers at once."""

    def __init__(
        self, spec: TuneSpec, model: Model, target: Target, progress: Progress, sink: Callable[[TuneResult], None]
    ) -> None:
        self.spec, self.model, self.progress = spec, model, progress
        self.sink = sink  # called with the result after every change: writes the outputs
        self.target = target
        self.server = TuneServer(spec, model, target, progress)
        self.checkpoint: Checkpoint | None = None
        self.default_config: dict[str, Any] = model.base
        self.result: TuneResult | None = None

    def fingerprint(self) -> dict[str, Any]:
        return self._fingerprint("embedded" if self.target.embedded else self.target.url)

    def _fingerprint(self, server: str) -> dict[str, Any]:
        s = self.spec
        fingerprint: dict[str, Any] = to_jsonable({
            "model": self.model.name, "base_config": self.model.base, "server": server, "protocol": s.target.protocol,
            "windows": dataclasses.asdict(s.windows), "shapes": s.shapes, "input_data": s.input_data, "seed": s.seed,
        })  # fmt: skip
        if s.rate_mode:  # levels are keyed by their value: rates and concurrencies must not mix
            fingerprint["load"] = f"request_rate {s.request_distribution}"
        return fingerprint

    async def run(self, checkpoint_path: Path) -> TuneResult:
        client = self.server.client
        try:
            try:
                if not await client.live():
                    raise TargetError(f"{self.target.url} answers but is not live")
            except TargetError as exc:
                raise TargetError(f"cannot reach the server: {exc}") from None
            server = await self.server.server_metadata()
            if note := self.server.know_server(server):
                self.progress.note(note)
            checkpoint = self._open_checkpoint(checkpoint_path)
            if checkpoint.default_config is None and not self.target.embedded:
                served = await self.server.served_config()
                if served is not None:  # else the model is not loaded and the local config is the default
                    self.default_config, checkpoint.server_had_model = served, True
            result = self._new_result()
            result.server = server
            await self.server.resources.start()
            try:
                await self._tune(result)
            finally:
                await self.server.resources.stop()
                if not self.target.embedded:
                    await self.server.restore(self.default_config if checkpoint.server_had_model else None)
            return result
        finally:
            await client.close()

    def _open_checkpoint(self, path: Path) -> Checkpoint:
        checkpoint = self.checkpoint = Checkpoint(path, self.fingerprint())
        if checkpoint.default_config is not None:  # a resumed tune: the server may hold any variant now
            self.default_config = checkpoint.default_config
        return checkpoint

    def _new_result(self) -> TuneResult:
        default = default_variant(self.default_config, self.spec.space.params)
        space = build_space(self.spec.space, variant_of(self.model.base), self.model.base)
        self.result = result = TuneResult(self.spec, self.model, space, default.key)
        if self.checkpoint is not None:  # a default refused before stopped that tune: try it again
            self.checkpoint.failures.pop(default.key, None)
        result.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return result

    async def _tune(self, result: TuneResult) -> None:
        await self._search(result, default_variant(self.default_config, self.spec.space.params), result.space)
        await self._remeasure(result)
        result.ranking = result.rank(final=True)
        result.completed = True
        self._save(result)

    async def _search(self, result: TuneResult, default: Variant, space: Space) -> None:
        spec = self.spec
        if spec.search == "quick":
            policy = quick_search(space, default, spec.objective, spec.constraints)
        elif spec.search == "bayesian":
            policy = bayesian_search(
                space, default, spec.objective, spec.constraints, budget=spec.budget, seed=spec.seed
            )
        else:
            policy = brute_search(space, default)
        variant = next(policy)
        while True:
            record = self._start_record(result, variant)
            await self._measure_variant(record)
            self._finish_record(result, record)
            try:
                variant = policy.send(record.figures())
            except StopIteration:
                return

    def _start_record(self, result: TuneResult, variant: Variant, where: str = "") -> Record:
        """A new record for `variant`, in the result (in the order the policy gave the variants)."""
        default = variant.key == result.default_key
        config = self.default_config if default else variant.apply(self.model.base)
        record = result.records[variant.key] = Record(variant, config, default)
        space = result.space
        total = space.size + (0 if result.default_key in {space.variant(c).key for c in space.coordinates()} else 1)
        search = self.spec.search
        if search == "bayesian":
            total = min(total, self.spec.budget or default_budget(space))
        of = f"{total}" if search == "brute" else f"at most {total}, {search} search"
        self.progress.note(f"variant {len(result.records)} of {of}: {variant.key}{where}")
        return record

    def _finish_record(self, result: TuneResult, record: Record) -> None:
        if record.default and record.refused:
            raise DefaultRefused(f"model '{self.model.name}' with its own configuration", record.error)
        result.ranking = result.rank()
        self.progress.note(describe_outcome(record, result))
        self._save(result)

    async def _measure_variant(self, record: Record) -> None:
        assert self.checkpoint is not None
        key = record.variant.key
        if key in self.checkpoint.failures:
            record.status, record.error = "failed", self.checkpoint.failures[key]
            return
        await sweep_variant(
            record, self.checkpoint.levels.get(key, {}), self.spec, self._load, self._level, self._save_progress
        )

    def _save_progress(self) -> None:
        if self.result is not None:
            self._save(self.result)

    async def _remeasure(self, result: TuneResult) -> None:
        """Re-measure the leaders round-robin; again for any variant that overtakes them meanwhile
        (their means may drop), so that the winner is always a re-measured variant."""
        assert self.checkpoint is not None
        for _ in range(3 if self.spec.remeasure_rounds else 0):
            ranking = result.rank(final=bool(result.leaders))
            group = [k for k in ranking.leaders(self.spec.leaders) if k not in result.leaders]
            if ranking.leader in result.leaders or not group or len(group) + len(result.leaders) < 2:
                return
            result.leaders += group
            self.progress.note(f"re-measuring, interleaved: {', '.join(group)}")
            await self._remeasure_group(result, group)

    async def _remeasure_group(self, result: TuneResult, group: list[str]) -> None:
        assert self.checkpoint is not None
        for round_ in range(self.spec.remeasure_rounds):
            for key in group:
                record = result.records[key]
                saved = self.checkpoint.remeasures.get(key, [])
                if round_ < len(saved):
                    level = saved[round_]
                else:
                    assert record.chosen is not None
                    if await self._load(record.config):
                        continue  # it loaded before; a refusal now leaves the first measurement alone
                    level = await self._level(int(record.levels[record.chosen].level), record)
                    record.measured += 1
                record.remeasures.append(level)
                self._save(result)

    async def _load(self, config: dict[str, Any]) -> str:
        return await self.server.load(config)

    async def _level(self, concurrency: int, record: Record) -> LevelResult:
        return await self.server.level(concurrency, record)

    def _save(self, result: TuneResult) -> None:
        assert self.checkpoint is not None
        self.checkpoint.save(result, self.default_config)
        self.sink(result)


def describe_outcome(record: Record, result: TuneResult) -> str:
    """One progress line: what the variant reached, and the leader so far."""
    if record.status == "failed":
        text = f"  failed: {record.error}"
    else:
        assert record.chosen is not None and result.ranking is not None
        lv = record.levels[record.chosen]
        feasible = result.ranking.entry(record.variant.key).status == "feasible"
        text = (
            f"  {lv.throughput_infer_per_s:.1f} infer/s at {level_name(lv.mode, lv.level)}, "
            f"p99 {lv.latency.p99_us / 1000:.2f} ms{'' if feasible else ', breaks the constraints'}"
        )
    leader = result.ranking.leader if result.ranking else None
    return text + (f"; best so far: {leader}" if leader else "")


#: Opens the tuner for a tune (`one_server_tuner`, or `perfkit.tune.distributed.open_tuner`,
#: which runs a RayTuner with --workers).
TunerOpener = Callable[[TuneSpec, Model, Progress, Callable[[TuneResult], None]], AbstractContextManager[Tuner]]


@contextlib.contextmanager
def one_server_tuner(
    spec: TuneSpec, model: Model, progress: Progress, sink: Callable[[TuneResult], None]
) -> Iterator[Tuner]:
    """The tuner on one server: -u, or the bundled server in explicit mode on the model folder's parent."""
    t, metrics_urls = spec.target, (spec.metrics_url,) if spec.metrics_url else ()
    with open_target(t.url, t.protocol, metrics_urls=metrics_urls, model_repository=model.folder.parent,
                     server_args=["--model-control-mode", "explicit"]) as target:  # fmt: skip
        if target.embedded:
            progress.note(f"tuning '{model.name}' on the bundled server at {target.url} (explicit mode)")
        yield Tuner(spec, model, target, progress, sink)


def run_tune(
    spec: TuneSpec, sink: Callable[[TuneResult], None], checkpoint_path: Path, open_tuner: TunerOpener
) -> tuple[TuneResult | None, int]:
    """Run the tune on the tuner `open_tuner` gives; its result (partial when interrupted) and the exit code."""
    spec.validate()
    model = read_model(spec.config_path)
    progress = Progress(quiet=spec.quiet)
    tuner: Tuner | None = None
    try:
        with open_tuner(spec, model, progress, sink) as tuner:
            result = eventloop.run(tuner.run(checkpoint_path))
    except KeyboardInterrupt:
        return (tuner.result if tuner else None), ExitCode.INTERRUPTED
    except TargetError as exc:
        if tuner is not None and tuner.result is not None:
            tuner.result.stop_reason = str(exc)
            sink(tuner.result)
            return tuner.result, ExitCode.FAILED
        raise
    finally:
        progress.close()
    return result, (ExitCode.OK if result.best is not None else ExitCode.FAILED)
