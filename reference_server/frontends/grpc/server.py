"""A gRPC server on HTTP/2 of its own, on asyncio protocols: the gRPC front end's transport.

grpcio's server spent 360 us of CPU per call on the demo identity at concurrency 8, where our
HTTP/1.1 front end spends 135 on the whole request: its call objects, contexts, completion-queue
hand-offs and C-core round trips cost more than the work (bench/README.md). A unary gRPC call is
three frames each way, so the server speaks them itself, on the HTTP/2 connection the load
generator's client drives too (`v2kit.h2.connection`, here in the server's role). The servicer
(`service.InferenceServicer`) is the one grpcio would serve: each method gets its request,
deserialised leniently, and a `calls.Context` whose `abort` and `write` stand in for grpc.aio's
(grpc/doc/PROTOCOL-HTTP2.md for the mapping onto HTTP/2).

- *Calls.* The path names the method. A unary call runs, as one task, once its request has
  ended; ModelStreamInfer runs from its headers on, its requests fed to the servicer as they
  complete. A client's RST_STREAM cancels the call's task. ModelInfer, uncompressed, runs with
  no task (`_serve_now`, the servicer's `start_ModelInfer`): its request goes to the scheduler
  and the answer leaves from the callback that ends its batch, as an HTTP inference does; a
  reset answers nothing more, and cancels the request (`scheduling/cancel.py`).
- *Answers.* A unary answer leaves as HEADERS, DATA and trailers in one write where the windows
  allow; a failure before any answer as trailers only (grpc-status, and grpc-message
  percent-encoded).
- *Limits.* A message over `max_message_bytes` either way is RESOURCE_EXHAUSTED, checked on its
  5-byte prefix before it is buffered, and so is a unary request whose DATA runs past the message
  its prefix announced (at its first extra byte: nothing past it is kept) and a connection whose
  calls together hold more than one largest message (`max_held_bytes`). What a call keeps of a
  read past it is copied out unless the calls keep half the read (`frames.unpin`): the memory a
  connection pins is at most twice the bytes it counts. With a token, every
  method but the health probes wants `authorization: Bearer ...`.
- *Compression* (grpc/doc/compression.md). Messages flagged compressed under `grpc-encoding` gzip
  or deflate are inflated within `max_message_bytes` (`compression.inflate`: past it
  RESOURCE_EXHAUSTED, never the whole message in memory; a broken stream INTERNAL). A unary
  request is inflated in its call's task, in a worker thread when large, as answers are
  compressed; a stream's requests on the loop as they come. A call under any other grpc-encoding
  is UNIMPLEMENTED, and a message flagged compressed with no encoding INTERNAL, as the spec says. Every answer advertises `grpc-accept-encoding: identity,deflate,gzip`.
  A call whose request was compressed is answered in the same coding where the client's
  grpc-accept-encoding lists it (tritonclient's `compression_algorithm`), else uncompressed.
- *Deadlines.* A call with `grpc-timeout` that has not ended by then is cancelled and answered
  DEADLINE_EXCEEDED, as grpc's core does (the connection's one timer).
- *HTTP/2.* Stream windows of 4 MiB and a connection window of 16 MiB, given back as the data
  is taken: a unary request's as it comes (it is bounded as above), a ModelStreamInfer's once the
  servicer has taken every request queued, so that a client streaming faster than the model serves
  waits on its windows, then on TCP (as grpc core does); and at most `max_streams` streams a connection (past it,
  RST_STREAM REFUSED_STREAM), and the engine's other limits (`h2_limits`), both set by the
  --grpc-http2-* flags (`connection_flags.py`); whatever breaks RFC 9113 gets the RFC's answer from the engine
  (GOAWAY, or RST_STREAM for a malformed request), floods and rapid reset ENHANCE_YOUR_CALM.
  Our header blocks are literals without indexing, so they never touch the client's HPACK table.

`stop(grace_s)` sends GOAWAY, lets the calls in progress finish within the grace period, then
closes every connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from time import perf_counter_ns
from typing import Any, cast

from reference_server.core.tracing import Tracing
from reference_server.errors import InvalidArgument
from reference_server.frontends.auth import OPEN_GRPC_METHODS, Token, Unauthenticated
from reference_server.frontends.compression import CODINGS, Corrupt, TooLarge, compress_async, inflate, inflate_async
from reference_server.frontends.forwarding import HeaderForwarding, grpc_metadata
from reference_server.frontends.grpc.calls import Abort, Call, Context, deserialize, method_table, wake
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.grpc.wire import (
    _ACCEPTED,
    _CODED_HEADERS,
    _OK_TRAILERS,
    _RESPONSE_HEADERS,
    _prefixed,
    _timeout_s,
    _trailers,
    _trailers_only,
)
from reference_server.frontends.listener import Listener
from reference_server.frontends.restricted import Restrictions
from reference_server.scheduling.cancel import CancelScope
from v2kit import grpc_status as status
from v2kit.grpc_status import code_of
from v2kit.h2.connection import Connection as H2Connection
from v2kit.h2.connection import Events, Payload
from v2kit.h2.frames import DATA, END_HEADERS, END_STREAM, HEADERS, NO_ERROR, frame, unpin
from v2kit.h2.rules import DEFAULT_H2_LIMITS, H2Limits

__all__ = ["MAX_STREAMS", "GrpcServer"]

log = logging.getLogger(__name__)

# hpack logs every header it decodes at DEBUG, `authorization` values included: never that.
logging.getLogger("hpack").setLevel(logging.INFO)

#: Streams a client may have open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS), by
#: default (--grpc-http2-max-concurrent-streams).
MAX_STREAMS = 1024

_READABLE = frozenset(("identity", *CODINGS))
_INFER_METHODS = frozenset(("ModelInfer", "ModelStreamInfer"))


class GrpcServer(Listener):
    """Serves `servicer` over gRPC on one listening socket; see the module's docstring."""

    def __init__(
        self, servicer: InferenceServicer, *, max_message_bytes: int, token: Token | None = None,
        header_forward: HeaderForwarding | None = None, reply_coding: Callable[[list[str]], str | None] | None = None,
        restricted: Restrictions | None = None, max_streams: int = MAX_STREAMS,
        h2_limits: H2Limits = DEFAULT_H2_LIMITS,
    ) -> None:  # fmt: skip
        super().__init__()
        self.max_streams = max_streams  # --grpc-http2-max-concurrent-streams
        self.h2_limits = h2_limits  # the other --grpc-http2-* limits
        self.restricted = restricted  # --grpc-restricted-protocol
        self.header_forward = header_forward  # an inference call's metadata into its request's parameters
        self.reply_coding = reply_coding  # an inference answer's coding, from those the client accepts
        self.max_message_bytes = max_message_bytes
        #: Request bytes the calls of one connection may hold together: one largest message.
        self.max_held_bytes = max_message_bytes + 5
        self.token = token
        #: The trace settings (the plane's, set by the builder): while active, each unary call's
        #: read is timed for its trace (`Tracing.received`).
        self.tracing = Tracing()
        self.methods = method_table(servicer)

    def connection(self) -> asyncio.Protocol:
        return _GrpcConnection(self)


