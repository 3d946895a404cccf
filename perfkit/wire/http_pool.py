"""HTTP/1.1 keep-alive exchanges for the infer hot path: pre-encoded requests out, llhttp-parsed replies in.

aiohttp builds a request, a response object, a stream reader and several tasks for every call:
80-100 µs of Python per request, as much as the rest of the load generator together. An infer
request never changes once encoded, so this module sends bytes that `encode_request` built once
and reads the reply with httptools (llhttp, in C), calling back into Python only for headers,
body chunks and completion.

Theory of operation. A `ConnectionPool` holds one connection per outstanding request: no
pipelining, so a slow reply never holds up another. `exchange()` takes an idle connection (or
opens one, up to `limit`; past it, it waits for one to come back), writes the request and awaits
the reply. The connection completes the reply from the parser's callbacks and goes back to the
pool itself, before the waiting task even resumes. A connection that fails, times out, is cancelled
mid-reply, says `Connection: close` or sends bytes nobody asked for is closed and forgotten, never
reused: what it would read next is unknowable.

A server cannot make a reply cost without bound (`perfkit.wire.limits`): the request's deadline
runs from the write to the reply's last byte, so a head or body trickled forever times out; a head
(interim replies included) past `max_head` bytes, a Content-Length past `max_body`, or a body that
grows past it, fail the request as a `ReplyTooLarge` and drop the connection at once. The checks
are one comparison a read while the head is incomplete, and one a body chunk.

The request timeout costs no timer per request: each connection keeps one loop timer and a
deadline; a request moves the deadline, and the timer, when it fires early, re-arms itself for the
current one.

`exchange()` never raises but for cancellation: a failure comes back in the reply, so the caller
can classify it (`Disconnected`, `BadResponse`, `ConnectFailed` wrapping the OS or TLS error,
`TimeoutError`, or the OS error that ended an open connection).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import Mapping
from typing import cast

import httptools

from perfkit.wire.http_errors import BadResponse, ConnectFailed, Disconnected, ReplyTooLarge
from perfkit.wire.limits import MAX_REPLY_BODY, MAX_REPLY_HEAD
from v2kit.codec import HEADER_LENGTH

__all__ = [
    "BadResponse", "ConnectFailed", "ConnectionPool", "Disconnected", "Reply", "ReplyTooLarge", "encode_request",
]  # fmt: skip

#: (status, Inference-Header-Content-Length value or None, body, sent_ns, first_byte_ns, failure).
#: `sent_ns`: when the request was written to the transport (0: never); `first_byte_ns`: when the
#: reply's first bytes arrived (0: none did); `failure`: None for a complete reply, whatever its status.
Reply = tuple[int, bytes | None, bytes, int, int, BaseException | None]

_now = time.perf_counter_ns
#: Woken with room for a connection but less time than this left: time out, connect to nobody.
_CONNECT_MIN_S = 0.001
_HEADER_LENGTH = HEADER_LENGTH.lower().encode()  # compared with lower-cased names
_FRAMING = (b"content-length", b"transfer-encoding")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field-name
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


def encode_request(method: str, target: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """The request's bytes on the wire. Content-Length is computed here and wins over one in
    `headers` (so does the absence of Transfer-Encoding): the framing must match the body. Raises
    ValueError naming a header that cannot go on the wire."""
    lines = [f"{method} {target} HTTP/1.1"]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not an HTTP token (letters, digits, -, and !#$%&'*+.^_`|~)")
        if _UNSAFE_VALUE.search(value):
            raise ValueError(f"header {name}: its value holds a line break or NUL")
        if name.lower().encode() not in _FRAMING:
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection and its reply parser; one request at a time."""

    __slots__ = (
        "_pool", "_loop", "_parser", "_transport", "_waiter", "_deadline", "_timer", "_gone",
        "_sent_ns", "_first_ns", "_chunks", "_header_length", "_headers_done", "_framed",
        "_head_size", "_interim", "_body_size", "_max_head", "_max_body", "_long_length",
    )  # fmt: skip

    def __init__(self, pool: ConnectionPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Reply] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._gone = False
        self._sent_ns = self._first_ns = 0
        self._chunks: list[bytes] = []
        self._header_length: bytes | None = None
        self._headers_done = self._framed = False
        self._head_size = self._interim = self._body_size = 0  # this reply's, so far
        self._max_head, self._max_body = pool.max_head, pool.max_body
        # A Content-Length with this many digits or more may be over max_body: only those are parsed.
        self._long_length = len(str(pool.max_body))

    # --- the request side, called by the pool ---

    def request(self, wire: bytes, deadline: float) -> asyncio.Future[Reply]:
        self._waiter = waiter = self._loop.create_future()
        self._chunks = []
        self._header_length = None
        self._first_ns = 0
        self._headers_done = self._framed = False
        self._head_size = self._interim = self._body_size = 0
        self._deadline = deadline
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._check_deadline)
        assert self._transport is not None
        self._transport.write(wire)
        self._sent_ns = _now()
        return waiter

    def discard(self) -> None:
        """Close at once and forget: for a connection whose next bytes cannot be trusted."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()
        if not self._gone:
            self._gone = True
            self._pool.forget(self)

    def _check_deadline(self) -> None:
        self._timer = None
        if self._waiter is None or self._gone:
            return  # idle: the next request arms it again
        if self._loop.time() >= self._deadline:
            self._fail(TimeoutError(f"no complete reply within {self._pool.timeout_s} s"))
        else:  # fired for an earlier request: wait for this one's deadline
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)

    def _complete(self, status: int, failure: BaseException | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():  # done: cancelled, and the pool drops this connection
            reply = (status, self._header_length, b"".join(self._chunks), self._sent_ns, self._first_ns, failure)
            waiter.set_result(reply)

    def _fail(self, failure: BaseException) -> None:
        self._complete(0, failure)
        self.discard()

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the stream is out of step
            self.discard()
            return
        if not self._first_ns:
            self._first_ns = _now()
        head_open = not self._headers_done
        if head_open:  # llhttp keeps a header line until it ends: bound what a head may take
            self._head_size += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # a callback refused the reply (ReplyTooLarge)
            failure = exc.__context__
            if not isinstance(failure, ReplyTooLarge):
                failure = BadResponse(f"the reply could not be read: {failure!r}")
            self._fail(failure)
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(BadResponse(f"the reply is not valid HTTP/1.1: {exc or type(exc).__name__}"))
            return
        if head_open and not self._headers_done and self._head_size > self._max_head and not self._gone:
            interim = f" after {self._interim} interim (1xx) replies" if self._interim else ""
            self._fail(ReplyTooLarge(f"the reply's head is over {self._max_head} bytes{interim}"))

    def eof_received(self) -> bool | None:
        # A connection the server is closing must not be handed out; the reply in flight, if
        # any, is finished in connection_lost (an EOF-framed body ends here).
        self._pool.forget_idle(self)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._waiter is not None:
            if exc is not None:
                self._fail(exc)
            elif not self._headers_done:
                self._fail(Disconnected("the server closed the connection before replying"))
            elif not self._framed:  # neither Content-Length nor chunked: the body ends at EOF
                self._complete(self._parser.get_status_code(), None)
            else:
                self._fail(BadResponse("the server closed the connection mid-body"))
        self.discard()

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)
        if size == 31 and name.lower() == _HEADER_LENGTH:
            self._header_length = value
        elif (size == 14 or size == 17) and name.lower() in _FRAMING:
            self._framed = True
            if size == 14 and len(value) >= self._long_length and int(value) > self._max_body:
                # Refused before a byte of it is read; raised to stop the parser (data_received fails the reply).
                raise ReplyTooLarge(f"the reply announces {int(value)} body bytes, over the {self._max_body} we take")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body:  # chunked or EOF-framed without end
            self._chunks = []
            raise ReplyTooLarge(f"the reply's body is over the {self._max_body} bytes we take")
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if self._waiter is None:  # a reply nobody asked for: the stream is out of step
            self.discard()
            return
        if status < 200:  # an interim reply (100 Continue); the real one follows, its head bounded with these
            self._chunks, self._header_length, self._headers_done, self._framed = [], None, False, False
            self._interim += 1
            self._body_size = 0
            return
        self._complete(status, None)
        if self._parser.should_keep_alive() and not self._gone:
            self._pool.release(self)
        else:
            self.discard()


class ConnectionPool:
    """Keep-alive connections to one server. `limit` caps them (0: one per outstanding request);
    `ssl_context` makes them HTTPS; `max_head` and `max_body` bound a reply (`perfkit.wire.limits`).
    Open it in the event loop that uses it; `close()` when done."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        limit: int,
        timeout_s: float,
        max_head: int = MAX_REPLY_HEAD,
        max_body: int = MAX_REPLY_BODY,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.max_head, self.max_body = max_head, max_body
        self._ssl = ssl_context
        self._limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()

    async def exchange(self, wire: bytes) -> Reply:
        """Send `wire` (a whole request) and read the whole reply; failures come back in the Reply."""
        idle, loop = self._idle, self._loop
        if idle and loop is not None:
            connection = idle.pop()
            deadline = loop.time() + self.timeout_s
        else:
            self._loop = loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout_s
            try:
                connection = await self._connection(loop, deadline)
            except Exception as exc:  # ConnectFailed, TimeoutError, Disconnected
                return (0, None, b"", 0, 0, exc)
        try:
            waiter = connection.request(wire, deadline)
        except Exception as exc:  # the transport refused the write: closed under us
            connection.discard()
            return (0, None, b"", 0, 0, Disconnected(f"the connection was closed before the request went: {exc}"))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():  # cancelled mid-reply: the rest of it would poison the next request
                connection.discard()
            raise

    async def _connection(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        while self._limit and len(self._open) + self._opening >= self._limit:
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():  # handed over just as the wait ended: pass it on
                    handed = waiter.result()
                    if handed is None:
                        self._wake()
                    else:
                        self.release(handed)
                raise
            if handed is not None:
                return handed
            # None: a connection closed and left room for a new one, maybe just as this wait ran out
            # (a timed-out request's connection closes at about the deadline of the one waiting).
            if deadline - loop.time() < _CONNECT_MIN_S:
                self._wake()  # the room goes to the next task waiting
                raise TimeoutError("no connection was free before the request's deadline")
        if self._idle:  # one came back while this task waited
            return self._idle.pop()
        self._opening += 1
        try:
            async with asyncio.timeout_at(deadline):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, loop),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
        except BaseException as exc:
            self._opening -= 1
            self._wake()  # its room is free again
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                raise ConnectFailed(exc) from None  # refused, unreachable, name resolution, TLS
            raise
        self._opening -= 1
        if connection._gone:
            self._wake()
            raise Disconnected("the server closed the connection as it opened")
        self._open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        """A connection that finished its reply and may take another request."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    def forget_idle(self, connection: _Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)

    def forget(self, connection: _Connection) -> None:
        self.forget_idle(connection)
        if connection in self._open:
            self._open.discard(connection)
            self._wake()

    def _wake(self) -> None:
        """Room for one more connection: let the first task waiting for one open it."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every connection; replies still in flight fail as disconnected."""
        for connection in list(self._open):
            connection._fail(Disconnected("the client closed the connection"))
        self._idle.clear()
        while self._waiters:
            self._waiters.popleft().cancel()
        self._loop = None  # a later exchange, maybe in another event loop, starts afresh
        await asyncio.sleep(0)  # let the transports report connection_lost before the loop ends
