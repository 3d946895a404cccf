"""The worker's side: the DataPlane's interface, each call made in the core process.

The front ends take this in place of a `DataPlane` and cannot tell the difference, except that a
bad streamed request fails on the stream's first step rather than at once. Inference and the
repository API go over an asynchronous connection, one frame out and one (or, for a stream, one a
response) back; the synchronous calls over a blocking one. In-flight slots are counted here for
the HTTP read gate, and the server-wide limit is taken by the core (`plane_server.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core import log_settings
from reference_server.core.dataplane import HTTP_ENDPOINT, InflightSlots, StreamResponse
from reference_server.errors import Unavailable
from reference_server.scheduling.cancel import watch_call
from reference_server.workers.frames import (
    FrameProtocol,
    FrameSocket,
    exception_of,
    request_to_wire,
    response_from_wire,
)
from reference_server.workers.local_models import LocalModels
from reference_server.workers.trace_relay import RelayedTracing
from v2kit import codec as v2

__all__ = ["RemotePlane", "connect"]

log = logging.getLogger(__name__)

_GONE = "the server's core process is gone"


class _Calls(FrameProtocol):
    """The asynchronous connection: each reply goes to the handler its call registered."""

    def __init__(self) -> None:
        super().__init__(self._message, self._lost)
        self.handlers: dict[int, Callable[[str, Any], None]] = {}
        self.closed = asyncio.Event()
        self._next = 0
        #: What the core asks of this worker (call id 0): run a model here, stop running it, or
        #: take the core's log and trace settings.
        self.on_ask: Callable[[int, str, tuple[Any, ...]], None] | None = None

    def start(self, kind: str, payload: Any, handler: Callable[[str, Any], None]) -> int:
        if self.transport is None:
            raise Unavailable(_GONE)
        self._next += 1
        call_id = self._next
        self.handlers[call_id] = handler
        self.send((kind, call_id, payload))
        return call_id

    def _message(self, message: tuple[Any, ...]) -> None:
        call_id, status, value = message
        if call_id == 0 and status == "ask":
            if self.on_ask is not None:
                self.on_ask(*value)
            return
        handler = self.handlers.get(call_id)
        if handler is None:
            return  # cancelled meanwhile
        if status != "item":
            del self.handlers[call_id]
        handler(status, value)

    def _lost(self) -> None:
        handlers, self.handlers = self.handlers, {}
        for handler in handlers.values():
            handler("err", (Unavailable, _GONE))
        self.closed.set()


class _RemoteSharedMemory:
    """The shared memory registry's calls, made in the core, where the regions are mapped."""

    def __init__(self, plane: RemotePlane) -> None:
        self._plane = plane

    def status(self, name: str = "") -> list[dict[str, Any]]:
        return self._plane._call("shared_memory.status", name)  # type: ignore[no-any-return]

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._plane._call("shared_memory.register", name, key, offset, byte_size)

    def unregister(self, name: str = "") -> None:
        self._plane._call("shared_memory.unregister", name)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        return self._plane._call("shared_memory.cuda_status", name)  # type: ignore[no-any-return]

    def cuda_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._plane._call("shared_memory.cuda_register", name, raw_handle, device_id, byte_size)

    def cuda_unregister(self, name: str = "") -> None:
        self._plane._call("shared_memory.cuda_unregister", name)


