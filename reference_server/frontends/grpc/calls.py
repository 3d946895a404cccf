"""A gRPC call as the servicer sees it, and as the connection (`server.py`) keeps it.

The servicer (`service.InferenceServicer`) is written against grpc.aio: each method gets its request
and a ServicerContext. This module is what stands in for grpc.aio there: `method_table` reads the
service's methods off its descriptor (the path a call names, the request's lenient deserialiser,
whether the client streams, and the method's form without a task where the servicer has one);
`Context` gives the servicer `abort`, `write` and `invocation_metadata`, and `Abort` is how `abort`
ends the call. `Call` is the HTTP/2 stream carrying one call: what the connection has of its request,
its task, and whether a sender waits for its data to leave. Nothing here writes to the wire: a
`Context` hands a streamed reply to its connection (`Sender`), which frames and sends it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
from tritonclient.grpc import service_pb2 as pb

from reference_server.frontends.forwarding import forward_into
from reference_server.frontends.grpc.service import InferenceServicer, lenient_deserializer
from reference_server.scheduling.cancel import CancelScope
from v2kit.grpc_status import code_of
from v2kit.h2.connection import Payload, Stream

__all__ = ["Abort", "Call", "Context", "Method", "Sender", "Start", "deserialize", "method_table", "wake"]

_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


class Abort(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by `Context.abort`: the call ends with this status. An AbortError, so that the
    servicer's own wrapper passes it through as it does grpc.aio's."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


#: A unary method's form without a task: (request, done), where `done` gets the response message
#: or (grpc.StatusCode, details), once, on the loop.
Start = Callable[[Any, Callable[[Any], None]], None]


class Method:
    __slots__ = ("name", "handler", "deserialize", "streaming", "start")

    def __init__(
        self, name: str, handler: Callable[..., Awaitable[Any]], deserialize: Any, streaming: bool,
        start: Start | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.handler = handler
        self.deserialize = deserialize
        self.streaming = streaming
        self.start = start


def method_table(servicer: InferenceServicer) -> dict[str, Method]:
    """`servicer`'s methods by the path a call names (/inference.GRPCInferenceService/ModelInfer...)."""
    methods: dict[str, Method] = {}
    for method in _SERVICE.methods:
        path = f"/{_SERVICE.full_name}/{method.name}"
        deserialize = lenient_deserializer(getattr(pb, method.input_type.name))
        handler = getattr(servicer, method.name)
        # Looked up on the class: a servicer's __getattr__ stands in for missing methods, not these.
        start = getattr(type(servicer), f"start_{method.name}", None)
        bound = None if start is None else start.__get__(servicer)
        methods[path] = Method(method.name, handler, deserialize, method.client_streaming, bound)
    return methods


class Call(Stream):
    """A stream carrying one call: its method, the request bytes not yet taken, its task, and
    whether its answer's headers are out and a sender waits for its data to leave."""

    __slots__ = (
        "method", "chunks", "size", "need", "task", "requests", "queued", "headers_sent", "drained", "encoding",
        "reply_coding", "forwarded", "metadata", "cancel", "read_began",
    )  # fmt: skip
    read_began: int  # when its stream opened (perf_counter_ns), set only while tracing is active

    def __init__(self, method: Method, encoding: str = "", reply_coding: str | None = None) -> None:
        super().__init__()
        self.method = method
        self.encoding = encoding  # the request messages' coding (grpc-encoding), "" for identity
        self.reply_coding = reply_coding  # the answer's, None for identity
        self.chunks: list[Payload] = []
        self.size = 0
        self.need = 5  # request bytes to have before the next message prefix is looked at
        self.task: asyncio.Task[None] | None = None
        # ModelStreamInfer's requests and their sizes on the wire; None ends them.
        self.requests: asyncio.Queue[tuple[Any, int] | None] | None = None
        self.queued = 0  # bytes of the requests in `requests`, not yet taken by the servicer
        self.headers_sent = False
        self.drained: asyncio.Future[None] | None = None  # a sender waiting for its data to leave
        self.metadata: tuple[tuple[str, str], ...] = ()  # a stream's request headers (invocation_metadata)
        self.forwarded: dict[str, str] | None = None  # metadata for the request's parameters
        self.cancel: CancelScope | None = None  # what a call without a task queued, cancelled by a reset


def wake(call: Call) -> None:
    """Let the sender waiting for `call`'s data to leave go on (it left, or the stream is gone)."""
    if call.drained is not None and not call.drained.done():
        call.drained.set_result(None)


def deserialize(call: Call, message: Payload) -> Any:
    """A request message, with the call's forwarded metadata among its parameters."""
    request = call.method.deserialize(message)
    return request if call.forwarded is None else forward_into(request, call.forwarded)


class Sender(Protocol):
    """What a `Context` needs of its connection: a streaming call's reply message sent."""

    async def send_message(self, call: Call, data: bytes) -> None: ...


class Context:
    """What the servicer's methods use of grpc.aio's ServicerContext."""

    __slots__ = ("_connection", "_call")

    def __init__(self, connection: Sender, call: Call) -> None:
        self._connection = connection
        self._call = call

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Abort(code_of(code), details)

    async def write(self, message: Any) -> None:
        await self._connection.send_message(self._call, message.SerializeToString())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """A streaming call's request headers (a unary call's are not kept), as grpc.aio's."""
        return self._call.metadata
