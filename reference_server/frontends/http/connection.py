"""One HTTP/1.1 client connection of `server.HttpServer`: llhttp's callbacks, its queue of requests, their answers.

Theory of operation. Each connection serves its requests one at a time, in order. A request that
completes while another is being served waits in the connection's queue (pipelining), and past
`limits.max_pipelined` of them (--http-max-pipelined-requests, default `MAX_PIPELINED`) the
connection stops being read until the queue drains. The connection
owns what every request must pass before a handler sees it:

- *Pipelining*: the queue is bounded inside a read too (`pipelined_reads.ReadFeeder`). A read
  larger than `PARSE_SLICE` is parsed a slice at a time (a body's bytes in one piece), and once
  more than `limits.max_pipelined` requests wait, the read's unparsed rest is kept, as bytes, and
  parsed when the queue has drained to half. So a client that sends a 256 KiB read of tiny requests and
  never reads its answers makes the server hold `limits.max_pipelined` requests and a slice's
  worth at most, and that read's bytes.
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
- *Head*: a request target past `limits.max_request_line` is answered 414, a header line past
  `max_header_line`, more than `max_headers` lines or a head past `max_head_bytes` 431, and a head
  not all in within `head_timeout_s` of its first byte 408, each with `Connection: close` and
  nothing more read. The bytes of a line llhttp has not finished are counted read by read, so
  memory never follows a client that streams an endless head (`limits.py`).
- *Idle*: a connection with nothing in progress for `limits.idle_timeout_s` is closed without an
  answer (RFC 9112 §9.5). One timer per connection looks every half timeout, so a request costs
  no timer and no clock read: it closes between one and one and a half timeouts after its last
  answer. Connections whose reading the server paused are not idle.
- *Write back-pressure*: while the transport holds more than `limits.write_high_water` bytes of
  answers the connection is neither read nor served, until its client has taken them down to
  `write_low_water`; one that takes nothing for `idle_timeout_s` is aborted.
- *RFC 9112*: HEAD is answered as GET without the body; a missing Host (HTTP/1.1), a repeated
  Host, or Transfer-Encoding on an HTTP/1.0 request is 400 and close; an absolute-form target is
  served as its path; HTTP/1.0 clients get no `100 Continue`.
- *Bad HTTP*: bytes llhttp refuses get a KServe error JSON, 400, and `Connection: close`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import perf_counter_ns
from typing import TYPE_CHECKING, cast

import httptools

from reference_server.frontends.http import limits as limits_
from reference_server.frontends.http import messages, streaming
from reference_server.frontends.http.messages import HttpRequest, HttpResponse, error_response
from reference_server.frontends.http.pipelined_reads import ReadFeeder
from reference_server.scheduling.cancel import CancelScope

if TYPE_CHECKING:
    from reference_server.frontends.http.server import HttpServer

# The server module's name, as before the connection had a module of its own: log filters keep working.
log = logging.getLogger("reference_server.frontends.http.server")

#: Requests a connection may have waiting behind the one being served before it is no longer read,
#: by default (--http-max-pipelined-requests: `limits.max_pipelined`).
MAX_PIPELINED = limits_.DEFAULT_LIMITS.max_pipelined

#: How long a refused connection is read and its bytes dropped before it is closed.
LINGER_S = 2.0

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LARGE_BODY = 1 << 16  # from here on the head and the body go out in two writes, not one copy


class _Refused(Exception):
    """Raised from a parser callback to stop llhttp once the request has been refused."""


class HttpConnection(asyncio.Protocol):
    """One client connection: parser callbacks, the queue of its requests, and their answers."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._tracing = server.tracing
        self._body_began = 0  # when the head was complete (perf_counter_ns), while tracing is active
        limits = self._limits = server.limits
        self._max_request_line = limits.max_request_line  # read per request: one attribute, not two
        self._max_header_line = limits.max_header_line
        self._max_headers = limits.max_headers
        self._max_pipelined = limits.max_pipelined
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[tuple[HttpRequest | HttpResponse, bool, bool]] = deque()
        self._serving = False  # a request is with the handler, or its answer is being streamed
        self._task: asyncio.Task[None] | None = None  # a streamed answer being written
        self._cancel = CancelScope()  # what the request with the handler queued (cancelled if the client leaves)
        self._paused = False
        self._closing = False  # close once the requests read so far are answered
        self._body_timer: asyncio.TimerHandle | None = None
        self._gave_up = False  # answered a request it could not read: nothing more is parsed
        self._reads = ReadFeeder(self)  # the reads fed to the parser, and a read's rest kept while the queue is full
        self._meter = limits_.HeadMeter(limits)  # a head that spans reads (rare), reset when it is complete
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # idle since, seen by the idle timer; None: a request since
        self._write_paused = False  # the transport's buffer is over its high-water mark
        self._streaming = False  # a streamed answer is being written
        self._drained: asyncio.Future[None] | None = None  # a streamed answer waits for the client
        self._write_paused_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self._in_head = False  # a head has begun and is not complete
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._fields: dict[str, str] = {}  # the headers by lower-case name, once all are in
        self._body: list[bytes] = []
        self._size = 0
        self._length: int | None = None  # the body's declared Content-Length
        self._in_body = False
        self._admitted = False
        self._refused: HttpResponse | None = None

    # -- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no asyncio.Transport subclass, but has its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._server.connections.add(self)
        limits = self._limits
        self._transport.set_write_buffer_limits(high=limits.write_high_water, low=limits.write_low_water)
        loop = self._loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        self._idle_timer = loop.call_later(limits.idle_timeout_s / 2, self._idle_check)
        if self._server.read_gate is not None:
            self._server.read_gate.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        transport, self._transport = self._transport, None
        self._server.connections.discard(self)
        self._cancel_body_timer()
        self._cancel_head_timer()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._admitted:  # its body never came: the slot and the gate's count go back
            self._release(transport)
            self._admitted = False
        self._reads.unparsed = None
        if self._server.read_gate is not None and transport is not None:
            self._server.read_gate.connection_lost(transport)
        # A request being served is cancelled, as Triton cancels it: queued, it leaves the queue;
        # running, its model sees `is_cancelled()`. Its answer has nowhere to go; a streamed one
        # stops. Those behind it never started.
        if self._serving:
            self._cancel.cancel()
        if self._streaming and self._task is not None:
            self._task.cancel()
        for _item, admitted, _ in self._queue:
            if admitted:
                self._release(transport)
        self._queue.clear()

    def data_received(self, data: bytes) -> None:
        if not self._gave_up:
            self._reads.received(data)

    def _head_unfinished(self, size: int) -> None:
        """A head spans reads (one that does not is checked by on_headers_complete): after each,
        measure it (`limits.HeadMeter`); time it."""
        if self._gave_up:  # a request before this one in the read was refused: nothing more is served
            return
        refusal = self._meter.after_read(self._headers, self._url, size)
        if refusal is not None:
            self._give_up(refusal)
            return
        if self._head_timer is None and self._loop is not None:
            self._head_timer = self._loop.call_later(self._limits.head_timeout_s, self._head_timed_out)

    def eof_received(self) -> bool | None:
        self._closing = True
        if self._serving:
            # The client sends nothing more (a closed connection reads as this first): the request
            # being served is cancelled as if the connection were lost, and answered if it can be.
            self._cancel.cancel()
        if (not self._serving and not self._queue and self._reads.unparsed is None) or self._streaming:
            return False  # nothing to answer, or a stream with no one left to read it: close now
        return True  # keep the transport open to write the answers

    # -- llhttp callbacks

    def on_message_begin(self) -> None:
        self._reset()
        self._in_head = True
        self._idle_since = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._max_request_line and not self._gave_up:
            self._give_up(limits_.refusal(self._limits, "target"))
            raise _Refused  # stop llhttp: nothing after the refusal is parsed

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._cancel_head_timer()
        if self._gave_up:
            return
        server = self._server
        self._in_body = True
        if self._tracing.active:
            self._body_began = perf_counter_ns()
        # A head that came in one read no larger than the line limit can be over no limit but the
        # count: most heads are checked with two comparisons, not a look at every line.
        meter = self._meter
        if meter.spanned or self._reads.read_size > self._max_header_line or len(self._headers) > self._max_headers:
            refusal = meter.complete(self._headers, self._url)
            if refusal is not None:
                self._give_up(refusal)
                return
        # RFC 9112 §3.2: one Host, and on HTTP/1.1 at least one; §6.1: Transfer-Encoding on an
        # HTTP/1.0 request cannot be trusted to frame it, so the connection cannot go on.
        try:
            fields = self._fields = messages.parse_fields(self._headers)
        except messages.DuplicateHost:
            self._give_up(error_response("bad request: more than one Host header (RFC 9112 §3.2)", 400, close=True))
            return
        if "host" not in fields and self._parser.get_http_version() != "1.0":
            message = "bad request: no Host header in an HTTP/1.1 request (RFC 9112 §3.2)"
            self._give_up(error_response(message, 400, close=True))
            return
        if "transfer-encoding" in fields and self._parser.get_http_version() == "1.0":
            message = "bad request: Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)"
            self._give_up(error_response(message, 400, close=True))
            return
        length = self._length = messages.content_length(fields)
        if length is not None and length > server.max_body_bytes:
            self._refuse_too_large(length)
            return
        idle = not self._serving and not self._queue
        needs_slot = server.needs_slot
        if idle and needs_slot is not None and needs_slot(self._parser.get_method(), self._url):
            self._refused = self._take_slot(self._transport)
            self._admitted = self._refused is None
        # RFC 9110 §10.1.1: an HTTP/1.0 client's expectation is ignored; it sends its body anyway.
        if "expect" in fields and messages.expects_continue(fields["expect"], self._parser):
            if self._refused is not None:
                self._give_up(self._refused)  # the client waits for a go-ahead that will not come
            elif idle:
                assert self._transport is not None
                self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)  # a refused body's too: reads are sliced by what is left of it
        if self._refused is not None or self._gave_up:
            return  # answered without it: read and dropped
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
            if url[0] != 0x2F:  # not '/': absolute-form (RFC 9112 §3.2.2) is served as its path
                url = messages.origin_form(url)
            query = url.find(b"?")
            path = (url if query < 0 else url[:query]).decode("latin-1")
            item = HttpRequest(parser.get_method().decode("latin-1"), path, self._fields, body, self._headers)
            if self._body_began:
                item.received = (self._body_began, perf_counter_ns())
                self._body_began = 0
        admitted, self._admitted = self._admitted, False
        self._queue.append((item, admitted, keep_alive))
        if not self._serving and len(self._queue) == 1:
            self._next()
        elif len(self._queue) > self._max_pipelined and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    # -- serving

    def _next(self) -> None:
        """Start on the oldest request waiting, if any, none is being served and answers can go out."""
        if self._serving or self._write_paused or not self._queue or self._transport is None:
            return
        item, admitted, keep_alive = self._queue.popleft()
        if isinstance(item, HttpResponse):
            self._answer(item, keep_alive)
            return
        server = self._server
        server.busy(+1)
        self._serving = True
        transport = self._transport
        if not admitted and server.needs_slot is not None:
            if server.needs_slot(item.method.encode("latin-1"), item.path.encode("latin-1")):
                refusal = self._take_slot(transport)
                if refusal is not None:
                    self._served(item, refusal, keep_alive)
                    return
                admitted = True
        exchange = messages.Exchange(self._replied, item, admitted, keep_alive, transport)
        tracing = self._tracing
        traced = tracing.active
        if traced:  # its read's times go with it to the data plane, for its trace
            tracing.received = getattr(item, "received", None)
        try:
            with self._cancel:
                server.respond(item, exchange)
        except Exception as exc:  # the handler maps every error it knows; this one is a bug
            if exchange.sent:
                log.exception("internal error serving %s %s, after its answer", item.method, item.path)
            else:
                exchange(messages.internal_error(exc, f"{item.method} {item.path}"))
        finally:
            if traced:
                tracing.received = None

    def _replied(self, exchange: messages.Exchange, response: HttpResponse) -> None:
        """The handler's answer: the request's slot goes back, then the answer is written or streamed."""
        request, keep_alive = exchange.request, exchange.keep_alive
        self._cancel.release()
        if exchange.admitted:
            self._release(exchange.transport)
        if response.stream is None:
            self._served(request, response, keep_alive)
            return
        response.close = self._closes(response, keep_alive)  # as its head says
        self._task = asyncio.get_running_loop().create_task(self._stream(request, response, keep_alive))

    async def _stream(self, request: HttpRequest, response: HttpResponse, keep_alive: bool) -> None:
        # Set here, not when the task is made: a task cancelled before it starts would never close
        # the stream. A client gone before this sees no transport, which only closes the stream.
        self._streaming = True  # from here the client's leaving cancels it (connection_lost)
        try:
            await streaming.send_stream(self._transport, response, response.close, self._writable)
        finally:
            self._task, self._streaming = None, False
            self._served(request, response, keep_alive)  # writes nothing more once the stream is out

    def _served(self, request: HttpRequest, response: HttpResponse, keep_alive: bool) -> None:
        """`request` is done with: log it and write its answer (a streamed one's is out already)."""
        server = self._server
        self._serving = False
        server.busy(-1)
        if server.access_log is not None:
            server.access_log.info("%s %s %d", request.method, request.path, response.status)
        self._answer(response, keep_alive, request.method == "HEAD")

    async def _writable(self) -> None:
        """Return once the client has taken the answers down to the low-water mark (or is gone)."""
        while self._write_paused and self._transport is not None and self._loop is not None:
            self._drained = self._loop.create_future()
            await self._drained

    def _closes(self, response: HttpResponse, keep_alive: bool) -> bool:
        # Closing for another reason (EOF, a refusal queued behind) waits until the last answer.
        return response.close or not keep_alive or (self._closing and not self._queue and self._reads.unparsed is None)

    def _answer(self, response: HttpResponse, keep_alive: bool, head_only: bool = False) -> None:
        """Write `response` (a streamed one is out already); for a HEAD request (`head_only`) its
        head alone, Content-Length and all."""
        transport = self._transport
        if transport is None or transport.is_closing():  # closed by the server's stop (abort)
            return
        close = self._closes(response, keep_alive)
        body = response.body
        encoded = b"" if response.stream is not None else messages.encode_head(response, close)
        if head_only or len(body) >= _LARGE_BODY:
            transport.write(encoded)  # a streamed answer's is out already (streaming.send_stream)
        if not head_only:
            transport.write(encoded + body if len(body) < _LARGE_BODY else body)
        if close:
            self._queue.clear()
            self._reads.unparsed = None
            linger, self._gave_up = self._gave_up, True  # llhttp may be mid-read: nothing more is served
            if linger and transport.can_write_eof():
                self._linger(transport)
            else:
                transport.close()
            return
        if self._paused and len(self._queue) <= self._max_pipelined // 2:
            if self._reads.unparsed is not None:  # a read's rest was kept: it goes before anything read after it
                if self._loop is not None:
                    self._reads.parse_rest_soon(self._loop)  # from the loop, as _next below
            elif not self._closing:
                self._paused = False
                if not self._write_paused:
                    transport.resume_reading()
        if self._queue and self._loop is not None:
            # Not from here: this answer may come from inside the scheduler, which must not be
            # entered again (a pipelined request got a loop pass of its own before, too).
            self._loop.call_soon(self._next)  # or resume_writing, if the client is slow to read
        elif self._in_body and self._body_timer is None:
            self._arm_body_timer()  # a request's body was coming in while this one was served: from now

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close after a refusal without losing it: closing a socket with unread bytes makes the
        kernel reset the connection, and a client still sending (the rest of a body or a head)
        may lose the answer with it. So end the writing side, read and drop what comes for up to
        `LINGER_S`, then close (RFC 9112 §9.6; nginx's lingering close)."""
        transport.write_eof()
        self._paused = False
        transport.resume_reading()  # data_received drops everything once the request is refused
        if self._loop is not None:
            self._loop.call_later(LINGER_S, transport.abort)

    # -- write back-pressure and the idle timer

    def pause_writing(self) -> None:
        """The transport holds more answers than its high-water mark: read and serve nothing more."""
        self._write_paused = True
        if self._loop is not None:
            self._write_paused_at = self._loop.time()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        transport = self._transport
        if transport is None:
            return
        if not self._paused:  # else paused for a reason of its own (pipelining, a refusal)
            transport.resume_reading()
        if self._queue:
            self._next()

    def _idle_check(self) -> None:
        """The idle timer, every half `idle_timeout_s`: close a connection seen idle, with no
        request begun, for `idle_timeout_s` (so between that and half as long again after its
        last answer); abort one whose client has taken none of its answers for as long. A request
        only clears `_idle_since` (on_message_begin): no clock is read per request."""
        self._idle_timer = None
        transport, loop = self._transport, self._loop
        if transport is None or loop is None:
            return
        now = loop.time()
        timeout_s = self._limits.idle_timeout_s
        if self._write_paused:
            if now - self._write_paused_at >= timeout_s:
                transport.abort()  # close() would wait for the client to read what it never will
                return
        elif (
            self._serving
            or self._queue
            or self._in_head
            or self._in_body
            or self._reads.unparsed is not None
            or (not transport.is_reading() and not self._gave_up)  # paused by the server: requests wait unread
        ):
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now  # idle since the last look at the latest
        elif now - self._idle_since >= timeout_s:
            self._closing = True
            transport.close()
            return
        self._idle_timer = loop.call_later(timeout_s / 2, self._idle_check)

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
        self._give_up(limits_.too_large(size, self._server.max_body_bytes))

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport, loop = self._transport, self._loop
        if transport is None or loop is None or self._gave_up:
            return
        timeout_s = self._limits.head_timeout_s
        if not transport.is_reading():  # the server stopped reading it, not the client sending
            self._head_timer = loop.call_later(timeout_s, self._head_timed_out)
            return
        message = f"the request head did not all arrive within {timeout_s:g} s (--http-head-timeout-secs)"
        self._give_up(error_response(message, 408, close=True))

    def _body_timed_out(self) -> None:
        self._body_timer = None
        self._give_up(limits_.body_timeout(self._server.body_timeout_s))

    def _give_up(self, response: HttpResponse) -> None:
        """Answer `response` after the requests already read, and read nothing more."""
        self._cancel_body_timer()
        self._cancel_head_timer()
        self._in_head = False
        if self._admitted:
            self._release(self._transport)
            self._admitted = False
        self._in_body = False
        self._gave_up = True
        self._reads.unparsed = None
        transport = self._transport
        if transport is None:
            return
        transport.pause_reading()
        self._paused = True
        self._closing = True
        if not self._serving and not self._queue:
            self._answer(response, keep_alive=False)
        else:
            self._queue.append((response, False, False))

    def _arm_body_timer(self) -> None:
        """Time the body that a read ended in the middle of (`on_message_complete` cancels it)."""
        loop = asyncio.get_running_loop()
        self._body_timer = loop.call_later(self._server.body_timeout_s, self._body_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- shutdown

    def close_when_idle(self) -> None:
        self._closing = True
        idle = not self._serving and not self._queue and not self._in_body and self._reads.unparsed is None
        if idle and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.close()
