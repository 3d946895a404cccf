"""The messages between a front-end worker and the core: pickled tuples behind a 4-byte length.

Both sides are the server's own processes, started by the core from its own files, so pickle carries
the codec's dataclasses and numpy tensors as they are. Errors cross as their class and message
(`error_of` / `raise_of`), so a client hears Triton's status and words from any process.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any, cast

from reference_server.errors import InternalError, ServerError, server_error

__all__ = ["FrameProtocol", "FrameSocket", "encode", "error_of", "exception_of"]

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
#: A frame larger than this is a bug, not a request: the front ends cap bodies far below it.
MAX_FRAME_BYTES = 1 << 31


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


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
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are no subclass of asyncio's

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if end - start - 4 < length:
                break
            message = pickle.loads(memoryview(buffer)[start + 4 : start + 4 + length])
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
        self.transport.write(frame)


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
        reply: tuple[Any, ...] = pickle.loads(self._read(length))
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
