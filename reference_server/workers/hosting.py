"""Model instances hosted by the front-end workers: the core's side (`local_models.py` is the worker's).

With every request crossing into it, the core bounds what the workers serve together (bench/README.md,
`cores.py`). So a model that needs nothing server-wide per request has its instances divided among
the workers, and each worker runs the requests it reads on its own share: `instance_group.count`
still counts instances server-wide, and the per-request work spreads over the workers' cores as
Triton's spreads over its stubs. The core keeps its own instances of such a model for what the
workers send it (ensemble steps, requests naming shared memory, requests that arrive while a
worker loads), and keeps what is server-wide: model control, the statistics and the `nv_*` metrics
(summed with what each worker publishes, `stats_of`).

A model is hosted by the workers when each of them gets at least one instance and it is a plain
onnxruntime model: no sequence batcher, no ensemble, not decoupled, no response cache, one CPU
instance group without rate-limiter resources, a dynamic batcher without priorities or queue
policies. Its dynamic batches then form per worker, across the connections that worker holds. The
rate limiter, poll mode, model namespacing and latency summaries (`--metrics-config
summary_latencies=true`) keep every model in the core. Each worker admits its share of the
server's in-flight limit (`--max-inflight-requests`), so that the sum stays within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.onnxruntime import ONNX_PLATFORM
from reference_server.config import ServerConfig
from reference_server.core.dataplane import DataPlane
from reference_server.core.model_version import ModelVersion
from reference_server.core.repository import ModelRepository
from reference_server.scheduling.stats import ModelStats

__all__ = ["WorkerHosting", "hosting_allowed", "hostable_instance_counts", "share", "why_not_hosted"]

log = logging.getLogger(__name__)

Send = Callable[[tuple[Any, ...]], None]


def share(count: int, workers: int, index: int) -> int:
    """Worker `index`'s share of `count` instances among `workers`: they differ by one at most."""
    return count // workers + (1 if index < count % workers else 0)


def why_not_hosted(versions: list[ModelVersion], workers: int) -> str | None:
    """Why the workers cannot run `versions` (a model's) themselves; None when they can."""
    for served in versions:
        config = served.config
        if config.platform != ONNX_PLATFORM and config.backend != "onnxruntime":
            return "not an onnxruntime model"
        if config.HasField("sequence_batching") or config.HasField("ensemble_scheduling") or served.decoupled:
            return "its requests need state kept server-wide"
        if config.response_cache.enable:
            return "its response cache is server-wide"
        batching = config.dynamic_batching
        if batching.priority_levels or batching.HasField("default_queue_policy") or batching.priority_queue_policy:
            return "its queue policies are server-wide"
        if len(config.instance_group) != 1:
            return "more than one instance group"
        group = config.instance_group[0]
        if group.kind != mc.ModelInstanceGroup.KIND_CPU or group.HasField("rate_limiter"):
            return "its instances are not plain CPU instances"
        if group.count < workers:
            return f"{group.count} instances for {workers} workers"
    return None


def hosting_allowed(config: ServerConfig) -> bool:
    """Whether the server's settings let the workers run any model themselves."""
    # Latency summaries need every request's durations, which only the core's statistics keep.
    return (
        config.worker_instances
        and config.model_control_mode != "poll"
        and config.rate_limit != "execution_count"
        and not config.metrics_summary_latencies
        and not config.model_namespacing  # a worker finds its models by name alone
    )


def hostable_instance_counts(repository: ModelRepository, config: ServerConfig) -> list[int]:
    """The instance counts of the loaded models that workers could run, one worker per instance
    (what `--frontend-workers auto` sizes the workers by)."""
    if not hosting_allowed(config):
        return []
    return [
        versions[0].config.instance_group[0].count
        for versions in _versions_by_model(repository).values()
        if why_not_hosted(versions, 1) is None
    ]


def _versions_by_model(repository: ModelRepository) -> dict[str, list[ModelVersion]]:
    by_name: dict[str, list[ModelVersion]] = {}
    for served in repository.loaded():
        by_name.setdefault(served.name, []).append(served)
    return by_name


@dataclass
class _Hosted:
    """A model the workers run: which load of it, and the statistics each worker publishes."""

    load_ids: dict[int, int]  # version → the core's load of it (`ModelStats.load_id`)
    config: bytes
    source: str | None
    #: (worker index, version) → that worker's published counters (read-only map).
    counters: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    #: version → what the workers that hosted it and were started again had counted.
    retired: dict[int, ModelStats] = field(default_factory=dict)


