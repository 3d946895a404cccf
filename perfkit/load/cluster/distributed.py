"""Distributed load generation: `perfkit sweep --workers N [--ray-address ADDR]`.

Theory of operation
===================

The driver (this process) keeps everything a single-process sweep does: the windows, the stability
rule, the statistics and the files. Only the sending moves: N load workers (Ray actors running
`perfkit.load.cluster.worker.LoadWorker`, each a plain LoadGenerator on its own event loop) each drive a
share of the load, and the driver pulls their raw samples into its own SampleBuffer, so every
statistic is computed exactly as for one process, from the union of the samples.

*Shares.* Closed loop: concurrency C becomes C//N per worker, one more for the first C%N (a worker
with none sits the level out). Open loop: every worker builds the same seeded schedule and keeps
arrivals i with i % N == k (`OpenLoop.share`), a deterministic thinning whose N parts together are
exactly the one schedule, so the merged arrival process is the one asked for (not N independent
processes at rate/N, which for a constant schedule would bunch arrivals together).

*Clocks.* Each worker times on its own `perf_counter_ns`. Before the first level the driver
estimates each worker's offset (worker clock − driver clock) as NTP does for one exchange, from
the midpoint of the driver's send and receive, over a few round trips, keeping the one with the
shortest round trip: the true offset lies within ± half that round trip (`alignment_us`). Worker
timestamps are converted to the driver's clock as they arrive. Each level starts at a common
instant chosen by the driver a little in the future (longer than any round trip); every worker
waits for it on its clock, so closed-loop workers begin together and the open-loop shares share
t = 0 (exactly: a worker's schedule counts from the common start, converted both ways with the
same offset).

*Windows.* A sample is recorded when its request completes, so once a worker has answered a pull
issued after the driver's window end, every sample it completed before that end is in the buffer
(`sync`, which `measure_level` calls after each window end). Between windows the driver pulls in
the background, for the warm-up and count windows that watch the sample count.

*What it cannot hide.* The alignment error (± half a round trip, tens of µs to a few ms across
machines) shifts a worker's samples between adjacent windows and into its latencies from the
intended send; clocks that drift apart during a long run are not re-estimated; and a saturated
network between the workers and the server looks like a slow server.

*Failures.* A worker that does not answer (its actor died, its node was lost, a call timed out) is
marked dead with the time and reason; the samples already pulled stay, the others go on, and the
level carries a failed `workers` check. Later levels are split among the survivors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

import numpy as np

from perfkit.errors import PerfkitError, TargetError, describe_exception
from perfkit.load.cluster.runtime import ray_runtime
from perfkit.load.cluster.worker import LoadWorker, WorkerInfo
from perfkit.load.generator import Clock
from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.load.schedule import ClosedLoop, Load
from perfkit.results.model import Check, LevelResult, WorkerFigures
from perfkit.target import TargetSpec
from v2kit import codec as v2

__all__ = [
    "ClockAlignment",
    "DistributedLoadGenerator",
    "WorkerLink",
    "align_clock",
    "distributed_load",
    "merge_samples",
    "split_load",
]

log = logging.getLogger(__name__)

START_MARGIN_NS = 300_000_000  # the common start is this far ahead, at least
PULL_INTERVAL_NS = 100_000_000
CALL_TIMEOUT_S = 30.0
OPEN_TIMEOUT_S = 120.0  # a worker's first call waits for Ray to place and start its process
ALIGN_ROUNDS = 7

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DistributedSpec:
    """`--workers N [--ray-address ADDR]`: the load from N Ray actors instead of this process."""

    workers: int = 1
    ray_address: str | None = None  # None: a local Ray runtime for the run's duration

    @property
    def enabled(self) -> bool:
        """One worker with no cluster is today's in-process load generator."""
        return self.workers > 1 or self.ray_address is not None


