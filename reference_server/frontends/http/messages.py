"""What the HTTP/1.1 front end reads and writes, apart from its connections: a parsed request, an
answer, the signatures of what serves and admits them, and the pure functions on a request's head
(its fields, its target's form, its declared length) and on an answer's status line.

A server's handler is a `Responder`: it is given the request and a `Reply`, which it calls once,
on the loop, with the answer, now or from a callback of its own (the scheduler's, when a batch is
done), so that a request needs no task and no loop pass of its own. A coroutine handler is run in
a task and replies when it ends (`reply_when_done`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol, cast

import httptools

from v2kit import codec as v2

__all__ = [
    "LAST_CHUNK",
    "Admission",
    "Handler",
    "HttpRequest",
    "HttpResponse",
    "NeedsSlot",
    "Exchange",
    "Refusal",
    "Reply",
    "Responder",
    "chunk",
    "encode_head",
    "error_response",
    "in_task",
    "reply_through",
    "internal_error",
    "reply_when_done",
]

log = logging.getLogger(__name__)

_JSON = "application/json"


class HttpRequest:
    """One parsed request. `path` is as sent (percent-encoded, without the query); header names
    are lower case, and a repeated header's values are joined with ', '; `raw_headers` are the
    lines as they came (header forwarding passes on the names as sent, as Triton does). Only while
    tracing is active, `received` holds when its body began and ended to be read (unset otherwise)."""

    __slots__ = ("method", "path", "headers", "body", "raw_headers", "received")
    received: tuple[int, int]

    def __init__(
        self, method: str, path: str, headers: dict[str, str], body: bytes,
        raw_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:  # fmt: skip
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.raw_headers = raw_headers or []


class HttpResponse:
    """An answer: `body` with a Content-Length, or with `stream` the chunks it yields, each sent
    as it comes in chunked transfer coding (a client that goes away closes the stream)."""

    __slots__ = ("status", "body", "content_type", "headers", "close", "stream")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        close: bool = False,
        stream: AsyncGenerator[bytes, None] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers
        self.close = close  # answer with Connection: close, then close
        self.stream = stream


def encode_head(response: HttpResponse, close: bool) -> bytes:
    """The status line and headers of `response`, with `Connection: close` when `close`."""
    framing = (
        "Transfer-Encoding: chunked\r\n" if response.stream is not None else f"Content-Length: {len(response.body)}\r\n"
    )
    head = [status_line(response.status), framing]
    if response.content_type is not None:
        head.append(f"Content-Type: {response.content_type}\r\n")
    for name, value in response.headers:
        head.append(f"{name}: {value}\r\n")
    if close:
        head.append("Connection: close\r\n")
    head.append("\r\n")
    return "".join(head).encode("latin-1")


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of chunked transfer coding (RFC 9112 §7.1); never empty, which would end it."""
    return b"%x\r\n%b\r\n" % (len(data), data)


#: The chunk that ends a chunked body (no trailers).
LAST_CHUNK = b"0\r\n\r\n"


def error_response(message: str, status: int, *, close: bool = False) -> HttpResponse:
    return HttpResponse(status, v2.error_body(message), _JSON, close=close)


class Admission(Protocol):
    """The in-flight limit: `acquire` takes a slot or raises the error to answer with."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
#: Sends a request's answer; called once, on the loop.
Reply = Callable[[HttpResponse], None]


class Responder(Protocol):
    """A handler that answers through a `Reply` rather than by returning."""

    def respond(self, request: HttpRequest, reply: Reply) -> None:
        """Answer `request` by calling `reply` once, now or later, on the loop. An exception raised
        here, before `reply` is called, is a bug: the server logs it and answers 500."""
        ...


def reply_through(handler: Responder | Handler) -> Callable[[HttpRequest, Reply], None]:
    """How to serve a request with `handler`: its `respond`, or a coroutine handler run in a task.
    (Not `isinstance(handler, Responder)`: a compiled module cannot make a runtime-checkable
    protocol, docs/compiled.md.)"""
    respond: Callable[[HttpRequest, Reply], None] | None = getattr(handler, "respond", None)
    return respond if respond is not None else partial(in_task, cast(Handler, handler))


class Exchange:
    """One request with its handler, and what its connection needs back with the answer. It is
    the request's `Reply`: called once (a second call is a bug), it hands the answer to `answered`."""

    __slots__ = ("answered", "request", "admitted", "keep_alive", "transport", "sent")

    def __init__(
        self,
        answered: Callable[[Exchange, HttpResponse], None],
        request: HttpRequest,
        admitted: bool,
        keep_alive: bool,
        transport: asyncio.Transport | None,
    ) -> None:
        self.answered = answered
        self.request = request
        self.admitted = admitted  # holds an admission slot
        self.keep_alive = keep_alive
        self.transport = transport  # the connection's when the request was read (None: gone already)
        self.sent = False

    def __call__(self, response: HttpResponse) -> None:
        if self.sent:
            raise RuntimeError(f"{self.request.method} {self.request.path} was answered twice")
        self.sent = True
        self.answered(self, response)


