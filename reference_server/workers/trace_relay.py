"""A front-end worker's trace settings: a copy of the core's, whose traces are written by the core.

The core owns the trace settings and the trace files (`core/tracing.py`). A worker that runs models
itself (`local_models.py`) samples its own requests by the copy the core last told it
(`Tracing.snapshot`, sent at the worker's connection, after every settings update and when a
trace_count runs out: `hosting.py`), and sends each finished trace, its timestamps on the host's
one monotonic clock, to the core: the traces finished in one pass of the worker's loop go in one
frame. The core gives each its id and writes it to the file in Triton's JSON, as its own.

Server-wide sampling: trace_count is counted in the core as the traces arrive, and one that arrives
after the count ran out is dropped, so no more than trace_count traces are written however many
workers take them; a worker also counts its copy down, so it takes no more than the count it was
told. trace_rate is counted per worker (every rate-th request that worker reads, as a server of its
own would), so after N requests server-wide the number taken is within the number of workers of
N / rate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from reference_server.core.tracing import OFF, RequestTrace, TraceFile, TraceSetting, Tracing

__all__ = ["RelayedTracing"]

#: What a worker sends per trace: model, version, request id, its timestamps and tensor records.
Record = tuple[str, int, str, list[tuple[str, int]], list[str]]
#: The name the copies' file has: the core writes, the worker only needs a file to be named.
_CORE_FILE = TraceFile("(the core's trace file)")


class _RelayedSetting(TraceSetting):
    """One setting of the copy: a finished trace goes to the relay, not to a file."""

    __slots__ = ("_relay",)

    def __init__(self, sampling: tuple[int, int, int], relay: RelayedTracing) -> None:
        level, rate, count = sampling
        super().__init__(level, rate, count, 0, _CORE_FILE, frozenset())
        self._relay = relay

    def finished(self, trace: RequestTrace) -> None:
        self._relay.finished(trace)


class RelayedTracing(Tracing):
    """The worker's `Tracing`: off until the core's settings arrive (`load`)."""

    def __init__(self) -> None:
        super().__init__()
        #: Sends a batch of finished traces to the core; None until connected (traces are dropped).
        self.send: Callable[[list[Record]], None] | None = None
        self._batch: list[Record] = []

    def load(self, snapshot: Mapping[str, Any]) -> None:
        """Sample by the core's settings (`Tracing.snapshot`) from now on."""
        models = {name: _RelayedSetting(tuple(value), self) for name, value in snapshot.items() if name}
        self.adopt(_RelayedSetting(tuple(snapshot.get("", (OFF, 1000, -1))), self), models)

    def finished(self, trace: RequestTrace) -> None:
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        self._batch.append((trace.model, trace.version, trace.request_id, trace.events, trace.tensors))

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if self.send is not None and batch:
            self.send(batch)

    def close(self) -> None:
        self._flush()
        self.active = False
