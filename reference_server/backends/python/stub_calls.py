"""The stub's calls to the server on a model's behalf: BLS (`infer`, `infer_stream` and their async
forms, with the tokens of the requests each call is made for) and the custom-metrics and
model-control `service` calls, plus the routing of their answers as they are read.

`StubCalls` is a mixin of `stub.Stub`, which owns the channel, the arenas, the reading (`pump`)
and the state these methods share; it is split out so that the stub module keeps running the
model, and this one keeps what the model asks of the server.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from reference_server.backends.python import ipc
from reference_server.backends.python.pb import triton_python_backend_utils as pb_utils

#: The tokens of the requests a decoupled coroutine runs for (its BLS calls are made for them).
BLS_OWNERS: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("bls_owners", default=())


class StubCalls:
    """BLS and service calls from any thread of the model; the caller reads the channel while it
    waits (`pump`), and `_bls_result` is routed the answers of BLS calls."""

    # Set by `Stub.__init__`.
    channel: ipc.Channel
    arena: ipc.Arena
    server_arena: ipc.Arena
    bls_allowed: bool
    _bls_ids: itertools.count[int]
    _bls: dict[int, Any]
    _bls_lock: threading.Lock
    _calls: dict[int, collections.deque[dict[str, Any]]]
    _executing: Any
    _main_thread: int

    def pump(self, ready: Callable[[], bool]) -> None:
        raise NotImplementedError  # `Stub.pump`

    def call_server(self, call: str, args: dict[str, Any], tensors: dict[str, Any] | None = None) -> Any:
        """One custom-metrics or model-control call to the server (`services.py`): its result, or
        TritonModelException with the server's words. From any thread; the caller reads meanwhile.
        `tensors` (a model file's bytes, say) go through shared memory: they may outgrow a message."""
        answers: collections.deque[dict[str, Any]] = collections.deque()
        call_id = next(self._bls_ids)
        with self._bls_lock:
            self._calls[call_id] = answers
        fds: list[int] = []
        descs = [ipc.write_tensor(self.arena, name, array, fds) for name, array in (tensors or {}).items()]
        self.channel.send({"op": "service", "id": call_id, "call": call, "tensors": descs, **args}, fds)
        ipc.close_fds(fds)
        self.pump(lambda: bool(answers))
        answer = answers.popleft()
        if answer["error"] is not None:
            raise pb_utils.TritonModelException(answer["error"])
        return answer["result"]

    def _owners(self) -> tuple[int, ...]:
        """The tokens of the requests a BLS call made now is made for: those of the execute or
        coroutine that makes it; none from a thread of the model's own."""
        owners = BLS_OWNERS.get()
        if not owners and threading.get_ident() == self._main_thread:
            owners = tuple(item[0] for item in self._executing)
        return owners

    def _send_bls(
        self, request: pb_utils.InferenceRequest, decoupled: bool, waiter: Any, owners: tuple[int, ...] | None = None
    ) -> int:
        if not self.bls_allowed:
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")
        bls_id = next(self._bls_ids)
        with self._bls_lock:
            self._bls[bls_id] = waiter
        fds: list[int] = []
        inputs = [ipc.write_tensor(self.arena, t.name(), t._host_array(), fds) for t in request.inputs()]
        version = request.model_version()
        self.channel.send(
            {
                "op": "bls",
                "id": bls_id,
                "model_name": request.model_name(),
                "model_version": "" if version < 0 else str(version),
                "inputs": inputs,
                "outputs": request.requested_output_names(),
                "request_id": request.request_id(),
                "parameters": request.parameters(),
                "timeout": request.timeout(),
                "sequence": (request.correlation_id(), request.flags()),
                "decoupled": decoupled,
                "owners": self._owners() if owners is None else owners,
            },
            fds,
        )
        ipc.close_fds(fds)
        return bls_id

    def infer(
        self, request: pb_utils.InferenceRequest, owners: tuple[int, ...] | None = None
    ) -> list[pb_utils.InferenceResponse]:
        answers: collections.deque[pb_utils.InferenceResponse | None] = collections.deque()
        self._send_bls(request, False, answers, owners)
        self.pump(lambda: bool(answers))
        response = answers.popleft()
        assert response is not None
        return [response]

    def infer_stream(self, request: pb_utils.InferenceRequest) -> pb_utils.ResponseIterator:
        answers: collections.deque[pb_utils.InferenceResponse | None] = collections.deque()
        bls_id = self._send_bls(request, True, answers)

        def next_response() -> pb_utils.InferenceResponse | None:
            self.pump(lambda: bool(answers))
            return answers.popleft()

        return pb_utils.ResponseIterator(next_response, lambda: self.channel.send({"op": "bls_cancel", "id": bls_id}))

    def infer_async(self, request: pb_utils.InferenceRequest) -> Awaitable[pb_utils.InferenceResponse]:
        # The calling thread runs the asyncio loop meanwhile, so a pool thread waits (and reads).
        owners = self._owners()
        return asyncio.get_running_loop().run_in_executor(None, lambda: self.infer(request, owners)[0])

    def infer_stream_async(self, request: pb_utils.InferenceRequest) -> Awaitable[pb_utils.ResponseIterator]:
        # Sent now, so several can be in flight; the iterator waits (and reads) as `exec`'s does.
        ready: asyncio.Future[pb_utils.ResponseIterator] = asyncio.get_running_loop().create_future()
        ready.set_result(self.infer_stream(request))
        return ready

    def _bls_result(self, message: dict[str, Any], fds: list[int]) -> None:
        final = message["final"]
        with self._bls_lock:
            waiter: Any = self._bls.pop(message["id"]) if final else self._bls[message["id"]]
        response = None
        if message["error"] is not None:
            text, code = message["error"]
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(text, code))
        elif message["response"] is not None:
            outputs = message["response"]["outputs"]
            tensors = [pb_utils.Tensor(d[0], ipc.read_tensor(self.server_arena, d, fds, copy=True)) for d in outputs]
            blocks = [(d[3][1], d[3][2]) for d in outputs if d[3][0] == "a"]
            if blocks:
                self.channel.send({"op": "free", "blocks": blocks})
            response = pb_utils.InferenceResponse(tensors, parameters=message["response"]["parameters"])
        ipc.close_fds(fds)
        if response is None and final and message.get("decoupled"):
            # The model's final flag came alone: Triton's iterator gives it as an empty response.
            response = pb_utils.InferenceResponse()
        if response is not None:
            waiter.append(response)
        if final and message.get("decoupled"):
            waiter.append(None)