def in_task(handler: Handler, request: HttpRequest, reply: Reply) -> None:
    """Serve a coroutine handler as a `Responder` would: in a task, replying when it ends."""
    reply_when_done(
        _answer_of(handler, request), reply, partial(internal_error, what=f"{request.method} {request.path}")
    )


async def _answer_of(handler: Handler, request: HttpRequest) -> HttpResponse:
    return await handler(request)


def internal_error(exc: BaseException, what: str) -> HttpResponse:
    """The 500 for an error no handler maps (a bug), logged with its traceback."""
    log.error("internal error serving %s", what, exc_info=exc)
    return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


def reply_when_done(
    answer: Coroutine[Any, Any, HttpResponse], reply: Reply, failure: Callable[[Exception], HttpResponse]
) -> None:
    """Run `answer` in a task and `reply` with what it returns, or with `failure` of what it raises."""
    task = asyncio.get_running_loop().create_task(answer)
    task.add_done_callback(partial(_replied, reply, failure))


def _replied(reply: Reply, failure: Callable[[Exception], HttpResponse], task: asyncio.Task[HttpResponse]) -> None:
    if task.cancelled():  # the loop is shutting down: nobody reads the answer, but the request ends
        reply(error_response("Server is stopping: request was cancelled", 503))
        return
    error = task.exception()
    if error is None:
        reply(task.result())
    elif isinstance(error, Exception):
        reply(failure(error))
    else:
        raise error  # KeyboardInterrupt, SystemExit: not the request's business


#: Whether a request, by its method and raw path, takes an admission slot.
NeedsSlot = Callable[[bytes, bytes], bool]
#: The answer to a request whose admission raised this exception.
Refusal = Callable[[Exception], HttpResponse]


class DuplicateHost(Exception):
    """A request with more than one Host line (RFC 9112 §3.2: 400)."""


#: Header names as they came → their lower-case text: clients send the same few names with every
#: request. Bounded (at most 512 names of up to 64 bytes): others are decoded each time.
_FIELD_NAMES: dict[bytes, str] = {}
_FIELD_NAMES_MAX = 512


def parse_fields(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers by lower-case name, a repeated header's values joined with ', '. Raises
    DuplicateHost for a second Host line (an exception, so the common case pays nothing)."""
    fields: dict[str, str] = {}
    names = _FIELD_NAMES
    for name, value in headers:
        key = names.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(names) < _FIELD_NAMES_MAX and len(name) <= 64:
                names[name] = key
        text = value.decode("latin-1")
        if key in fields:
            if key == "host":
                raise DuplicateHost
            fields[key] = f"{fields[key]}, {text}"
        else:
            fields[key] = text
    return fields


def expects_continue(expect: str, parser: httptools.HttpRequestParser) -> bool:
    return expect.strip().lower() == "100-continue" and parser.get_http_version() != "1.0"


def origin_form(url: bytes) -> bytes:
    """The path and query of an absolute-form target ('http://host:port/path?q' -> '/path?q'); any
    other target that does not start with '/' as it is (no route matches it)."""
    scheme_end = url.find(b"://")
    if scheme_end < 0 or url[:scheme_end].lower() not in (b"http", b"https"):
        return url
    start = scheme_end + 3
    ends = [i for i in (url.find(b"/", start), url.find(b"?", start)) if i >= 0]
    if not ends:
        return b"/"
    rest = url[min(ends) :]
    return rest if rest[0] == 0x2F else b"/" + rest


def content_length(fields: dict[str, str]) -> int | None:
    """The declared body size; None without one, or for a repeated one (the body's own size is
    checked as it comes)."""
    try:
        return int(fields["content-length"])
    except (KeyError, ValueError):
        return None


_STATUS_LINES: dict[int, str] = {}


def status_line(status: int) -> str:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}\r\n"
    return line