class RemotePlane(InflightSlots):
    """Counts its in-flight requests for the read gate. The core takes the server-wide limit on what
    crosses to it; when this worker may run models itself, it also admits no more than its share."""

    def __init__(
        self,
        calls: _Calls,
        blocking: FrameSocket,
        local: LocalModels | None = None,
        max_inflight_requests: int = 0,
        index: int = 0,
    ) -> None:
        self._calls = calls
        self.index = index  # this worker's, as the core knows it
        super().__init__(max_inflight_requests)
        self._blocking = blocking
        self.accepting = True
        self.shared_memory = _RemoteSharedMemory(self)
        #: The models this worker runs itself (`hosting.py`), if the core asks it to.
        self.local = local
        #: The core's trace settings, as this worker times and samples its requests by them: a
        #: request it hands to the core carries its read's times (`Tracing.received`).
        self.tracing = local.tracing if local is not None else RelayedTracing()
        self._asked: set[asyncio.Task[None]] = set()
        calls.on_ask = self._asked_by_core
        if local is not None:
            local.tracing.send = self._send_traces

    def _send_traces(self, batch: list[Any]) -> None:
        if self._calls.transport is not None:
            self._calls.send(("traces", 0, batch))

    def _asked_by_core(self, ask_id: int, what: str, args: tuple[Any, ...]) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(ask_id, what, args))
        self._asked.add(task)
        task.add_done_callback(self._asked.discard)

    async def _answer(self, ask_id: int, what: str, args: tuple[Any, ...]) -> None:
        value: Any = None
        try:
            if what == "settings":
                self._settings(*args)
            elif self.local is None:
                raise ValueError(f"this worker runs no models; cannot {what}")
            elif what == "host":
                value = await self.local.host(*args)
            elif what == "drop":
                await self.local.drop(*args)
            else:
                raise ValueError(f"unknown ask '{what}'")
        except Exception as exc:
            subject = f"model '{args[0]}'" if what in ("host", "drop") and args else "the core's settings"
            log.error("cannot %s %s here: %s", what, subject, exc)
            status, value = "err", f"{type(exc).__name__}: {exc}"
        else:
            status = "ok"
        if self._calls.transport is not None:
            self._calls.send(("answer", ask_id, (status, value)))

    def _settings(self, logs: dict[str, Any], traces: dict[str, Any]) -> None:
        """The core's log settings (`LogSettings.as_dict` less the file) and trace settings
        (`Tracing.snapshot`), in force here from now on."""
        installed = log_settings.installed()
        if installed is not None:
            installed.apply(logs)
        self.tracing.load(traces)

    @property
    def closed(self) -> asyncio.Event:
        """Set when the core's connection is lost."""
        return self._calls.closed

    def close(self) -> None:
        for task in self._asked:
            task.cancel()
        if self._calls.transport is not None:
            self._calls.transport.close()
        self._blocking.close()

    # --- synchronous calls -------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        try:
            _, status, value = self._blocking.call(("call", 0, (name, args)))
        except OSError:
            raise Unavailable(_GONE) from None
        if status == "err":
            raise exception_of(value)
        return value

    def live(self) -> bool:
        return bool(self._call("live"))

    def ready(self) -> bool:
        return self.accepting and bool(self._call("ready"))

    def server_metadata(self) -> dict[str, Any]:
        return self._call("server_metadata")  # type: ignore[no-any-return]

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._call("model_ready", name, version))

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._call("model_metadata", name, version)  # type: ignore[no-any-return]

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return self._call("model_config", name, version)  # type: ignore[no-any-return]

    def model_config_proto(self, name: str, version: str = "") -> mc.ModelConfig:
        config = mc.ModelConfig()
        config.ParseFromString(self._call("model_config_proto", name, version))
        return config

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self._call("statistics", name, version)  # type: ignore[no-any-return]

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self._call("repository_index", ready_only)  # type: ignore[no-any-return]

    def decode_raw_request(self, name: str, version: str, body: bytes) -> v2.InferRequest:
        return self._call("decode_raw_request", name, version, body)  # type: ignore[no-any-return]

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if changes is None:
            return self._call("log_settings", None)  # type: ignore[no-any-return]
        return self._update_settings("log", "", changes)

    def trace_settings(self, model: str = "", changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if changes is None:
            return self._call("trace_settings", model, None)  # type: ignore[no-any-return]
        return self._update_settings("trace", model, changes)

    def _update_settings(self, kind: str, model: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """An update made in the core, which tells the other workers; this one applies the settings
        now in force itself (it cannot hear the core while it waits here)."""
        result, logs, traces = self._call("update_settings", self.index, kind, model, dict(changes))
        self._settings(logs, traces)
        return result  # type: ignore[no-any-return]

    # --- asynchronous calls ------------------------------------------------------------------------

    async def _await(self, kind: str, payload: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answered(status: str, value: Any) -> None:
            if not future.done():
                if status == "err":
                    future.set_exception(exception_of(value))
                else:
                    future.set_result(value)

        call_id = self._calls.start(kind, payload, answered)
        try:
            return await future
        except asyncio.CancelledError:
            self._cancel(call_id)
            raise

    def _cancel(self, call_id: int) -> None:
        if self._calls.handlers.pop(call_id, None) is not None:
            self._calls.send(("cancel", call_id, None))

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        await self._await("call", ("load_model", (name, parameters)))

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        await self._await("call", ("unload_model", (name, parameters)))

    async def infer(self, request: v2.InferRequest, *, endpoint: str = HTTP_ENDPOINT) -> v2.InferResponse:
        local = self.local
        if local is not None and (publish := local.publisher(request)) is not None:
            return await local.infer(request, publish, endpoint=endpoint)
        return response_from_wire(await self._await("infer", (request_to_wire(request), endpoint)))

    def start_infer(
        self,
        request: v2.InferRequest,
        done: Callable[[v2.InferResponse | Exception], None],
        *,
        endpoint: str = HTTP_ENDPOINT,
    ) -> None:
        local = self.local
        if local is not None and (publish := local.publisher(request)) is not None:
            local.start_infer(request, publish, done, endpoint=endpoint)
            return

        def answered(status: str, value: Any) -> None:
            done(exception_of(value) if status == "err" else response_from_wire(value))

        received = self.tracing.received
        if received is None:
            call_id = self._calls.start("infer", (request_to_wire(request), endpoint), answered)
        else:  # tracing is active: the core traces it from this worker's read
            call_id = self._calls.start("infer", (request_to_wire(request), endpoint, received), answered)
        watch_call(self._cancel_infer, call_id)  # the front end's CancelScope: a client gone tells the core

    def _cancel_infer(self, call_id: int) -> None:
        """The client of unary call `call_id` went away: the core cancels the request, which is still
        answered (CANCELLED, or its outputs), so that `done` lets go of what it holds."""
        if call_id in self._calls.handlers and self._calls.transport is not None:
            self._calls.send(("cancel", call_id, None))

    def infer_stream(
        self, request: v2.InferRequest, *, endpoint: str = HTTP_ENDPOINT
    ) -> AsyncGenerator[tuple[StreamResponse, bool], None]:
        return self._stream(request, endpoint, self.tracing.received)  # read now: the hand-off is now

    async def _stream(
        self, request: v2.InferRequest, endpoint: str, received: tuple[int, int] | None
    ) -> AsyncGenerator[tuple[StreamResponse, bool], None]:
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        call_id = self._calls.start(
            "stream",
            (request_to_wire(request), endpoint, received),
            lambda status, value: queue.put_nowait((status, value)),
        )
        finished = False
        try:
            while True:
                status, value = await queue.get()
                if status == "end":
                    finished = True
                    return
                if status == "err":
                    finished = True
                    raise exception_of(value)
                response, final, is_error = value
                if is_error:
                    yield exception_of(response), final
                else:
                    yield (None if response is None else response_from_wire(response)), final
        finally:
            if not finished:
                self._cancel(call_id)


async def connect(
    path: str, index: int, local: LocalModels | None = None, max_inflight_requests: int = 0
) -> RemotePlane:
    """A RemotePlane over the core's socket at `path`, for worker `index`, running `local`'s models
    itself when the core asks it to."""
    loop = asyncio.get_running_loop()
    _, calls = await loop.create_unix_connection(_Calls, path)
    blocking = await loop.run_in_executor(None, FrameSocket, path)
    plane = RemotePlane(calls, blocking, local, max_inflight_requests, index)
    calls.send(("hello", 0, index))  # the core then tells this worker its settings, and what to run
    return plane
