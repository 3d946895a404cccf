"""`perfkit tune -u A -u B --workers 2`: a tune's variants measured on several servers at once, one
Ray actor per server.

Theory of operation. The search policies of `perfkit.tune.search` are batch policies: the variants of a
batch do not depend on one another's results (brute search: the whole grid; quick search: one
neighbourhood of the climb). `RayTuner`, the driver, hands each variant of a batch to an idle actor.
An actor owns one endpoint: it loads the variant there through the repository API (explicit model
control, as a sequential tune does), sweeps its concurrency with the sequential tune's own code
(`tune.sweep_variant`), and returns the Record. The driver enters the records in the policy's order
and sends a batch's figures back once all are in, so the variants, the ranking, the checkpoint and the
outputs are those of a sequential tune; only the measuring is spread. The leaders' re-measurements
are spread the same way, round by round.

The variants are compared across servers, so the endpoints should be alike: replicas of one server
on the same kind of machine. At the end each actor loads back on its server what that server served
before the tune.

Failures. An endpoint that does not answer at the start is reported and left out. One that fails
while measuring (its server stops answering, or its actor dies) is reported, the variant it was
measuring is recorded as failed with the reason, and the search goes on with the other endpoints.
When none is left, the tune stops as a sequential one does when its server goes: the checkpoint,
saved after every variant (a sequential tune saves after every level), resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from perfkit.errors import TargetError
from perfkit.load.cluster.runtime import ray_runtime
from perfkit.progress import Progress
from perfkit.results.model import LevelResult
from perfkit.target import Target
from perfkit.tune.bayesian import bayesian_batches
from perfkit.tune.search import brute_batches, quick_batches
from perfkit.tune.space import Space, Variant
from perfkit.tune.state import Model, Record, TuneResult, TuneSpec
from perfkit.tune.tuner import Tuner, TuneServer, one_server_tuner, sweep_variant

__all__ = ["EndpointActor", "EndpointState", "RayTuner", "RayWorker", "Worker", "open_tuner", "ray_tuner"]

#: How long the actors may take to start; Ray queues an actor while no CPU is free for it.
ACTOR_START_TIMEOUT_S = 120.0

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


@dataclass(frozen=True, slots=True)
class EndpointState:
    """What an endpoint served when its actor opened it."""

    config: dict[str, Any] | None  # the model's configuration; None: the model was not loaded
    server: dict[str, Any] = field(default_factory=dict)  # the server's metadata


class Worker(Protocol):
    """One endpoint, measured elsewhere. Every method raises TargetError when the endpoint or its
    worker fails; a variant the server refuses is a failed Record, not an error."""

    url: str

    async def open(self) -> EndpointState: ...

    async def measure_variant(self, record: Record, cached: dict[int, LevelResult]) -> Record: ...

    async def measure_level(self, config: dict[str, Any], concurrency: int, record: Record) -> LevelResult | None: ...

    async def close(self, restore: bool, config: dict[str, Any] | None) -> None: ...


class EndpointActor:
    """Runs in a Ray actor (an async one: its client lives on the actor's event loop between calls)."""

    def __init__(self, spec: TuneSpec, model: Model, url: str) -> None:
        self.spec, self.model, self.url = spec, model, url
        self.server: TuneServer | None = None

    async def open(self) -> EndpointState:
        given = (self.spec.metrics_url,) if self.spec.metrics_url else ()
        target = Target(self.url, self.spec.target.protocol, given, None, embedded=False)
        server = self.server = TuneServer(self.spec, self.model, target, Progress(quiet=True))
        if not await server.client.live():
            raise TargetError(f"{self.url} answers but is not live")
        metadata = await server.server_metadata()  # raises when the server refuses -H's credentials
        server.know_server(metadata)  # its metrics where its identity says: Triton's port 8002, ...
        config = await server.served_config()
        await server.resources.start()
        return EndpointState(config, metadata)

    async def measure_variant(self, record: Record, cached: dict[int, LevelResult]) -> Record:
        assert self.server is not None
        server = self.server
        record.endpoint = self.url
        await sweep_variant(record, cached, self.spec, server.load, server.level, on_level=lambda: None)
        return record

    async def measure_level(self, config: dict[str, Any], concurrency: int, record: Record) -> LevelResult | None:
        """One level of an already measured variant; None when the server now refuses it."""
        assert self.server is not None
        if await self.server.load(config):
            return None
        return await self.server.level(concurrency, record)

    async def close(self, restore: bool, config: dict[str, Any] | None) -> None:
        if self.server is None:
            return
        try:
            await self.server.resources.stop()
            if restore:
                await self.server.restore(config)
        finally:
            await self.server.client.close()


class RayWorker:
    """The driver's side of an EndpointActor: Ray's failures become TargetError."""

    def __init__(self, ray: Any, actor: Any, url: str) -> None:
        self.ray, self.actor, self.url = ray, actor, url

    async def _call(self, ref: Any) -> Any:
        try:
            return await ref
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (TargetError, OSError)):
                raise TargetError(str(cause)) from None
            raise  # a bug in the actor's code: keep its traceback
        except self.ray.exceptions.RayError as exc:
            raise TargetError(f"its Ray actor is gone ({type(exc).__name__})") from None

    async def open(self) -> EndpointState:
        try:
            state: EndpointState = await asyncio.wait_for(self._call(self.actor.open.remote()), ACTOR_START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise TargetError(
                f"its Ray actor did not start within {ACTOR_START_TIMEOUT_S:.0f} s: the Ray cluster needs a free CPU "
                "for each -u endpoint"
            ) from None
        return state

    async def measure_variant(self, record: Record, cached: dict[int, LevelResult]) -> Record:
        measured: Record = await self._call(self.actor.measure_variant.remote(record, cached))
        return measured

    async def measure_level(self, config: dict[str, Any], concurrency: int, record: Record) -> LevelResult | None:
        level: LevelResult | None = await self._call(self.actor.measure_level.remote(config, concurrency, record))
        return level

    async def close(self, restore: bool, config: dict[str, Any] | None) -> None:
        await self._call(self.actor.close.remote(restore, config))


async def _ready(value: Outcome) -> Outcome:
    return value


class RayTuner(Tuner):
    """A Tuner whose variants are measured by workers, one endpoint each (see the module header)."""

    def __init__(
        self,
        spec: TuneSpec,
        model: Model,
        workers: Sequence[Worker],
        progress: Progress,
        sink: Callable[[TuneResult], None],
    ) -> None:
        # Not Tuner.__init__: there is no server of the driver's own to open, only the workers'.
        self.spec, self.model, self.progress, self.sink = spec, model, progress, sink
        self.checkpoint = None
        self.default_config = model.base
        self.result = None
        self.everyone = list(workers)
        self.workers = list(workers)  # those still measuring
        self.lost: list[str] = []  # "URL: why" for each endpoint left out
        self.restore: dict[str, dict[str, Any] | None] = {}

    def fingerprint(self) -> dict[str, Any]:
        return self._fingerprint(",".join(self.spec.endpoints))

    async def run(self, checkpoint_path: Path) -> TuneResult:
        opened: list[Worker] = []
        try:
            states = await self._open(opened)
            checkpoint = self._open_checkpoint(checkpoint_path)
            if checkpoint.default_config is None:
                with_model = [s.config for s in states if s.config is not None]
                if with_model:  # a server's configuration is the default variant, as in a sequential tune
                    self.default_config, checkpoint.server_had_model = with_model[0], True
            else:  # resumed: the servers may hold any variant now; restore what the first run found
                restore = checkpoint.default_config if checkpoint.server_had_model else None
                self.restore = {w.url: restore for w in opened}
            result = self._new_result()
            result.server, result.lost_endpoints = states[0].server, self.lost
            await self._tune(result)
            return result
        finally:
            await self._close(opened)

    async def _open(self, opened: list[Worker]) -> list[EndpointState]:
        outcomes = await asyncio.gather(*(w.open() for w in self.workers), return_exceptions=True)
        states = []
        for worker, outcome in zip(list(self.workers), outcomes):
            if isinstance(outcome, TargetError):
                self._lose(worker, f"cannot reach it: {outcome}")
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                opened.append(worker)
                states.append(outcome)
                self.restore[worker.url] = outcome.config
        if not states:
            raise TargetError(f"cannot reach any endpoint ({'; '.join(self.lost)})")
        return states

    async def _close(self, opened: list[Worker]) -> None:
        async def close(worker: Worker) -> None:
            with contextlib.suppress(TargetError):
                await worker.close(worker in opened, self.restore.get(worker.url))

        await asyncio.gather(*(close(w) for w in self.everyone))

    def _lose(self, worker: Worker, why: str) -> None:
        self.lost.append(f"{worker.url}: {why}")
        if worker in self.workers:
            self.workers.remove(worker)
        left = len(self.workers)
        self.progress.note(f"endpoint {worker.url} left out ({why}); {left} endpoint{'s' if left != 1 else ''} left")

    async def _spread(
        self,
        jobs: Sequence[Job],
        start: Callable[[Worker, Job], Awaitable[Outcome]],
        done: Callable[[Job, Outcome | None, str], None],
    ) -> None:
        """Run every job on an idle worker; `done(job, outcome, "")` as each finishes, in the order
        they were handed out, or `done(job, None, why)` when its worker failed (and is dropped)."""
        queue = deque(jobs)
        idle = list(self.workers)
        running: dict[asyncio.Future[Outcome], tuple[Worker, Job]] = {}
        try:
            while queue or running:
                while queue and idle:
                    worker, job = idle.pop(0), queue.popleft()
                    running[asyncio.ensure_future(start(worker, job))] = (worker, job)
                if not running:
                    raise TargetError(f"no endpoint is left to measure on ({'; '.join(self.lost)})")
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in [f for f in running if f in finished]:
                    worker, job = running.pop(future)
                    try:
                        outcome = future.result()
                    except TargetError as exc:
                        self._lose(worker, str(exc))
                        done(job, None, f"endpoint {worker.url} failed: {exc}")
                    else:
                        idle.append(worker)
                        done(job, outcome, "")
        finally:
            for future in running:
                future.cancel()

    async def _search(self, result: TuneResult, default: Variant, space: Space) -> None:
        spec = self.spec
        if spec.search == "quick":
            batches = quick_batches(space, default, spec.objective, spec.constraints)
        elif spec.search == "bayesian":
            batches = bayesian_batches(
                space, default, spec.objective, spec.constraints, budget=spec.budget, seed=spec.seed
            )
        else:
            batches = brute_batches(space, default)
        batch = next(batches)
        while True:
            await self._spread(batch, self._start_variant, self._variant_done)
            try:
                batch = batches.send([result.records[v.key].figures() for v in batch])
            except StopIteration:
                return

    def _start_variant(self, worker: Worker, variant: Variant) -> Awaitable[Record]:
        assert self.result is not None and self.checkpoint is not None
        record = self._start_record(self.result, variant, where=f" on {worker.url}")
        if variant.key in self.checkpoint.failures:
            record.status, record.error = "failed", self.checkpoint.failures[variant.key]
            return _ready(record)
        return worker.measure_variant(record, self.checkpoint.levels.get(variant.key, {}))

    def _variant_done(self, variant: Variant, measured: Record | None, error: str) -> None:
        assert self.result is not None
        if measured is None:
            record = self.result.records[variant.key]
            record.status, record.error = "failed", error
        else:
            record = self.result.records[variant.key] = measured
        self._finish_record(self.result, record)

    async def _remeasure_group(self, result: TuneResult, group: list[str]) -> None:
        assert self.checkpoint is not None
        levels: dict[str, LevelResult | None] = {}

        def start(worker: Worker, key: str) -> Awaitable[LevelResult | None]:
            record = result.records[key]
            assert record.chosen is not None
            return worker.measure_level(record.config, int(record.levels[record.chosen].level), record)

        def done(key: str, level: LevelResult | None, error: str) -> None:
            levels[key] = level  # None: refused now, or its endpoint failed; the first measurement stands

        for round_ in range(self.spec.remeasure_rounds):
            jobs = []
            for key in group:
                saved = self.checkpoint.remeasures.get(key, [])
                if round_ < len(saved):
                    result.records[key].remeasures.append(saved[round_])
                else:
                    jobs.append(key)
            levels.clear()
            await self._spread(jobs, start, done)
            for key in jobs:
                level = levels.get(key)
                if level is not None:
                    result.records[key].remeasures.append(level)
                    result.records[key].measured += 1
            self._save(result)


@contextlib.contextmanager
def ray_tuner(
    spec: TuneSpec, model: Model, progress: Progress, sink: Callable[[TuneResult], None]
) -> Iterator[RayTuner]:
    """A RayTuner with one actor per endpoint of `spec`, on the Ray cluster at --ray-address, on
    the one this process already joined, or else on a local one started for the tune."""
    with ray_runtime(spec.ray_address, spec.workers) as ray:
        actor_class = ray.remote(num_cpus=1, max_restarts=0)(EndpointActor)
        workers = [RayWorker(ray, actor_class.remote(spec, model, url), url) for url in spec.endpoints]
        try:
            progress.note(f"tuning '{model.name}' on {len(workers)} endpoints, one Ray actor each")
            yield RayTuner(spec, model, workers, progress, sink)
        finally:
            for worker in workers:
                ray.kill(worker.actor)


def open_tuner(
    spec: TuneSpec, model: Model, progress: Progress, sink: Callable[[TuneResult], None]
) -> AbstractContextManager[Tuner]:
    """The tuner for `spec` (a `tuner.TunerOpener`): on Ray actors with --workers, else on one server."""
    if spec.workers:
        return ray_tuner(spec, model, progress, sink)
    return one_server_tuner(spec, model, progress, sink)
