"""The worker's side of model instances hosted in front-end workers (`hosting.py` is the core's).

The core tells a worker which models to run itself (`host`, with the model's config and this
worker's share of its instances) and which to stop running (`drop`). A request for a version
hosted here runs on this worker's own scheduler and instances, checked by the same `DataPlane`
code as in the core, and never crosses to the core. Anything else goes to the core as before: other
models, requests that name shared-memory regions (they are registered in the core), streams.

Each hosted version publishes its statistics into a file in /dev/shm that the core maps, before
each answer leaves, so a client that reads the statistics after its answer sees its request counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import mmap
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.config import ServerConfig
from reference_server.core.dataplane import HTTP_ENDPOINT, DataPlane
from reference_server.core.repository import ModelRepository
from reference_server.scheduling.stats import ModelStats, counters_length
from reference_server.workers.trace_relay import RelayedTracing
from v2kit import codec as v2
from v2kit.runtime import gpu

__all__ = ["COUNTERS_DIR", "LocalModels", "names_shared_memory", "remove_counters_of"]

#: Where the statistics files are made: memory, not disk, where there is /dev/shm.
COUNTERS_DIR = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
_FILES = itertools.count(1)

Done = Callable[[v2.InferResponse | Exception], None]
Publish = Callable[[], None]


def names_shared_memory(request: v2.InferRequest) -> bool:
    """Whether `request` reads or writes a shared-memory region (registered in the core only)."""
    for tensor in request.inputs:
        if tensor.parameters and v2.SHARED_MEMORY_REGION in tensor.parameters:
            return True
    return any(o.parameters and v2.SHARED_MEMORY_REGION in o.parameters for o in request.outputs or ())


def _counters_prefix(pid: int) -> str:
    return f"reference-server-stats-{pid}-"


def remove_counters_of(pid: int) -> list[str]:
    """Remove the statistics files worker `pid` left (it died before the core mapped and unlinked
    them, e.g. killed while loading a model); the names removed."""
    removed = []
    for path in COUNTERS_DIR.glob(_counters_prefix(pid) + "*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


@dataclass(slots=True)
class _Counters:
    """A version's statistics as published for the core: a shared file, mapped."""

    path: Path
    memory: mmap.mmap
    array: np.ndarray

    @classmethod
    def create(cls, max_batch_size: int) -> _Counters:
        path = COUNTERS_DIR / f"{_counters_prefix(os.getpid())}{next(_FILES)}"
        size = counters_length(max_batch_size) * 8
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            # Its pages allocated now: in a full /dev/shm this fails (ENOSPC) instead of the first
            # store into the mapping killing the worker (SIGBUS).
            os.posix_fallocate(fd, 0, size)
            memory = mmap.mmap(fd, size)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raise OSError(
                exc.errno,
                f"cannot make the statistics file {path} ({size} bytes): {exc.strerror}; free space in "
                f"{COUNTERS_DIR}, or make it larger",
            ) from None
        finally:
            os.close(fd)
        return cls(path, memory, np.frombuffer(memory, dtype=np.int64))

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # the core unlinks it once mapped; this is for a core that never did
        del self.array
        with contextlib.suppress(BufferError):
            self.memory.close()


class LocalModels:
    """The versions this worker runs itself, by (model name, version as a request names it)."""

    def __init__(self, config: ServerConfig) -> None:
        repository = ModelRepository(
            config.model_repository,
            gpu_count=gpu.gpu_count(),
            default_max_batch_size=config.default_max_batch_size,
            backend_config=config.backend_config,
            auto_complete_config=config.auto_complete_config,
            model_config_name=config.model_config_name,
            more_roots=config.more_model_repositories,
        )
        #: The core's trace settings as this worker samples by them; its traces go to the core.
        self.tracing = RelayedTracing()
        self.plane = DataPlane(
            repository,
            model_control_mode="explicit",
            max_tensor_elements=config.max_tensor_elements,
            server_name=config.server_name,
            tracing=self.tracing,
        )
        #: (name, "" or a version number) → what publishes that version's statistics.
        self._routes: dict[tuple[str, str], Publish] = {}
        self._counters: dict[str, list[_Counters]] = {}
        self._lock = asyncio.Lock()

    def publisher(self, request: v2.InferRequest) -> Publish | None:
        """What publishes the statistics of the version `request` names, when this worker runs it;
        None when the core does."""
        publish = self._routes.get((request.model_name, request.model_version))
        return None if publish is None or names_shared_memory(request) else publish

    def start_infer(
        self, request: v2.InferRequest, publish: Publish, done: Done, *, endpoint: str = HTTP_ENDPOINT
    ) -> None:
        """Run `request` here (`publish`: its `publisher`), as `DataPlane.start_infer` does."""

        def answered(response: v2.InferResponse | Exception) -> None:
            publish()
            done(response)

        try:
            self.plane.start_infer(request, answered, endpoint=endpoint)
        except Exception:
            publish()
            raise

    async def infer(
        self, request: v2.InferRequest, publish: Publish, *, endpoint: str = HTTP_ENDPOINT
    ) -> v2.InferResponse:
        """Run `request` here (`publish`: its `publisher`), as `DataPlane.infer` does."""
        try:
            return await self.plane.infer(request, endpoint=endpoint)
        finally:
            publish()

    async def host(self, name: str, config_bytes: bytes, source: str | None) -> list[tuple[int, str, int]]:
        """Load `name` with `config_bytes` (this worker's share of the instances); for each version,
        its number and the path and length of the file its statistics are published in."""
        config = mc.ModelConfig()
        config.ParseFromString(config_bytes)
        async with self._lock:
            self._forget(name)
            await self.plane.repository.load(name, config, source=None if source is None else Path(source))
            versions = sorted(
                (mv for mv in self.plane.repository.loaded() if mv.name == name), key=lambda mv: mv.version
            )
            published: list[tuple[int, str, int]] = []
            counters: list[_Counters] = []
            for mv in versions:
                try:
                    shared = _Counters.create(mv.config.max_batch_size)
                except OSError:
                    # The core runs its requests instead (it logs why): nothing of it stays here.
                    for made in counters:
                        made.close()
                    await self.plane.repository.unload(name)
                    raise
                counters.append(shared)
                publish = _publisher(mv.stats, shared.array)
                publish()
                self._routes[(name, str(mv.version))] = publish
                published.append((mv.version, str(shared.path), len(shared.array)))
            if versions:
                self._routes[(name, "")] = self._routes[(name, str(self.plane.repository.get(name).version))]
            self._counters[name] = counters
            return published

    async def drop(self, name: str) -> None:
        """Stop running `name` here: its requests go to the core from now on."""
        async with self._lock:
            self._forget(name)
            if self.plane.repository.serving(name):
                await self.plane.repository.unload(name)

    def _forget(self, name: str) -> None:
        for key in [key for key in self._routes if key[0] == name]:
            del self._routes[key]
        for shared in self._counters.pop(name, []):
            shared.close()

    async def close(self, grace_s: float) -> None:
        self._routes.clear()
        await self.plane.repository.close(grace_s)
        self.tracing.close()
        for name in list(self._counters):
            self._forget(name)


def _publisher(stats: ModelStats, array: np.ndarray) -> Publish:
    published_executions = -1

    def publish() -> None:
        # The requests of one batch are answered one after the other: its execution is written once.
        nonlocal published_executions
        executions = stats.execution_count
        stats.publish(array, batches=executions != published_executions)
        published_executions = executions

    return publish
