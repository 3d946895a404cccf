"""The lean gRPC client's connection: one HTTP/2 connection to a server (`v2kit.h2.connection`
in the client's role), the unary calls on it (`Call`), and how each call ends. The theory of
operation is `perfkit.wire.grpc.channel`'s, which opens these connections for its `Channel`.

What a server may make a call or the connection cost (`perfkit.wire.limits`):
- A reply's message is read as it comes, bounded by its own 5-byte prefix: a prefix announcing
  more than `max_message` fails the call with RESOURCE_EXHAUSTED at once (grpc-core's behaviour past
  its max receive message size), and DATA past what the prefix announced fails it as malformed.
  Either way the stream is reset and nothing more of it is kept. Per DATA frame this costs an
  addition and a comparison; the prefix is read once a call.
- A reply's DATA is kept as views of the reads it came in, unless the calls keep less than half
  a read past it (`v2kit.h2.frames.unpin` copies those out): a server spreading a few bytes per
  call over large reads pins no more than twice the bytes the calls count.
- A header block without end is the engine's to refuse (`v2kit.h2.rules.MAX_HEADER_BLOCK`,
  and hpack's bound on a decoded block).
- What HTTP/2 makes us answer (PING and SETTINGS ACKs) while the server reads none of it is the
  engine's to bound too (`v2kit.h2.rules.MAX_INDUCED`: the connection fails with GOAWAY
  ENHANCE_YOUR_CALM, as the server's does). Reading never stops for it: a server slow to read our
  large requests must still get its replies read, or both ends would wait on each other.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import cast
from urllib.parse import unquote

from perfkit.wire.limits import MAX_REPLY_BODY
from v2kit import grpc_status as status
from v2kit.grpc_status import MALFORMED
from v2kit.h2.connection import Connection as H2Connection
from v2kit.h2.connection import Events, Payload, Stream
from v2kit.h2.frames import CANCEL, EncodedCall, framing_problem, h2_error, unpin

__all__ = ["Call", "Connection", "failed"]

_now = time.perf_counter_ns
_PREFIX_UNREAD = 4  # a Call's `limit` until its message prefix is read: the 5th byte reads it


class Call(Stream):
    """One call's stream, and its result once `future` is done: `status` (0: OK, `MALFORMED`, else a
    gRPC status code), `details` (the server's grpc-message or what went wrong), `message` (the
    reply without its 5-byte prefix), and `sent_ns` (perf_counter_ns when its last request byte was
    handed to the transport; 0 if it never was)."""

    __slots__ = ("future", "status", "details", "message", "sent_ns", "headers", "trailers", "chunks", "size", "limit")

    def __init__(self, future: asyncio.Future[None]) -> None:
        Stream.__init__(self)  # not super(): this runs once a call, and super() costs a lookup
        self.future = future
        self.status = status.UNKNOWN
        self.details = ""
        self.message = b""
        self.sent_ns = 0
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.chunks: list[Payload] = []
        self.size = 0  # DATA bytes so far, padding removed
        self.limit = _PREFIX_UNREAD  # past it, `Connection._check_length`: its prefix, then its end


def failed(code: int, details: str) -> Call:
    """A call that ended before it could start, with status `code` and `details`."""
    call = Call(asyncio.get_running_loop().create_future())
    call.status, call.details = code, details
    return call


# --- the connection ---------------------------------------------------------------------------------


class Connection(asyncio.Protocol, Events[Call]):
    """One HTTP/2 connection to a gRPC server and the unary calls on it (see `perfkit.wire.grpc.channel`)."""

    def __init__(self, target: str, tls: bool, max_message: int = MAX_REPLY_BODY) -> None:
        """`max_message`: the largest reply message a call takes (`perfkit.wire.limits`)."""
        self.target = target
        self.max_message = max_message
        self.usable = True  # takes new calls
        self.error = ""  # why the connection failed, for calls that find it failed
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tls = tls
        self._loop = loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._room: deque[asyncio.Future[None]] = deque()  # calls waiting for a stream slot
        self._viewing: list[Call] = []  # calls given views of the read in hand (`data_received`)
        self.h2 = H2Connection[Call](self, client=True, peer=target, now=loop.time, call_at=loop.call_at)

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they have its methods.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if self._tls:
            ssl_object = transport.get_extra_info("ssl_object")
            protocol = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if protocol != "h2":
                self.usable = False
                self.error = (
                    f"{self.target} did not agree on HTTP/2 over TLS (ALPN gave {protocol!r}); "
                    "is it a gRPC server, and is --ssl-grpc-use-ssl right?"
                )
                transport.close()
                return
        self.h2.start(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.error:
            if isinstance(exc, ConnectionResetError):
                self.error = "connection reset by peer"
            else:
                self.error = f"the connection closed: {exc}" if exc else "the server closed the connection"
        self.usable = False
        self.h2.lost()
        self._wake_all()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.h2.receive(data)
        if self._viewing:  # what calls keep of this read is copied out where it would pin it whole
            unpin([call.chunks for call in dict.fromkeys(self._viewing)], data)
            self._viewing.clear()

    # -- sending

    def takes_calls(self) -> bool:
        """Usable, and not closing: a transport may close before `connection_lost` says so."""
        return self.usable and not self.h2.draining and not self.h2.closed()

    def has_room(self) -> bool:
        return self.h2.can_open()

    def room(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._room.append(waiter)
        return waiter

    def start(self, encoded: EncodedCall, call: Call, deadline: float) -> None:
        """Send `call`'s HEADERS and as much of its DATA as the windows allow; it fails with
        DEADLINE_EXCEEDED unless it ends by `deadline` (loop time)."""
        h2 = self.h2
        stream_id = h2.open_stream(call, deadline)
        body = encoded.body
        if h2.reserve_final(call, len(body), encoded.largest_frame):
            sid = stream_id.to_bytes(4, "big")
            h2.write(b"".join((encoded.headers_head, sid, encoded.block_data_head, sid, body)))
            call.sent_ns = _now()
        else:
            h2.send_headers(stream_id, encoded.block)
            h2.send_data(call, body, end_stream=True)

    def cancel(self, call: Call) -> None:
        """Give up on `call` (its caller was cancelled): RST_STREAM, and forget it."""
        if self.h2.reset_stream(call, CANCEL):
            self._wake(1)

    # -- the HTTP/2 connection's events

    def headers_received(self, stream: Call, headers: dict[str, str], end_stream: bool) -> None:
        if stream.headers is None:
            stream.headers = headers
            if end_stream:  # trailers-only
                stream.trailers = headers
        else:
            stream.trailers = headers

    def stream_data(self, stream: Call, data: Payload) -> None:
        if type(data) is memoryview:
            self._viewing.append(stream)
        stream.chunks.append(data)
        stream.size += len(data)
        if stream.size > stream.limit:  # the prefix is in: once a call; then only a reply past its message
            self._check_length(stream)

    def _check_length(self, call: Call) -> None:
        """Read `call`'s message prefix, and refuse a message over `max_message` or DATA past its end."""
        if call.limit == _PREFIX_UNREAD:
            chunks = call.chunks
            head = chunks[0] if len(chunks[0]) >= 5 else b"".join(chunks)
            declared = int.from_bytes(head[1:5], "big")
            call.limit = 5 + declared
            if declared > self.max_message:
                self._refuse(
                    call,
                    status.RESOURCE_EXHAUSTED,
                    f"received message larger than max ({declared} vs. {self.max_message})",
                )
                return
        if call.size > call.limit:
            self._refuse(
                call, MALFORMED, f"the reply's DATA runs past the {call.limit - 5}-byte message its prefix announced"
            )

    def _refuse(self, call: Call, code: int, details: str) -> None:
        call.chunks = []
        self.h2.reset_stream(call, CANCEL)
        self._settle(call, code, details)

    def stream_ended(self, stream: Call) -> None:
        self._finish(stream)

    def stream_reset(self, stream: Call, code: int | None) -> None:
        if code is None:
            self._settle(stream, status.UNAVAILABLE, self.error)
        else:
            details = f"the server reset the stream ({h2_error(code)})"
            self._settle(stream, status.RESET_STATUS.get(code, status.INTERNAL), details)

    def drained(self, stream: Call) -> None:
        stream.sent_ns = _now()

    def settings_changed(self) -> None:
        self._wake_all()

    def goaway_received(self, last_stream_id: int, code: int, debug: bytes) -> None:
        text = debug.decode("utf-8", "replace")
        self.usable = False
        self.error = f"the server closed the connection (GOAWAY {h2_error(code)}{': ' + text if text else ''})"
        self._wake_all()

    def connection_failed(self, reason: str) -> None:
        self.usable = False
        self.error = reason
        self._wake_all()

    def deadline_passed(self, stream: Call) -> None:
        self.h2.reset_stream(stream, CANCEL)
        self._settle(stream, status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- ending calls

    def _finish(self, call: Call) -> None:
        """The stream ended: settle the call from its headers, trailers and message."""
        self.h2.close_stream(call)  # answered before it was all sent: stop sending
        trailers = call.trailers
        headers = call.headers
        grpc_status = trailers.get("grpc-status") if trailers is not None else None
        if grpc_status == "0" and headers is not None and headers.get(":status") == "200":
            chunks = call.chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if len(body) >= 5 and body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5:
                call.message = bytes(body[5:])
                self._settle(call, status.OK, "")
            else:
                self._settle(call, MALFORMED, framing_problem(body))
        elif grpc_status is not None and trailers is not None:
            code = int(grpc_status) if grpc_status.isdigit() else status.UNKNOWN
            self._settle(call, code, unquote(trailers.get("grpc-message", ""), errors="replace"))
        else:
            http = headers.get(":status", "") if headers is not None else ""
            if http != "200":
                code = status.HTTP_STATUS.get(http, status.UNKNOWN)
                self._settle(call, code, f"the server answered HTTP status {http or 'none'}")
            else:
                self._settle(call, status.UNKNOWN, "the server ended the call without a grpc-status")

    def _settle(self, call: Call, code: int, details: str) -> None:
        """`call` has left the connection: its result, and its slot to a call waiting for one."""
        if self._room:
            self._wake(1)
        call.status, call.details = code, details
        if not call.future.done():
            # None, not the call: a future holding its own call would make a reference cycle a
            # call, left for the garbage collector.
            call.future.set_result(None)

    def _wake(self, count: int) -> None:
        while count and self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def _wake_all(self) -> None:
        self._wake(len(self._room))

    def abort(self) -> None:
        """Drop the connection without a goodbye (a server that will not close it)."""
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self.usable = False
        self.error = self.error or "the channel was closed"
        if self._transport is not None:
            if self._transport.get_write_buffer_size():
                self._transport.abort()  # a stalled server would hold a graceful close until it reads
            elif self._transport.get_extra_info("sslcontext") is not None:
                # A TLS close waits for the server's close_notify, which gRPC servers do not send
                # until they time the connection out; nothing more is owed to this server.
                self._transport.abort()
            else:
                self._transport.close()