class WorkerLink(Protocol):
    """The driver's handle on one load worker: LoadWorker's methods, called remotely."""

    async def open(self) -> WorkerInfo: ...

    async def now_ns(self) -> int: ...

    async def start(self, load: Load | None, start_ns: int) -> None: ...

    async def take(self) -> SampleArrays: ...

    async def stop(self, drain_timeout_s: float | None) -> float | None: ...

    async def close(self) -> None: ...

    def kill(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ClockAlignment:
    offset_ns: int  # worker clock − driver clock
    rtt_ns: int

    @property
    def uncertainty_ns(self) -> int:
        return self.rtt_ns // 2


async def align_clock(now_ns: Callable[[], int], remote_now_ns: Callable[[], Awaitable[int]],
                      rounds: int = ALIGN_ROUNDS) -> ClockAlignment:  # fmt: skip
    """The worker's offset from the round trip with the smallest delay (module header)."""
    best: ClockAlignment | None = None
    for _ in range(rounds):
        sent = now_ns()
        remote = await remote_now_ns()
        received = now_ns()
        candidate = ClockAlignment(remote - (sent + received) // 2, received - sent)
        if best is None or candidate.rtt_ns < best.rtt_ns:
            best = candidate
    assert best is not None, "rounds must be at least 1"
    return best


def split_load(load: Load, workers: int) -> list[Load | None]:
    """Each worker's share of `load` (None: it sits the level out)."""
    if isinstance(load, ClosedLoop):
        base, extra = divmod(load.concurrency, workers)
        counts = [base + (1 if k < extra else 0) for k in range(workers)]
        return [ClosedLoop(c) if c > 0 else None for c in counts]
    return [dataclasses.replace(load, share=(k, workers)) for k in range(workers)]


def describe_share(load: Load | None) -> str:
    if load is None:
        return "idle"
    if isinstance(load, ClosedLoop):
        return f"concurrency {load.concurrency}"
    part, parts = load.share
    return f"arrivals i % {parts} == {part}" if parts > 1 else "every arrival"


def merge_samples(buffer: SampleBuffer, arrays: SampleArrays, offset_ns: int) -> None:
    """Append a worker's samples to the driver's buffer, their times moved to the driver's clock."""
    names = arrays.error_names
    columns = (
        (arrays.intended_ns - offset_ns).tolist(), (arrays.sent_ns - offset_ns).tolist(),
        (arrays.done_ns - offset_ns).tolist(), arrays.error_kind.tolist(), arrays.bytes_out.tolist(),
        arrays.bytes_in.tolist(), arrays.send_ns.tolist(), arrays.recv_ns.tolist(),
    )  # fmt: skip
    record = buffer.record
    for intended, sent, done, kind, out, in_, send, recv in zip(*columns):
        record(intended, sent, done, names[kind], out, in_, send, recv)


class _WorkerLost(Exception):
    pass


@dataclass(slots=True)
class _Worker:
    index: int
    link: WorkerLink
    host: str = ""
    pid: int = 0
    clock: ClockAlignment = ClockAlignment(0, 0)
    load: Load | None = None
    cpu_pct: float | None = None
    died_at_ns: int | None = None
    died_reason: str = ""

    @property
    def alive(self) -> bool:
        return self.died_at_ns is None


class DistributedLoadGenerator:
    """The LoadGenerator interface (`clock`, `buffer`, `start`, `sync`, `stop`) over N workers."""

    def __init__(
        self,
        links: Sequence[WorkerLink],
        clock: Clock,
        *,
        start_margin_ns: int = START_MARGIN_NS,
        pull_interval_ns: int = PULL_INTERVAL_NS,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        if not links:
            raise ValueError("a distributed load needs at least one worker")
        self.clock = clock
        self.buffer = SampleBuffer()
        self.start_margin_ns = start_margin_ns
        self.pull_interval_ns = pull_interval_ns
        self.call_timeout_s = call_timeout_s
        self.workers = [_Worker(k, link) for k, link in enumerate(links)]
        self.start_ns = 0  # the current level's common start, driver clock
        self._owner: list[int] = []  # worker index of each sample in `buffer`
        self._level_first = 0
        self._level_deaths: list[_Worker] = []
        self._starting: asyncio.Task[None] | None = None
        self._puller: asyncio.Task[None] | None = None
        self._pull_lock = asyncio.Lock()

    @property
    def alive(self) -> list[_Worker]:
        return [w for w in self.workers if w.alive]

    async def open(self) -> None:
        """Start every worker and align its clock; a worker that cannot start fails the run."""

        async def open_one(w: _Worker) -> None:
            try:
                w.host, w.pid = await asyncio.wait_for(w.link.open(), OPEN_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise TargetError(
                    f"load worker {w.index + 1} did not start within {OPEN_TIMEOUT_S:.0f} s: each worker "
                    "takes one CPU of the Ray cluster; lower --workers or add nodes"
                ) from None
            except PerfkitError:
                raise
            except Exception as exc:
                raise TargetError(f"load worker {w.index + 1} could not start: {describe_exception(exc)}") from None
            w.clock = await align_clock(self.clock.now_ns, w.link.now_ns)

        await asyncio.gather(*(open_one(w) for w in self.workers))

    def describe(self) -> str:
        parts = [
            f"{w.index + 1} on {w.host} (pid {w.pid}; clock {w.clock.offset_ns / 1e3:+.0f} µs "
            f"± {w.clock.uncertainty_ns / 1e3:.0f} µs)"
            for w in self.workers
        ]
        return f"{len(self.workers)} load workers: " + ", ".join(parts)

    def start(self, load: Load, request_limit: int = 0) -> None:
        if request_limit:
            raise PerfkitError("--request-count is not supported with --workers")
        if self._starting is not None or self._puller is not None:
            raise RuntimeError("a load is already running; stop it first")
        alive = self.alive
        if not alive:
            raise RuntimeError("no load worker is left to start a load on")
        self._level_first = len(self.buffer)
        self._level_deaths = []
        for worker in self.workers:
            worker.load = None
        for worker, share in zip(alive, split_load(load, len(alive))):
            worker.load, worker.cpu_pct = share, None
        margin = max(self.start_margin_ns, 4 * max(w.clock.rtt_ns for w in alive))
        self.start_ns = self.clock.now_ns() + margin
        self._starting = asyncio.get_running_loop().create_task(self._start_all(alive))

    async def _start_all(self, workers: list[_Worker]) -> None:
        async def start_one(w: _Worker) -> None:
            with contextlib.suppress(_WorkerLost):
                await self._call(w, w.link.start(w.load, self.start_ns + w.clock.offset_ns), "start")

        await asyncio.gather(*(start_one(w) for w in workers))
        self._puller = asyncio.get_running_loop().create_task(self._pull_periodically())

    async def sync(self) -> None:
        """Wait for the level to have started; then pull every sample completed until now."""
        if self._starting is not None:
            await self._starting
        await self._pull_all()

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        if self._starting is not None:
            await self._starting
            self._starting = None
        if self._puller is not None:
            self._puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._puller
            self._puller = None
        timeout = (drain_timeout_s if drain_timeout_s is not None else self.call_timeout_s) + self.call_timeout_s

        async def stop_one(w: _Worker) -> None:
            with contextlib.suppress(_WorkerLost):
                w.cpu_pct = await self._call(w, w.link.stop(drain_timeout_s), "stop", timeout)

        await asyncio.gather(*(stop_one(w) for w in self.alive))
        await self._pull_all()

    async def close(self) -> None:
        async def close_one(w: _Worker) -> None:
            with contextlib.suppress(_WorkerLost):
                await self._call(w, w.link.close(), "close")

        await asyncio.gather(*(close_one(w) for w in self.alive))
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.link.kill()

    async def _pull_periodically(self) -> None:
        while True:
            await self.clock.sleep_until(self.clock.now_ns() + self.pull_interval_ns)
            await self._pull_all()

    async def _pull_all(self) -> None:
        # One pull round at a time: a pull issued after a window end must not be overtaken by the
        # answer to an earlier one still on its way.
        async with self._pull_lock:
            await asyncio.gather(*(self._pull(w) for w in self.alive))

    async def _pull(self, w: _Worker) -> None:
        try:
            arrays = await self._call(w, w.link.take(), "pull")
        except _WorkerLost:
            return
        merge_samples(self.buffer, arrays, w.clock.offset_ns)
        self._owner.extend([w.index] * len(arrays))

    async def _call(self, w: _Worker, call: Awaitable[T], what: str, timeout_s: float | None = None) -> T:
        try:
            return await asyncio.wait_for(call, timeout_s or self.call_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a dead actor, a lost node, a hung or broken worker: that worker is out
            self._mark_dead(w, f"{what} failed: {describe_exception(exc)}")
            raise _WorkerLost from None

    def _mark_dead(self, w: _Worker, reason: str) -> None:
        if not w.alive:
            return
        w.died_at_ns, w.died_reason = self.clock.now_ns(), reason
        self._level_deaths.append(w)
        log.warning("load worker %d on %s died: %s", w.index + 1, w.host, reason)
        with contextlib.suppress(Exception):
            w.link.kill()  # a worker that merely hangs must not keep loading the server

    def annotate(self, result: LevelResult, samples: SampleArrays, stable_window_count: int) -> LevelResult:
        """The level's result with each worker's figures and the `workers` check."""
        owner = np.asarray(self._owner[self._level_first :], dtype=np.int64)
        if len(owner) != len(samples):
            raise RuntimeError("the driver's buffer changed outside the distributed load generator")
        reported = result.windows[-stable_window_count:] if result.windows else ()
        in_reported = np.zeros(len(samples), dtype=np.bool_)
        for window in reported:
            in_reported |= (samples.done_ns >= window.start_ns) & (samples.done_ns < window.end_ns)
        ok = samples.ok
        figures = []
        for w in self.workers:
            mine = (owner == w.index) & in_reported
            n, n_ok = int(mine.sum()), int((mine & ok).sum())
            figures.append(WorkerFigures(
                index=w.index + 1, host=w.host, load=describe_share(w.load), request_count=n, ok_count=n_ok,
                error_count=n - n_ok,
                throughput_infer_per_s=n_ok * result.batch_size / result.duration_s if result.duration_s > 0 else 0.0,
                clock_offset_us=w.clock.offset_ns / 1e3, alignment_us=w.clock.uncertainty_ns / 1e3,
                cpu_pct=w.cpu_pct, died=self._death_text(w),
            ))  # fmt: skip
        check = self._workers_check(owner)
        return dataclasses.replace(result, workers=tuple(figures), checks=(*result.checks, check))

    def _into_level_s(self, w: _Worker) -> float:
        return ((w.died_at_ns or 0) - self.start_ns) / 1e9

    def _death_text(self, w: _Worker) -> str:
        if w.died_at_ns is None:
            return ""
        if any(dead is w for dead in self._level_deaths):
            return f"{self._into_level_s(w):.2f} s into the level: {w.died_reason}"
        return f"in an earlier level: {w.died_reason}"

    def _workers_check(self, owner: np.ndarray[Any, np.dtype[np.int64]]) -> Check:
        total = len(self.workers)
        if not self._level_deaths:
            worst = max(w.clock.uncertainty_ns for w in self.alive) / 1e3 if self.alive else 0.0
            return Check(
                "workers", True, f"{len(self.alive)} of {total} load workers ran the level; clocks aligned within "
                f"± {worst:.0f} µs"
            )  # fmt: skip
        deaths = [
            f"worker {w.index + 1} of {total} died {self._into_level_s(w):.2f} s into the level ({w.died_reason}); "
            f"its {int((owner == w.index).sum())} samples up to then are kept"
            for w in self._level_deaths
        ]
        return Check(
            "workers", False, "; ".join(deaths),
            "the level lost that worker's share of the load from then on, so it ran below the load asked "
            f"for: measure it again; {len(self.alive)} worker(s) go on (Ray's logs on the worker's host say why)",
        )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Ray


class RayLink:
    """A LoadWorker running as a Ray actor."""

    def __init__(self, ray: ModuleType, actor: Any) -> None:
        self._ray = ray
        self._actor = actor

    async def open(self) -> WorkerInfo:
        info: WorkerInfo = await self._actor.open.remote()
        return info

    async def now_ns(self) -> int:
        value: int = await self._actor.now_ns.remote()
        return value

    async def start(self, load: Load | None, start_ns: int) -> None:
        await self._actor.start.remote(load, start_ns)

    async def take(self) -> SampleArrays:
        arrays: SampleArrays = await self._actor.take.remote()
        return arrays

    async def stop(self, drain_timeout_s: float | None) -> float | None:
        cpu: float | None = await self._actor.stop.remote(drain_timeout_s)
        return cpu

    async def close(self) -> None:
        await self._actor.close.remote()

    def kill(self) -> None:
        self._ray.kill(self._actor)


def actor_name(index: int, driver_pid: int | None = None) -> str:
    """The Ray name of a sweep's worker (namespace "perfkit"), unique per driver process."""
    return f"perfkit-{driver_pid or os.getpid()}-worker-{index + 1}"


@contextlib.asynccontextmanager
async def distributed_load(
    spec: DistributedSpec,
    *,
    url: str,
    target: TargetSpec,
    requests: list[v2.InferRequest],
    max_outstanding: int,
    clock: Clock,
) -> AsyncIterator[DistributedLoadGenerator]:
    """N load workers on Ray, opened and clock-aligned, for the duration of the block."""
    with ray_runtime(spec.ray_address, spec.workers) as ray:
        actor_class = ray.remote(LoadWorker)
        per_worker = math.ceil(max_outstanding / spec.workers)
        if target.max_connections:
            target = dataclasses.replace(target, max_connections=math.ceil(target.max_connections / spec.workers))
        # One CPU each, spread over the nodes: two workers on one core would measure the core.
        options = {"namespace": "perfkit", "num_cpus": 1, "scheduling_strategy": "SPREAD", "max_restarts": 0}
        links = [
            RayLink(ray, actor_class.options(name=actor_name(k), **options).remote(url, target, requests, per_worker))
            for k in range(spec.workers)
        ]
        generator = DistributedLoadGenerator(links, clock)
        try:
            await generator.open()
            yield generator
        finally:
            await generator.close()
