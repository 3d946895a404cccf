"""An HTTP/1.1 server on asyncio protocols, parsing with llhttp (httptools): the REST front end's transport.

aiohttp builds a request object, a payload stream, a response object and its header multidict for
every request, and runs each through its router and middlewares: at concurrency 8 on the demo MLP
that was 22% of the server's CPU, more than everything but the model's own run (py-spy, bench/README.md).
Here llhttp parses in C and calls back into Python for the URL, each header, body chunks and
completion; a request becomes one `HttpRequest` and one task, its answer one `HttpResponse` and
one `write`.

Theory of operation. Each connection serves its requests one at a time, in order. A request that
completes while another is being served waits in the connection's queue (pipelining), and past
`MAX_PIPELINED` of them the connection stops being read until the queue drains. The server owns
what every request must pass before a handler sees it:

- *Size*: a declared `Content-Length` past `max_body_bytes`, or a chunked body that grows past it,
  is answered 413 and the connection closed, before the body is stored.
- *Admission*: requests that `needs_slot` names (inference) take a slot of the `Admission` (the data
  plane's in-flight limit) as soon as their headers are in, before their body is read, so an
  overload costs no memory: refused, the body is read and dropped and the refusal answered in turn.
  A pipelined request takes its slot when its turn comes. The slot is held until the answer is written.
- *Body timeout*: a body not all in within `body_timeout_s` of its headers is answered 408 with
  `Connection: close`, and its slot freed. The timer is armed only when a read ends mid-body, so
  a request that arrives whole (as small ones do) costs no timer.
- *Read gate* (`read_gate.ReadGate`): told of every connection, and of every admitted request from
  its admission to its answer.
- *Bad HTTP*: bytes llhttp refuses get a KServe error JSON, 400, and `Connection: close`.

`stop(grace_s)` stops accepting, lets the requests being served finish within the grace period,
then closes every connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Protocol, cast

import httptools

from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.listener import Listener
from v2kit import codec as v2

__all__ = ["MAX_PIPELINED", "Admission", "HttpRequest", "HttpResponse", "HttpServer"]

log = logging.getLogger(__name__)

#: Requests a connection may have waiting behind the one being served before it is no longer read.
MAX_PIPELINED = 16

_JSON = "application/json"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LARGE_BODY = 1 << 16  # from here on the head and the body go out in two writes, not one copy


class HttpRequest:
    """One parsed request. `path` is as sent (percent-encoded, without the query); header names
    are lower case, and a repeated header's values are joined with ', '."""

    __slots__ = ("method", "path", "headers", "body")

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body


class HttpResponse:
    __slots__ = ("status", "body", "content_type", "headers", "close")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        close: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.close = close  # answer with Connection: close, then close


def error_response(message: str, status: int, *, close: bool = False) -> HttpResponse:
    return HttpResponse(status, v2.error_body(message), _JSON, close=close)


class Admission(Protocol):
    """The in-flight limit: `acquire` takes a slot or raises the error to answer with."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
#: Whether a request, by its method and raw path, takes an admission slot.
NeedsSlot = Callable[[bytes, bytes], bool]
#: The answer to a request whose admission raised this exception.
Refusal = Callable[[Exception], HttpResponse]


class HttpServer(Listener):
    """Serves `handler` on one listening socket; see the module's docstring."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        body_timeout_s: float = 60.0,
        admission: Admission | None = None,
        needs_slot: NeedsSlot | None = None,
        refusal: Refusal | None = None,
        read_gate: ReadGate | None = None,
        access_log: logging.Logger | None = None,
    ) -> None:
        super().__init__()
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.admission = admission
        self.needs_slot = needs_slot if admission is not None else None
        self.refusal = refusal or _default_refusal
        self.read_gate = read_gate
        self.access_log = access_log

    def connection(self) -> asyncio.Protocol:
        return _Connection(self)


def _default_refusal(exc: Exception) -> HttpResponse:
    return error_response(str(exc), 503)


