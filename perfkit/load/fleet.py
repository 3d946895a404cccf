"""Several alike servers measured as one (`perfkit sweep -u A,B`): a fleet behind no balancer.

`FleetClient` is an `InferClient` over one client per endpoint, each with its own connections.
Requests go round-robin, one endpoint after the next per request, whatever the load (closed loop,
open loop); the load generator sees one client and records every request as usual, so the level's
figures are the fleet's total. Beside that, each request is also recorded in its endpoint's own
`SampleBuffer` (timed by this wrapper on the same monotonic clock), from which each endpoint's
share of a level is computed after the fact (`analysis.stats.endpoint_figures`).

The control plane speaks to every endpoint: live and ready only when all are, a dead endpoint named
(TargetError); the model's metadata and config are the first endpoint's, and every other must
serve the model too; the statistics extension is read from every endpoint and summed
(`sum_statistics`), so the server-side figures cover the whole fleet; a
repository load or unload goes to every endpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from perfkit.errors import MissingExtension, PerfkitError, TargetError
from perfkit.load.samples import SampleBuffer
from perfkit.wire.client import InferClient, Outcome
from perfkit.wire.prepared import Prepared, SequenceTemplate
from v2kit import codec as v2

__all__ = ["FleetClient", "FleetPrepared", "sum_statistics"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class FleetPrepared(Prepared):
    """A request encoded once for each endpoint's client (`parts`); the fields it shares with
    `Prepared` are the first endpoint's."""

    parts: tuple[Prepared, ...] = ()


class FleetClient:
    """Round-robin over alike servers (module header); `buffers[i]` holds endpoint i's requests."""

    def __init__(
        self,
        clients: Sequence[InferClient],
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if len(clients) < 2:
            raise ValueError("a fleet has at least two endpoints")
        self.clients = list(clients)
        self.urls = tuple(c.url for c in clients)
        self.url = ",".join(self.urls)
        self.protocol = clients[0].protocol
        self.buffers = [SampleBuffer() for _ in clients]
        self._clock = clock
        self._next = 0

    def prepare(self, request: v2.InferRequest) -> FleetPrepared:
        parts = tuple(client.prepare(request) for client in self.clients)
        return FleetPrepared(parts[0].payload, parts[0].bytes_out, parts=parts)

    def prepare_sequence(self, request: v2.InferRequest) -> SequenceTemplate:
        raise PerfkitError("a sequence model is swept over one -u endpoint: give one, not several")

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        raise PerfkitError("--shared-memory takes one -u endpoint: give one, not several")

    async def unregister_system_shared_memory(self, name: str) -> None:
        raise PerfkitError("--shared-memory takes one -u endpoint: give one, not several")

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise PerfkitError("--shared-memory takes one -u endpoint: give one, not several")

    async def unregister_cuda_shared_memory(self, name: str) -> None:
        raise PerfkitError("--shared-memory takes one -u endpoint: give one, not several")

    async def send(self, prepared: Prepared) -> Outcome:
        index = self._next
        self._next = (index + 1) % len(self.clients)
        clock = self._clock
        sent = clock()
        outcome = await self.clients[index].send(cast(FleetPrepared, prepared).parts[index])
        self.buffers[index].record(sent, sent, clock(), outcome.error, prepared.bytes_out, outcome.bytes_in,
                                   outcome.send_ns, outcome.recv_ns)  # fmt: skip
        return outcome

    async def _each(self, call: Callable[[InferClient], Awaitable[T]]) -> list[T]:
        """`call` on every endpoint at once; a TargetError naming each endpoint that failed."""
        results = await asyncio.gather(*(call(client) for client in self.clients), return_exceptions=True)
        failed = [(url, r) for url, r in zip(self.urls, results) if isinstance(r, BaseException)]
        if failed:
            message = "; ".join(f"endpoint {url}: {exc}" for url, exc in failed)
            missing = {exc.extension for _, exc in failed if isinstance(exc, MissingExtension)}
            if len(missing) == 1 and all(isinstance(exc, MissingExtension) for _, exc in failed):
                raise MissingExtension(message, missing.pop())  # the callers go on without it
            raise TargetError(message)
        return results  # type: ignore[return-value]

    async def live(self) -> bool:
        answers = await self._each(lambda c: c.live())
        dead = [url for url, live in zip(self.urls, answers) if not live]
        if dead:
            raise TargetError(f"endpoint {', '.join(dead)} of -u answers but is not live")
        return True

    async def ready(self) -> bool:
        return all(await self._each(lambda c: c.ready()))

    async def server_metadata(self) -> dict[str, Any]:
        first, *_ = await self._each(lambda c: c.server_metadata())
        return {**first, "endpoints": list(self.urls)}

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        first, *_ = await self._each(lambda c: c.model_metadata(model, version))
        return first

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        first, *_ = await self._each(lambda c: c.model_config(model, version))
        return first

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        return sum_statistics(await self._each(lambda c: c.model_statistics(model, version)))

    async def repository_index(self) -> list[dict[str, Any]]:
        return await self.clients[0].repository_index()

    async def load_model(self, name: str, config: dict[str, Any] | None = None) -> None:
        await self._each(lambda c: c.load_model(name, config))

    async def unload_model(self, name: str) -> None:
        await self._each(lambda c: c.unload_model(name))

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients), return_exceptions=True)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _batch_size(item: Any) -> int:
    return _int(item.get("batch_size")) if isinstance(item, Mapping) else 0


def sum_statistics(responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One statistics response that adds up several servers' (`-u A,B`): every count and ns of each
    model version's entry summed over the servers that list it, `batch_stats` per batch size, the
    other fields (`last_inference`: the latest) as the servers give them."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for response in responses:
        entries = response.get("model_stats")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping):
                key = (str(entry.get("name", "")), str(entry.get("version", "")))
                merged[key] = _add_entries(merged[key], entry) if key in merged else _numbers(entry)
    return {"model_stats": list(merged.values())}


def _numbers(value: Any) -> Any:
    """The JSON with counters as ints (gRPC JSON writes uint64 as strings)."""
    if isinstance(value, Mapping):
        return {k: v if k in ("name", "version") else _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _add_entries(total: dict[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    entry = _numbers(entry)
    out = dict(total)
    for key, value in entry.items():
        mine = out.get(key)
        if key == "batch_stats" and isinstance(value, list) and isinstance(mine, list):
            by_size = {_batch_size(b): b for b in mine}
            for item in value:
                size = _batch_size(item)
                by_size[size] = _add_entries(by_size[size], item) if size in by_size else item
            out[key] = [by_size[size] for size in sorted(by_size)]
        elif key == "last_inference":
            out[key] = max(_int(mine), _int(value))
        elif isinstance(value, Mapping) and isinstance(mine, Mapping):
            out[key] = _add_entries(dict(mine), value)
        elif isinstance(value, int) and isinstance(mine, int) and key not in ("batch_size", "version"):
            out[key] = mine + value
        elif key not in out:
            out[key] = value
    return out
