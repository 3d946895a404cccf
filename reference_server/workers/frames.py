"""The messages between a front-end worker and the core: tuples behind a 4-byte length.

Inference requests and responses cross as plain values (`*_to_wire`: a numeric tensor as its dtype,
shape and buffer, a BYTES tensor as a list of bytes), which pickle writes and reads in about 2 µs,
against 20 µs for the codec's dataclasses and numpy's own reduction. Both sides are the server's own
processes, started by the core from its own files. Errors cross as their
class and message (`error_of` / `exception_of`), so a client hears Triton's status and words from
any process.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from reference_server.errors import InternalError, ServerError, server_error
from v2kit import codec as v2

__all__ = [
    "FrameProtocol",
    "FrameSocket",
    "decode",
    "encode",
    "error_of",
    "exception_of",
    "request_from_wire",
    "request_to_wire",
    "response_from_wire",
    "response_to_wire",
]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
#: A frame larger than this is a bug, not a request: the front ends cap bodies far below it.
MAX_FRAME_BYTES = 1 << 31


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


def decode(payload: memoryview | bytes) -> Any:
    return pickle.loads(payload)


_NUMERIC_KINDS = frozenset("?biufc")
Tensors = list[tuple[str, str, list[int], Any, Any, dict[str, Any]]]


def _tensors_to_wire(tensors: list[v2.InferTensor]) -> Tensors:
    wire: Tensors = []
    for t in tensors:
        data = t.data
        if isinstance(data, np.ndarray):
            if data.dtype.kind in _NUMERIC_KINDS:
                buffer = pickle.PickleBuffer(np.ascontiguousarray(data))  # type: ignore[arg-type]
                contiguous = (buffer, list(data.shape))
                wire.append((t.name, t.datatype, t.shape, data.dtype.str, contiguous, t.parameters))
            else:  # BYTES: its elements, as bytes
                elements = (data.ravel().tolist(), list(data.shape))
                wire.append((t.name, t.datatype, t.shape, "O", elements, t.parameters))
        else:
            wire.append((t.name, t.datatype, t.shape, None, data, t.parameters))
    return wire


def _tensors_from_wire(wire: Tensors) -> list[v2.InferTensor]:
    tensors = []
    for name, datatype, shape, kind, data, parameters in wire:
        if kind is None:
            value = data
        elif kind == "O":
            elements, array_shape = data
            value = np.empty(len(elements), dtype=object)
            value[:] = elements
            value = value.reshape(array_shape)
        else:
            buffer, array_shape = data  # a placeholder's shape is its own, not the tensor's
            value = np.frombuffer(buffer, dtype=np.dtype(kind)).reshape(array_shape)
        tensors.append(v2.InferTensor(name, datatype, shape, value, parameters))
    return tensors


def request_to_wire(request: v2.InferRequest) -> tuple[Any, ...]:
    outputs = None if request.outputs is None else [(o.name, o.binary, o.parameters) for o in request.outputs]
    return (request.model_name, request.model_version, request.id, _tensors_to_wire(request.inputs), outputs,
            request.parameters)  # fmt: skip


def request_from_wire(wire: tuple[Any, ...]) -> v2.InferRequest:
    name, version, request_id, inputs, outputs, parameters = wire
    requested = None if outputs is None else [v2.RequestedOutput(*o) for o in outputs]
    return v2.InferRequest(name, version, request_id, _tensors_from_wire(inputs), requested, parameters)


def response_to_wire(response: v2.InferResponse) -> tuple[Any, ...]:
    return (response.model_name, response.model_version, response.id, _tensors_to_wire(response.outputs),
            response.parameters)  # fmt: skip


def response_from_wire(wire: tuple[Any, ...]) -> v2.InferResponse:
    name, version, response_id, outputs, parameters = wire
    return v2.InferResponse(name, version, response_id, _tensors_from_wire(outputs), parameters)


def error_of(exc: BaseException, what: str) -> tuple[type[ServerError], str]:
    """What crosses for a failed call: the ServerError a client is told, as class and message."""
    error = server_error(exc) if isinstance(exc, Exception) else None
    if error is None:
        log.error("%s failed: %s: %s", what, type(exc).__name__, exc, exc_info=exc)
        return InternalError, f"internal error: {type(exc).__name__}: {exc}"
    return type(error), error.message


def exception_of(crossed: tuple[type[ServerError], str]) -> ServerError:
    cls, message = crossed
    error = cls.__new__(cls)
    ServerError.__init__(error, message)
    return error


class FrameProtocol(asyncio.Protocol):
    """Reads frames off a stream socket and hands each decoded message to `on_message`."""

    def __init__(self, on_message: Callable[[tuple[Any, ...]], None], on_lost: Callable[[], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._buffer = bytearray()
        self._unsent: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no subclass of asyncio's
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if end - start - 4 < length:
                break
            message = decode(memoryview(buffer)[start + 4 : start + 4 + length])
            start += 4 + length
            self._on_message(message)
        if start:
            del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()

    def send(self, message: tuple[Any, ...]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        try:
            frame = encode(message)
        except Exception as exc:  # an answer that cannot cross is that call's failure, not the connection's
            frame = encode((message[0], "err", error_of(exc, "sending an answer")))
        # What is sent in one pass of the loop (a batch's answers, a burst of requests) leaves in one
        # write: a system call and a wake-up of the other side for all of them.
        if not self._unsent:
            self._loop.call_soon(self._flush)
        self._unsent.append(frame)

    def _flush(self) -> None:
        frames, self._unsent = self._unsent, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))


class FrameSocket:
    """One blocking request-reply connection, for the calls the front ends make synchronously
    (metadata, statistics, readiness, shared memory registration): they are few, small and not on
    the inference path, and the core answers them without waiting on anything."""

    def __init__(self, path: str) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(path)
        self._next = 0

    def call(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        self._socket.sendall(encode(message))
        head = self._read(4)
        (length,) = _LENGTH.unpack(head)
        reply: tuple[Any, ...] = decode(self._read(length))
        return reply

    def _read(self, count: int) -> bytes:
        view = bytearray(count)
        got = 0
        while got < count:
            n = self._socket.recv_into(memoryview(view)[got:], count - got)
            if n == 0:
                raise ConnectionError("the server's core process closed the connection")
            got += n
        return bytes(view)

    def close(self) -> None:
        self._socket.close()
