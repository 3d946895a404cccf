"""The core's side: serves its DataPlane to the front-end workers over a Unix socket.

Each worker holds two connections: an asynchronous one for inference (a unary request answered from
the scheduler's callback, as `DataPlane.start_infer` answers the in-process front ends; a stream's
responses one frame each) and the repository API, and a blocking one for the calls a front end
makes synchronously. Messages in: `(kind, call_id, payload)`; out: `(call_id, status, value)`, with
status `ok`, `err` (value: `frames.error_of`), `item` (a stream's response and its final flag) and
`end`. A worker's `cancel` (its client went away) cancels the call: a stream's task, or a unary
request through the `CancelScope` it runs in, as in the core's own front ends. The in-flight limit
is taken here, once per request, so it stays server-wide. A worker's
finished traces arrive as `traces` (no answer); a worker's update of the log or trace settings
(`update_settings`) is answered once the other workers have the new settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from reference_server.core.dataplane import DataPlane
from reference_server.errors import InvalidArgument
from reference_server.scheduling.cancel import CancelScope
from reference_server.workers.frames import FrameProtocol, error_of, request_from_wire, response_to_wire
from reference_server.workers.hosting import WorkerHosting

__all__ = ["CALLABLE", "PlaneServer"]

log = logging.getLogger(__name__)

#: What a worker may call by name: the DataPlane's methods the front ends use, and the shared
#: memory registry's.
CALLABLE = frozenset({
    "live", "ready", "server_metadata", "model_ready", "model_metadata", "model_config",
    "model_config_proto", "statistics", "repository_index", "decode_raw_request", "load_model",
    "unload_model", "log_settings", "trace_settings",
    "shared_memory.status", "shared_memory.register", "shared_memory.unregister",
    "shared_memory.cuda_status", "shared_memory.cuda_register", "shared_memory.cuda_unregister",
})  # fmt: skip


#: Calls after which the workers are told what to run themselves.
_MODEL_CONTROL = frozenset(("load_model", "unload_model"))


class PlaneServer:
    def __init__(self, plane: DataPlane, path: str, hosting: WorkerHosting) -> None:
        self.plane = plane
        self.path = path
        self.hosting = hosting
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_WorkerConnection] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _WorkerConnection(self), self.path)
        os.chmod(self.path, 0o600)  # the workers run as this user; nobody else may call the core

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for connection in list(self._connections):
                connection.close()
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def method(self, name: str) -> Callable[..., Any]:
        if name not in CALLABLE:
            raise InvalidArgument(f"no such call '{name}'")
        if name == "model_config_proto":  # a protobuf message crosses as its wire form
            return lambda *args: self.plane.model_config_proto(*args).SerializeToString()
        target: Any = self.plane
        for part in name.split("."):
            target = getattr(target, part)
        return target  # type: ignore[no-any-return]


class _WorkerConnection(FrameProtocol):
    def __init__(self, server: PlaneServer) -> None:
        super().__init__(self._message, self._lost)
        self._server = server
        self._tasks: dict[int, asyncio.Task[None]] = {}
        #: The unary requests running for the worker, by call id, until answered: what its `cancel`
        #: (the client went away) cancels, as the in-process front ends cancel theirs.
        self._scopes: dict[int, CancelScope] = {}
        self._worker: int | None = None  # set by the worker's hello, on its asynchronous connection
        server._connections.add(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _lost(self) -> None:
        self._server._connections.discard(self)
        if self._worker is not None:
            self._server.hosting.lost(self._worker, self.send)
        for task in self._tasks.values():
            task.cancel()  # the worker is gone: nobody waits for these answers
        scopes, self._scopes = self._scopes, {}
        for scope in scopes.values():
            scope.cancel()

    def _message(self, message: tuple[Any, ...]) -> None:
        kind, call_id, payload = message
        if kind == "infer":
            self._infer(call_id, *payload)
        elif kind == "call":
            self._call(call_id, *payload)
        elif kind == "stream":
            self._spawn(call_id, self._stream(call_id, *payload))
        elif kind == "cancel":
            task = self._tasks.get(call_id)
            if task is not None:
                task.cancel()
            scope = self._scopes.pop(call_id, None)
            if scope is not None:
                scope.cancel()
        elif kind == "answer":
            self._server.hosting.answered(call_id, *payload)
        elif kind == "traces":
            self._server.plane.tracing.accept(payload)
        elif kind == "hello":
            self._worker = payload
            self._spawn(-1, self._server.hosting.attach(payload, self.send))
        else:
            self.send((call_id, "err", error_of(InvalidArgument(f"unknown message kind '{kind}'"), "a worker call")))

    def _spawn(self, call_id: int, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks[call_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(call_id, None))

    def _admitted(self, call_id: int) -> bool:
        """Whether an in-flight slot was taken for the call; if not, its refusal is sent."""
        try:
            self._server.plane.acquire()
        except Exception as exc:
            self.send((call_id, "err", error_of(exc, "admission")))
            return False
        return True

    def _infer(self, call_id: int, request: Any, endpoint: str, received: tuple[int, int] | None = None) -> None:
        """A unary request; `received`: when the worker began and ended reading it, while tracing."""
        if not self._admitted(call_id):
            return
        plane = self._server.plane
        scopes = self._scopes

        def done(response: Any) -> None:
            plane.release()
            scope = scopes.pop(call_id, None)
            if scope is not None:
                scope.release()
            if isinstance(response, BaseException):
                self.send((call_id, "err", error_of(response, "inference")))
            else:
                self.send((call_id, "ok", response_to_wire(response)))

        if received is not None:
            plane.tracing.received = received
        scope = scopes[call_id] = CancelScope()
        try:
            with scope:
                plane.start_infer(request_from_wire(request), done, endpoint=endpoint)
        except Exception as exc:
            scopes.pop(call_id, None)
            plane.release()
            self.send((call_id, "err", error_of(exc, "inference")))
        finally:
            if received is not None:
                plane.tracing.received = None

    def _call(self, call_id: int, name: str, args: tuple[Any, ...]) -> None:
        if name == "update_settings":
            self._update_settings(call_id, *args)
            return
        try:
            result = self._server.method(name)(*args)
        except Exception as exc:
            self.send((call_id, "err", error_of(exc, name)))
            return
        if inspect.isawaitable(result):
            self._spawn(call_id, self._await(call_id, name, result))
        else:
            self.send((call_id, "ok", result))

    def _update_settings(self, call_id: int, worker: int, kind: str, model: str, changes: Any) -> None:
        """A worker's update of the log ("log") or trace settings: answered with the settings now in
        force, and with what that worker applies itself, once every other worker has them too, so
        that a client's next request, whichever worker reads it, runs by them. (The calling
        worker waits on its blocking connection: it cannot answer an ask meanwhile.)"""
        plane = self._server.plane
        try:
            result = plane.log_settings(changes) if kind == "log" else plane.trace_settings(model, changes)
        except Exception as exc:
            self.send((call_id, "err", error_of(exc, f"{kind}_settings")))
            return
        self._spawn(call_id, self._told(call_id, worker, result))

    async def _told(self, call_id: int, worker: int, result: Any) -> None:
        hosting = self._server.hosting
        await hosting.tell_settings(but=worker)
        self.send((call_id, "ok", (result, *hosting.settings())))

    async def _await(self, call_id: int, name: str, result: Any) -> None:
        try:
            value = await result
            if name in _MODEL_CONTROL:
                await self._server.hosting.sync()
        except Exception as exc:
            self.send((call_id, "err", error_of(exc, name)))
        else:
            self.send((call_id, "ok", value))

    async def _stream(self, call_id: int, request: Any, endpoint: str, received: tuple[int, int] | None = None) -> None:
        """A streamed request; `received`: when the worker began and ended reading it, while tracing."""
        if not self._admitted(call_id):
            return
        plane = self._server.plane
        try:
            if received is None:
                responses = plane.infer_stream(request_from_wire(request), endpoint=endpoint)
            else:
                plane.tracing.received = received
                try:
                    responses = plane.infer_stream(request_from_wire(request), endpoint=endpoint)
                finally:
                    plane.tracing.received = None
            try:
                async for response, final in responses:
                    if isinstance(response, BaseException):
                        self.send((call_id, "item", (error_of(response, "a stream response"), final, True)))
                    else:
                        wire = None if response is None else response_to_wire(response)
                        self.send((call_id, "item", (wire, final, False)))
            finally:
                await responses.aclose()
            self.send((call_id, "end", None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.send((call_id, "err", error_of(exc, "a stream")))
        finally:
            plane.release()