class WorkerHosting:
    def __init__(self, plane: DataPlane, config: ServerConfig) -> None:
        self._plane = plane
        self._workers = config.frontend_workers
        self.enabled = self._workers > 1 and hosting_allowed(config)
        self._hosted: dict[str, _Hosted] = {}
        self._senders: dict[int, Send] = {}
        self._answers: dict[int, tuple[int, asyncio.Future[Any]]] = {}  # ask → (worker, its answer)
        self._asks = itertools.count(1)
        self._lock = asyncio.Lock()
        self._attached: dict[int, asyncio.Event] = {}
        self._telling: set[asyncio.Task[None]] = set()
        plane.stats_of = self.stats_of
        if self.enabled:  # only workers that run models take traces
            plane.tracing.used_up = self._trace_used_up

    # --- the workers' connections --------------------------------------------------------------

    async def attach(self, index: int, send: Send) -> None:
        """A worker connected: it runs every hosted model from now on."""
        async with self._lock:
            self._senders[index] = send
            await self._tell(index)
            for name, hosted in self._hosted.items():
                self._retire(hosted, index)
                await self._host_on(index, name, hosted)
        self._attached.setdefault(index, asyncio.Event()).set()

    async def settled(self) -> None:
        """Wait until every worker has connected and runs what it was given (server start-up)."""
        if self.enabled:
            await asyncio.gather(*(self._attached.setdefault(i, asyncio.Event()).wait() for i in range(self._workers)))

    def answered(self, ask_id: int, status: str, value: Any) -> None:
        _, future = self._answers.pop(ask_id, (0, None))
        if future is not None and not future.done():
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(RuntimeError(value))

    async def _ask(self, index: int, what: str, *args: Any) -> Any:
        send = self._senders.get(index)
        if send is None:
            raise ConnectionError(f"front-end worker {index} is not connected")
        ask_id = next(self._asks)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[ask_id] = (index, future)
        send((0, "ask", (ask_id, what, args)))
        try:
            return await future
        finally:
            self._answers.pop(ask_id, None)

    def lost(self, index: int, send: Send) -> None:
        """A worker's connection closed: what it was asked is not answered."""
        if self._senders.get(index) == send:
            del self._senders[index]
        for worker, future in list(self._answers.values()):
            if worker == index and not future.done():
                future.set_exception(ConnectionError(f"front-end worker {index} is gone"))

    # --- model control ------------------------------------------------------------------------

    async def sync(self) -> None:
        """Make the workers run what the core serves and may be run there, and nothing else."""
        if not self.enabled:
            return
        async with self._lock:
            wanted: dict[str, list[ModelVersion]] = {}
            for name, versions in _versions_by_model(self._plane.repository).items():
                reason = why_not_hosted(versions, self._workers)
                if reason is None:
                    wanted[name] = versions
                else:
                    log.debug("model '%s' runs in the core only: %s", name, reason)
            for name in [name for name in self._hosted if name not in wanted]:
                del self._hosted[name]
                await asyncio.gather(*(self._drop_on(index, name) for index in list(self._senders)))
            for name, versions in wanted.items():
                load_ids = {mv.version: mv.stats.load_id for mv in versions}
                current = self._hosted.get(name)
                if current is not None and current.load_ids == load_ids:
                    continue
                source = self._plane.repository.source(name)
                hosted = _Hosted(
                    load_ids, versions[0].config.SerializeToString(), None if source is None else str(source)
                )
                self._hosted[name] = hosted
                await asyncio.gather(*(self._host_on(index, name, hosted) for index in list(self._senders)))

    async def _host_on(self, index: int, name: str, hosted: _Hosted) -> None:
        config = mc.ModelConfig()
        config.ParseFromString(hosted.config)
        config.instance_group[0].count = share(config.instance_group[0].count, self._workers, index)
        try:
            published = await self._ask(index, "host", name, config.SerializeToString(), hosted.source)
        except Exception as exc:
            log.error(
                "front-end worker %d cannot run model '%s' itself (the core runs its requests): %s", index, name, exc
            )
            return
        for version, path, length in published:
            if version in hosted.load_ids:
                hosted.counters[(index, version)] = _map_counters(path, length)

    async def _drop_on(self, index: int, name: str) -> None:
        try:
            await self._ask(index, "drop", name)
        except Exception as exc:
            log.error("front-end worker %d did not stop running model '%s': %s", index, name, exc)

    def _retire(self, hosted: _Hosted, index: int) -> None:
        for (worker, version), counters in list(hosted.counters.items()):
            if worker == index:
                before = hosted.retired.get(version)
                counted = ModelStats.from_counters(counters)
                hosted.retired[version] = counted if before is None else ModelStats.merged([before, counted])
                del hosted.counters[(worker, version)]

    # --- the log and trace settings -------------------------------------------------------------

    def settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The core's log settings (but the file: only the command line sets it, and the workers
        were started with it) and trace settings, as a worker applies them."""
        logs = self._plane.logs.as_dict()
        del logs["log_file"]
        return logs, self._plane.tracing.snapshot()

    async def tell_settings(self, but: int | None = None) -> None:
        """Tell every connected worker (`but` one) the core's log and trace settings."""
        await asyncio.gather(*(self._tell(index) for index in list(self._senders) if index != but))

    async def _tell(self, index: int) -> None:
        try:
            await self._ask(index, "settings", *self.settings())
        except Exception as exc:
            log.error("front-end worker %d did not take the log and trace settings: %s", index, exc)

    def _trace_used_up(self) -> None:
        # From a request's sampling, on the loop: the workers stop taking traces once told.
        task = asyncio.get_running_loop().create_task(self.tell_settings())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    # --- statistics ---------------------------------------------------------------------------

    def stats_of(self, served: ModelVersion) -> ModelStats:
        """`served`'s statistics: the core's own and what each worker running it counted."""
        hosted = self._hosted.get(served.name)
        if hosted is None or hosted.load_ids.get(served.version) != served.stats.load_id:
            return served.stats
        parts = [served.stats]
        retired = hosted.retired.get(served.version)
        if retired is not None:
            parts.append(retired)
        parts.extend(
            ModelStats.from_counters(counters)
            for (_, version), counters in hosted.counters.items()
            if version == served.version
        )
        return ModelStats.merged(parts)


def _map_counters(path: str, length: int) -> np.ndarray:
    fd = os.open(path, os.O_RDONLY)
    try:
        memory = mmap.mmap(fd, length * 8, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # mapped: nothing else needs its name, and nothing is left behind
    return np.frombuffer(memory, dtype=np.int64)