class _Connection(asyncio.Protocol):
    """One client connection: parser callbacks, the queue of its requests, and their answers."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[tuple[HttpRequest | HttpResponse, bool, bool]] = deque()
        self._task: asyncio.Task[None] | None = None  # the request being served
        self._paused = False
        self._closing = False  # close once the requests read so far are answered
        self._body_timer: asyncio.TimerHandle | None = None
        self._gave_up = False  # answered a request it could not read: nothing more is parsed
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._fields: dict[str, str] = {}  # the headers by lower-case name, once all are in
        self._body: list[bytes] = []
        self._size = 0
        self._in_body = False
        self._admitted = False
        self._refused: HttpResponse | None = None

    # -- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no asyncio.Transport subclass, but has its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        if self._server.read_gate is not None:
            self._server.read_gate.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        transport, self._transport = self._transport, None
        self._server.connections.discard(self)
        self._cancel_body_timer()
        if self._admitted:  # its body never came: the slot and the gate's count go back
            self._release(transport)
            self._admitted = False
        if self._server.read_gate is not None and transport is not None:
            self._server.read_gate.connection_lost(transport)
        # A request being served runs to its end (and is counted as the server served it); its
        # answer has nowhere to go. Those waiting behind it were never started.
        for _item, admitted, _ in self._queue:
            if admitted:
                self._release(transport)
        self._queue.clear()

    def data_received(self, data: bytes) -> None:
        if self._gave_up:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._closing = True  # what follows is another protocol's: answer what was asked, then close
        except httptools.HttpParserError as exc:
            self._bad_http(exc)
            return
        if self._in_body and self._body_timer is None and self._task is None and self._transport is not None:
            loop = asyncio.get_running_loop()
            self._body_timer = loop.call_later(self._server.body_timeout_s, self._body_timed_out)

    def eof_received(self) -> bool | None:
        self._closing = True
        if self._task is None and not self._queue:
            return False  # nothing to answer: close now
        return True  # keep the transport open to write the answers

    # -- llhttp callbacks

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._gave_up:
            return
        server = self._server
        self._in_body = True
        fields = self._fields = _fields(self._headers)
        length = _content_length(fields)
        if length is not None and length > server.max_body_bytes:
            self._refuse_too_large(length)
            return
        idle = self._task is None and not self._queue
        needs_slot = server.needs_slot
        if idle and needs_slot is not None and needs_slot(self._parser.get_method(), self._url):
            self._refused = self._take_slot(self._transport)
            self._admitted = self._refused is None
        if fields.get("expect", "").strip().lower() == "100-continue":
            if self._refused is not None:
                self._give_up(self._refused)  # the client waits for a go-ahead that will not come
            elif idle:
                assert self._transport is not None
                self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refused is not None or self._gave_up:
            return  # answered without it: read and dropped
        self._size += len(body)
        if self._size > self._server.max_body_bytes:
            self._refuse_too_large(self._size)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._gave_up:
            return
        self._in_body = False
        self._cancel_body_timer()
        parser = self._parser
        keep_alive = parser.should_keep_alive()
        item: HttpRequest | HttpResponse
        if self._refused is not None:
            item = self._refused
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            url = self._url
            query = url.find(b"?")
            path = (url if query < 0 else url[:query]).decode("latin-1")
            item = HttpRequest(parser.get_method().decode("latin-1"), path, self._fields, body)
        admitted, self._admitted = self._admitted, False
        self._queue.append((item, admitted, keep_alive))
        if self._task is None and len(self._queue) == 1:
            self._next()
        elif len(self._queue) > MAX_PIPELINED and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    # -- serving

    def _next(self) -> None:
        """Start on the oldest request waiting, if any."""
        if not self._queue or self._transport is None:
            return
        item, admitted, keep_alive = self._queue.popleft()
        if isinstance(item, HttpResponse):
            self._answer(item, keep_alive)
            return
        self._server.busy(+1)
        self._task = asyncio.get_running_loop().create_task(self._serve(item, admitted, keep_alive))

    async def _serve(self, request: HttpRequest, admitted: bool, keep_alive: bool) -> None:
        server = self._server
        try:
            response = await self._respond(request, admitted, self._transport)
        finally:
            self._task = None
            server.busy(-1)
        if server.access_log is not None:
            server.access_log.info("%s %s %d", request.method, request.path, response.status)
        self._answer(response, keep_alive)

    async def _respond(self, request: HttpRequest, admitted: bool, transport: asyncio.Transport | None) -> HttpResponse:
        server = self._server
        if not admitted and server.needs_slot is not None:
            if server.needs_slot(request.method.encode("latin-1"), request.path.encode("latin-1")):
                refusal = self._take_slot(transport)
                if refusal is not None:
                    return refusal
                admitted = True
        try:
            return await server.handler(request)
        except Exception as exc:  # the handler maps every error it knows; this one is a bug
            log.exception("internal error serving %s %s", request.method, request.path)
            return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)
        finally:
            if admitted:
                self._release(transport)

    def _answer(self, response: HttpResponse, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None:
            return
        # Closing for another reason (EOF, a refusal queued behind) waits until the last answer.
        close = response.close or not keep_alive or (self._closing and not self._queue)
        body = response.body
        head = [_status_line(response.status), f"Content-Length: {len(body)}\r\n"]
        if response.content_type is not None:
            head.append(f"Content-Type: {response.content_type}\r\n")
        for name, value in response.headers:
            head.append(f"{name}: {value}\r\n")
        if close:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        encoded = "".join(head).encode("latin-1")
        if len(body) < _LARGE_BODY:
            transport.write(encoded + body)
        else:
            transport.write(encoded)
            transport.write(body)
        if close:
            self._queue.clear()
            transport.close()
            return
        if self._paused and not self._closing and len(self._queue) <= MAX_PIPELINED // 2:
            self._paused = False
            transport.resume_reading()
        if self._queue:
            self._next()
        elif self._in_body and self._body_timer is None:
            # A request's body was coming in while this one was served: its clock runs from now.
            loop = asyncio.get_running_loop()
            self._body_timer = loop.call_later(self._server.body_timeout_s, self._body_timed_out)

    # -- admission and refusals

    def _take_slot(self, transport: asyncio.Transport | None) -> HttpResponse | None:
        """Take an admission slot and tell the read gate; or the answer to the refusal."""
        server = self._server
        assert server.admission is not None
        try:
            server.admission.acquire()
        except Exception as exc:
            return server.refusal(exc)
        if server.read_gate is not None and transport is not None:
            server.read_gate.begin_serving(transport)
        return None

    def _release(self, transport: asyncio.Transport | None) -> None:
        server = self._server
        assert server.admission is not None
        server.admission.release()
        if server.read_gate is not None and transport is not None:
            server.read_gate.end_serving(transport)

    def _refuse_too_large(self, size: int) -> None:
        """413 and close: the rest of the body is never read, so nothing after it can be either."""
        limit = self._server.max_body_bytes
        response = error_response(
            f"request body too large: {size} bytes, the limit is {limit} (raise it with --http-max-input-size)",
            413,
            close=True,
        )
        self._give_up(response)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        timeout_s = self._server.body_timeout_s
        response = error_response(
            f"the request body did not all arrive within {timeout_s:g} s (--http-body-timeout-secs)", 408, close=True
        )
        self._give_up(response)

    def _bad_http(self, exc: Exception) -> None:
        self._give_up(error_response(f"malformed HTTP request: {exc}", 400, close=True))

    def _give_up(self, response: HttpResponse) -> None:
        """Answer `response` after the requests already read, and read nothing more."""
        self._cancel_body_timer()
        if self._admitted:
            self._release(self._transport)
            self._admitted = False
        self._in_body = False
        self._gave_up = True
        transport = self._transport
        if transport is None:
            return
        transport.pause_reading()
        self._paused = True
        self._closing = True
        if self._task is None and not self._queue:
            self._answer(response, keep_alive=False)
        else:
            self._queue.append((response, False, False))

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- shutdown

    def close_when_idle(self) -> None:
        self._closing = True
        if self._task is None and not self._queue and not self._in_body and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _fields(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers by lower-case name; a repeated header's values joined with ', '."""
    fields: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return fields


def _content_length(fields: dict[str, str]) -> int | None:
    """The declared body size; None without one, or for a repeated one (the body's own size is
    checked as it comes)."""
    try:
        return int(fields["content-length"])
    except (KeyError, ValueError):
        return None


_STATUS_LINES: dict[int, str] = {}


def _status_line(status: int) -> str:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}\r\n"
    return line
