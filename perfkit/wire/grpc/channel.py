"""A lean gRPC client for unary calls over HTTP/2, for the load generator's hot path.

Why: grpcio costs about 170-250 µs of Python-side CPU per call whatever the API (grpc.aio, sync
threads, futures), more than perf_analyzer's whole request. A unary gRPC call is three frames each
way, so this module speaks them itself: one `asyncio.Protocol` per connection, on asyncio or uvloop.
Everything but inference (health, metadata, repository, statistics) stays on grpc.aio.

Theory of operation (RFC 9113 for HTTP/2, RFC 7541 for HPACK, grpc/doc/PROTOCOL-HTTP2.md for gRPC):

- A call is encoded once (`Channel.encode`): the gRPC length-prefixed message and an HPACK header
  block made of static-table indexes and literals without indexing, so it never depends on the
  dynamic table and stays valid on every connection. Per call, only the stream id in the two 9-byte
  frame headers changes, and HEADERS and DATA leave in one write.
- One connection carries every call, like grpc.aio's channel; its HTTP/2 (windows, frame sizes,
  the server's stream limit, SETTINGS, PING, GOAWAY) is `v2kit.h2.connection`'s, which the
  reference server's front end shares: a body the windows cannot take yet waits there until
  WINDOW_UPDATEs come.
- Replies: one HPACK decoder per connection holds the server's dynamic table. Once warm, a server
  sends the same few header blocks over and over, made of indexed fields and literals without
  indexing (grpc-core's empty grpc-message); such a block leaves the table as it is, so its
  decoding is cached by its bytes until a block that may change the table arrives.
- A call ends as a `Call` whose `status` is the gRPC status (0: OK), `MALFORMED` when the reply
  breaks gRPC's framing, and `details` says why. Transport failures read as grpc-core reports them:
  UNAVAILABLE for a refused, reset, closed or garbled connection and for calls a GOAWAY left out,
  DEADLINE_EXCEEDED when its deadline passes first (one timer a connection, at the earliest).
- A connection that fails, is told GOAWAY, or runs out of stream ids takes no new calls: the next
  call opens a new one, and the old one closes once its calls are done.
- With a `compression` (perf_analyzer's --grpc-compression-algorithm), request messages are
  compressed, flagged so in their prefix and named by `grpc-encoding`; gRPC's "deflate" is the zlib
  format. Replies are not asked to be compressed (no grpc-accept-encoding is sent).
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
import zlib
from collections.abc import Callable, Sequence
from typing import ClassVar

from perfkit.wire.grpc.connection import Call, Connection, failed
from perfkit.wire.limits import MAX_REPLY_BODY
from v2kit import grpc_status as status
from v2kit.grpc_status import MALFORMED
from v2kit.h2.frames import EncodedCall, encode_call

__all__ = ["COMPRESSIONS", "MALFORMED", "Call", "Channel", "EncodedCall"]

#: --grpc-compression-algorithm's codings: how each compresses a message; "none" sends it as it is.
COMPRESSIONS: dict[str, Callable[[bytes], bytes] | None] = {
    "none": None,
    "gzip": lambda message: gzip.compress(message, mtime=0),
    "deflate": zlib.compress,
}


# --- the channel -----------------------------------------------------------------------------------


class Channel:
    """Unary gRPC calls to `host:port` over one HTTP/2 connection, reopened when it fails. TLS when
    `ssl_context` is given (ALPN "h2"). Use it from one event loop. `connection_type` is what each
    connection is (`perfkit.wire.grpc.streaming` opens streaming ones)."""

    connection_type: ClassVar[type[Connection]] = Connection

    def __init__(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None = None, *, max_message: int = MAX_REPLY_BODY,
        compression: str = "none",
    ) -> None:  # fmt: skip
        """`max_message`: the largest reply message a call takes (`perfkit.wire.limits`); `compression`:
        one of COMPRESSIONS, for the messages of the calls it encodes."""
        self.target = f"{host}:{port}"
        self._compress = COMPRESSIONS[compression]
        #: The metadata that names the coding of compressed messages; () when they are not.
        self.coding: tuple[tuple[str, str], ...] = (("grpc-encoding", compression),) if self._compress else ()
        self._max_message = max_message
        self._host, self._port = host, port
        self._ssl = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        self._connection: Connection | None = None  # the one new calls go to
        self._open_connections: set[Connection] = set()  # it, and older ones still draining
        self._opening: asyncio.Task[Connection] | None = None

    def encode(
        self, path: str, message: bytes, metadata: Sequence[tuple[str, str]] = (), timeout_s: float = 30.0
    ) -> EncodedCall:
        """A unary call to `path` ("/package.Service/Method") carrying `message`, with `metadata`
        (lower-case keys) and a `timeout_s` deadline, encoded once for any number of calls."""
        if self._compress is not None:
            message, metadata = self._compress(message), (*metadata, *self.coding)
        return encode_call(
            path, message, authority=self.target, tls=self._ssl is not None, metadata=metadata, timeout_s=timeout_s,
            compressed=self._compress is not None,
        )  # fmt: skip

    def stream_message(self, message: bytes) -> bytes:
        """`message` as a stream carries it: its 5-byte prefix and its bytes, compressed as calls' are."""
        if self._compress is None:
            return b"\x00" + len(message).to_bytes(4, "big") + message
        packed = self._compress(message)
        return b"\x01" + len(packed).to_bytes(4, "big") + packed

    async def call(self, encoded: EncodedCall) -> Call:
        """Make the call; never raises but for cancellation: failures are in the returned `Call`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + encoded.timeout_s
        connection = self._connection
        if connection is None or not connection.takes_calls() or not connection.has_room():
            ready = await self._ready(deadline)
            if isinstance(ready, Call):
                return ready
            connection = ready
        call = Call(loop.create_future())
        connection.start(encoded, call, deadline)
        try:
            await call.future
        except asyncio.CancelledError:
            connection.cancel(call)
            raise
        return call

    async def _ready(self, deadline: float) -> Connection | Call:
        """A connection with room for one more call, opened or waited for if need be; or the
        failed call when none came by `deadline`."""
        connection = self._connection
        if connection is None or not connection.takes_calls():
            opened = await self._open(deadline)
            if isinstance(opened, Call):
                return opened
            connection = opened
        return connection if connection.has_room() else await self._wait_for_room(connection, deadline)

    async def _wait_for_room(self, connection: Connection, deadline: float) -> Connection | Call:
        loop = asyncio.get_running_loop()
        while connection.takes_calls() and not connection.has_room():
            waiter = connection.room()
            try:
                await asyncio.wait_for(waiter, deadline - loop.time())
            except asyncio.TimeoutError:
                return failed(status.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if connection.takes_calls():
            return connection
        opened = await self._open(deadline)
        return opened if isinstance(opened, Call) or opened.has_room() else await self._wait_for_room(opened, deadline)

    async def _open(self, deadline: float) -> Connection | Call:
        connection = self._connection
        if connection is not None and connection.takes_calls():
            return connection
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect(deadline))
            self._opening.add_done_callback(self._opened)
        try:
            # Shielded: a cancelled caller must not cancel the connect other callers wait for.
            connection = await asyncio.shield(self._opening)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            return failed(status.DEADLINE_EXCEEDED, f"Deadline Exceeded while connecting to {self.target}")
        except OSError as exc:
            return failed(status.UNAVAILABLE, f"failed to connect to {self.target}: {_connect_problem(exc)}")
        if not connection.takes_calls():  # lost as soon as it opened
            return failed(status.UNAVAILABLE, connection.error or "the server closed the connection")
        return connection

    def _opened(self, task: asyncio.Task[Connection]) -> None:
        self._opening = None
        if not task.cancelled() and task.exception() is None:
            self._connection = connection = task.result()
            self._open_connections.add(connection)
            connection.closed.add_done_callback(lambda _: self._open_connections.discard(connection))

    async def _connect(self, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl is not None
        _, connection = await asyncio.wait_for(
            loop.create_connection(
                lambda: self.connection_type(self.target, tls, self._max_message),
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if tls else None,
            ),
            max(deadline - loop.time(), 0.001),
        )
        if not connection.usable:  # refused in connection_made (ALPN)
            await _closed(connection)
            raise ConnectionError(connection.error)
        return connection

    async def close(self) -> None:
        """Close the connection and fail the calls still on it with UNAVAILABLE."""
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        self._connection = None
        for connection in list(self._open_connections):
            connection.close()
            await _closed(connection)


async def _closed(connection: Connection) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(connection.closed), 5.0)
    except asyncio.TimeoutError:
        connection.abort()


def _connect_problem(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by peer"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS handshake failed: {exc.verify_message or exc}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    return str(exc) or type(exc).__name__