class _GrpcConnection(asyncio.Protocol, Events[Call]):
    """One client's connection: `v2kit.h2.connection` in the server's role, and the calls on it."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._tracing = server.tracing  # one attribute to check per call, while tracing is off
        self.loop = loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffered = 0  # request bytes held for the calls on this connection, all together
        self.viewing: list[Call] = []  # calls given views of the read in hand (`data_received`)
        self.h2 = H2Connection[Call](
            self, client=False, peer="the client", now=loop.time, call_at=loop.call_at,
            max_peer_streams=server.max_streams, limits=server.h2_limits,
        )  # fmt: skip

    # -- asyncio.Protocol, and the listener's Connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._server.connections.add(self)
        # uvloop's transports are not asyncio.Transport subclasses, but they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        self.h2.start(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self.transport = None
        self.h2.lost()

    def data_received(self, data: bytes) -> None:
        self.h2.receive(data)
        if self.viewing:  # what calls keep of this read is copied out where it would pin it whole
            unpin([call.chunks for call in dict.fromkeys(self.viewing)], data)
            self.viewing.clear()

    def close_when_idle(self) -> None:
        self.h2.close_when_idle()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- the HTTP/2 connection's events

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> Call | None:
        path = headers.get(":path", "")
        server = self._server
        method = server.methods.get(path)
        refusal = None
        if headers.get(":method") != "POST" or not headers.get("content-type", "").startswith("application/grpc"):
            refusal = (status.UNIMPLEMENTED, "not a gRPC call (POST application/grpc)")
        elif method is None:
            refusal = (status.UNIMPLEMENTED, f"Method not found: {path}")
        elif (encoding := headers.get("grpc-encoding", "identity")) not in _READABLE:
            refusal = (
                status.UNIMPLEMENTED,
                f"Compression algorithm '{encoding}' is not supported; accepted: {_ACCEPTED}",
            )
        elif server.token is not None and path not in OPEN_GRPC_METHODS:
            try:
                server.token.check(headers.get("authorization"))
            except Unauthenticated as exc:
                refusal = (status.UNAUTHENTICATED, exc.message)
        if refusal is None and server.restricted is not None and method is not None:
            refused = server.restricted.refusal(method.name, headers)
            if refused is not None:
                refusal = (status.UNAVAILABLE, refused)
        forwarded = None
        if refusal is None and server.header_forward and method is not None and method.name in _INFER_METHODS:
            try:
                forwarded = server.header_forward.select(grpc_metadata(headers))
            except InvalidArgument as exc:
                refusal = (status.INVALID_ARGUMENT, exc.message)
        if refusal is not None:
            code, details = refusal
            self.h2.send_headers(stream_id, _trailers_only(code, details), end_stream=True)
            if not end_stream:
                self.h2.send_reset(stream_id, NO_ERROR)  # we read no more of it
            return None
        assert method is not None
        coding = "" if encoding == "identity" else encoding
        # Answer in the request's coding where the client accepts it (as grpc-go servers do), else an
        # inference in the coding --grpc-infer-response-compression-level picks; most calls read neither.
        reply = None
        if coding or server.reply_coding is not None:
            offered = [c.strip() for c in headers.get("grpc-accept-encoding", "").split(",")]
            reply = coding if coding and coding in offered else None
            if reply is None and server.reply_coding is not None and method.name in _INFER_METHODS:
                reply = server.reply_coding(offered)
        call = Call(method, coding, reply)
        if self._tracing.active:
            call.read_began = perf_counter_ns()
        call.forwarded = forwarded or None
        timeout_s = _timeout_s(headers.get("grpc-timeout"))
        if timeout_s is not None:
            self.h2.set_deadline(call, self.loop.time() + timeout_s)
        if method.streaming:
            call.requests = asyncio.Queue()
            call.deferred = True  # its DATA is given back as the servicer takes its requests
            call.metadata = tuple((k, v) for k, v in headers.items() if not k.startswith(":"))
            self._start(call, self._serve_stream(call))
        return call

    def stream_data(self, stream: Call, data: Payload) -> None:
        if type(data) is memoryview:
            self.viewing.append(stream)
        stream.chunks.append(data)
        size = len(data)
        stream.size += size
        self.buffered += size
        if stream.size >= stream.need:
            self._take_messages(stream)
        elif self.buffered > self._server.max_held_bytes:
            self._over_held(stream)
        if stream.held and stream.requests is not None and stream.requests.empty():
            self.h2.consumed(stream)  # nothing waits for the servicer: the client may send on

    def stream_ended(self, stream: Call) -> None:
        if stream.requests is not None:
            if stream.size:
                self._fail_call(stream, status.INVALID_ARGUMENT, "the stream ended inside a message")
            else:
                stream.requests.put_nowait(None)
            return
        body = stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks)
        self._release(stream)
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            self._fail_call(stream, status.INVALID_ARGUMENT, "a unary call needs exactly one request message")
            return
        if body[0] and stream.encoding:  # inflated in the call's task, off the loop when large
            self._start(stream, self._serve_compressed(stream, memoryview(body)[5:]))
            return
        message = self._message(stream, body[0], memoryview(body)[5:])
        if message is None:
            return
        if stream.method.start is not None and stream.reply_coding is None:
            tracing = self._tracing
            if not tracing.active:
                self._serve_now(stream, deserialize(stream, message))
                return
            # Its read's times go with it to the data plane, for its trace.
            tracing.received = (getattr(stream, "read_began", 0) or perf_counter_ns(), perf_counter_ns())
            try:
                self._serve_now(stream, deserialize(stream, message))
            finally:
                tracing.received = None
        else:
            self._start(stream, self._serve_unary(stream, deserialize(stream, message)))

    def stream_reset(self, stream: Call, code: int | None) -> None:
        self._release(stream)
        wake(stream)
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.cancel is not None:
            stream.cancel.cancel()

    def drained(self, stream: Call) -> None:
        wake(stream)

    def goaway_received(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.h2.close_when_idle()

    def deadline_passed(self, stream: Call) -> None:
        self._fail_call(stream, status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- requests in

    def _take_messages(self, call: Call) -> None:
        """Look at each message's 5-byte prefix as soon as it is in; a streaming call's complete
        messages go to its queue. A message too large or compressed fails the call, and so does
        a unary request that runs past the one message its prefix announced."""
        if call.requests is None and call.need > 5:
            # Its prefix is in and said how long it is: more is refused at once, not kept (grpc core).
            self._fail_call(call, status.RESOURCE_EXHAUSTED, "the request runs past its message's announced length")
            return
        buffer = call.chunks[0] if len(call.chunks) == 1 else b"".join(call.chunks)
        pos, end = 0, len(buffer)
        limit = self._server.max_message_bytes
        while end - pos >= 5:
            length = int.from_bytes(buffer[pos + 1 : pos + 5], "big")
            if length > limit:
                details = f"Received message larger than max ({length} vs. {limit})"
                self._fail_call(call, status.RESOURCE_EXHAUSTED, details)
                return
            if call.requests is None:
                # Unary: the request is taken whole once the client's side ends; until then its
                # chunks are only kept, never joined again, and one byte past it fails the call.
                call.chunks = [buffer]
                call.need = 6 + length
                if end - pos > 5 + length:
                    self._fail_call(
                        call, status.RESOURCE_EXHAUSTED, "the request runs past its message's announced length"
                    )
                elif self.buffered > self._server.max_held_bytes:
                    self._over_held(call)
                return
            if end - pos - 5 < length:
                call.need = 5 + length
                break
            # Still held until the servicer takes it: a client that streams faster than the
            # servicer serves meets the connection's bound, not the machine's memory. An inflated
            # message counts at its inflated size.
            message = self._message(call, buffer[pos], buffer[pos + 5 : pos + 5 + length])
            if message is None:
                return
            held = 5 + len(message)
            call.requests.put_nowait((deserialize(call, message), held))
            call.queued += held
            self.buffered += held - 5 - length
            pos += 5 + length
        else:
            call.need = 5
        rest = buffer[pos:]
        call.chunks = [rest] if rest else []
        call.size = len(rest)  # and `buffered` as it was: what left `chunks` is in `requests` now
        if self.buffered > self._server.max_held_bytes:
            self._over_held(call)

    def _message(self, call: Call, flag: int, payload: Payload) -> Payload | None:
        """A request message's bytes, inflated when flagged compressed; None when that fails the call."""
        if not flag:
            return payload
        if not call.encoding:
            self._fail_call(
                call, status.INTERNAL, "a message has its Compressed-Flag set, but grpc-encoding is identity"
            )
            return None
        try:
            return inflate(payload, call.encoding, self._server.max_message_bytes)
        except (TooLarge, Corrupt) as exc:
            self._fail_call(call, *self._inflate_failure(call, exc))
        return None

    def _inflate_failure(self, call: Call, exc: TooLarge | Corrupt) -> tuple[int, str]:
        if isinstance(exc, TooLarge):
            limit = self._server.max_message_bytes
            details = f"Received message larger than max (over {limit} once decompressed with {call.encoding})"
            return status.RESOURCE_EXHAUSTED, details
        return status.INTERNAL, f"Unexpected error decompressing data with {call.encoding}: {exc}"

    async def _requests(self, call: Call) -> AsyncIterator[Any]:
        queue = call.requests
        assert queue is not None
        while (item := await queue.get()) is not None:
            request, size = item
            if call.queued >= size:  # else `_release` has dropped it from the count already
                call.queued -= size
                self.buffered -= size
            if queue.empty():
                self.h2.consumed(call)  # the servicer has caught up: the client may send on
            yield request

    # -- running calls

    def _start(self, call: Call, coroutine: Coroutine[Any, Any, None]) -> None:
        server = self._server
        server.busy(+1)
        call.task = self.loop.create_task(coroutine)
        call.task.add_done_callback(lambda _: server.busy(-1))

    def _serve_now(self, call: Call, request: Any) -> None:
        """A unary call whose method has a form without a task (ModelInfer): its answer is
        encoded and written from the callback that ends its batch, with no task and no loop pass
        of its own. A reset or a deadline answers the call at once as ever; a reset also cancels
        the request (`scheduling.cancel`), and its answer is dropped."""
        server = self._server
        server.busy(+1)
        answered = False

        def done(result: Any) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            call.cancel = None  # nothing left to cancel, nor to hold on to
            server.busy(-1)
            if isinstance(result, tuple):
                code, details = result
                self._finish(call, code_of(code), details)
                return
            data = result.SerializeToString()
            if self.h2.streams.get(call.id) is call and self._sendable(call, len(data)):
                self._answer(call, _prefixed(data))

        assert call.method.start is not None
        try:
            with CancelScope() as call.cancel:
                call.method.start(request, done)
        except Exception as exc:  # the servicer maps every error it knows; this one is a bug
            if not answered:
                answered = True
                server.busy(-1)
                self._crashed(call, exc)

    async def _serve_unary(self, call: Call, request: Any) -> None:
        try:
            response = await call.method.handler(request, Context(self, call))
        except Abort as exc:
            self._finish(call, exc.code, exc.details)
            return
        except Exception as exc:  # the servicer maps every error it knows; this one is a bug
            self._crashed(call, exc)
            return
        data = response.SerializeToString()
        if self.h2.streams.get(call.id) is not call or not self._sendable(call, len(data)):
            return
        if call.reply_coding is not None:
            data = await compress_async(data, call.reply_coding)
            if self.h2.streams.get(call.id) is not call:
                return  # reset while it was compressed
        self._answer(call, _prefixed(data, call.reply_coding is not None))

    async def _serve_compressed(self, call: Call, payload: memoryview) -> None:
        try:
            message = await inflate_async(payload, call.encoding, self._server.max_message_bytes)
        except (TooLarge, Corrupt) as exc:
            self._finish(call, *self._inflate_failure(call, exc))
            return
        await self._serve_unary(call, deserialize(call, message))

    async def _serve_stream(self, call: Call) -> None:
        try:
            await call.method.handler(self._requests(call), Context(self, call))
        except Abort as exc:
            self._finish(call, exc.code, exc.details)
            return
        except Exception as exc:
            self._crashed(call, exc)
            return
        finally:
            self._release(call)  # requests the servicer left unread
        self._finish(call, 0, "")

    def _crashed(self, call: Call, exc: Exception) -> None:
        log.exception("internal error serving gRPC %s", call.method.name, exc_info=exc)
        self._finish(call, status.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    async def send_message(self, call: Call, data: bytes) -> None:
        """A streaming call's reply message; returns once the windows have let it out."""
        if not self._sendable(call, len(data)):
            raise Abort(status.RESOURCE_EXHAUSTED, "reply too large")
        if call.reply_coding is not None:
            data = await compress_async(data, call.reply_coding)
        if self.h2.streams.get(call.id) is not call:
            raise Abort(status.CANCELLED, "the client reset the stream")
        if not call.headers_sent:
            call.headers_sent = True
            self.h2.send_headers(call.id, _headers(call))
        self.h2.send_data(call, _prefixed(data, call.reply_coding is not None))
        if call.pending:
            if call.drained is None or call.drained.done():
                call.drained = self.loop.create_future()
            await call.drained

    def _sendable(self, call: Call, size: int) -> bool:
        limit = self._server.max_message_bytes
        if size > limit:
            self._finish(call, status.RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {limit})")
            return False
        return True

    # -- ends

    def _finish(self, call: Call, code: int, details: str) -> None:
        """End `call` with `code`: trailers after what it still has to send, or trailers only."""
        if self.h2.streams.get(call.id) is call:
            self.h2.send_trailers(
                call, _trailers(code, details) if call.headers_sent else _trailers_only(code, details)
            )

    def _answer(self, call: Call, data: bytes) -> None:
        """A unary call's answer: headers, data and trailers, in one write when the windows allow."""
        h2 = self.h2
        size = len(data)
        if h2.reserve_final(call, size, size):
            sid = call.id
            h2.write(
                b"".join((
                    frame(HEADERS, END_HEADERS, sid, _headers(call)),
                    frame(DATA, 0, sid, data),
                    frame(HEADERS, END_HEADERS | END_STREAM, sid, _OK_TRAILERS),
                ))
            )  # fmt: skip
            h2.close_stream(call)
            return
        call.headers_sent = True
        h2.send_headers(call.id, _headers(call))
        h2.send_data(call, data)
        h2.send_trailers(call, _OK_TRAILERS)

    def _fail_call(self, call: Call, code: int, details: str) -> None:
        """A call that cannot go on: the client told why, then its task (or its request) cancelled.
        Told first, so that the request's own answer to being cancelled (CANCELLED) finds the call
        finished instead of standing in for `code`."""
        self._release(call)
        self._finish(call, code, details)
        if call.task is not None and not call.task.done():
            call.task.cancel()
        if call.cancel is not None:
            call.cancel.cancel()

    def _over_held(self, call: Call) -> None:
        limit = self._server.max_held_bytes
        self._fail_call(call, status.RESOURCE_EXHAUSTED, f"the calls on this connection hold over {limit} bytes")

    def _release(self, call: Call) -> None:
        """Drop what `call` holds of its request (its requests queued included, from the count)."""
        self.buffered -= call.size + call.queued
        call.chunks = []
        call.size = 0
        call.queued = 0


def _headers(call: Call) -> bytes:
    return _RESPONSE_HEADERS if call.reply_coding is None else _CODED_HEADERS[call.reply_coding]
