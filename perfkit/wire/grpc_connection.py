"""The lean gRPC client's connection: one HTTP/2 connection to a server, the unary calls on it
(`Call`), their frames out and in, flow control both ways, and how each call ends. The theory of
operation is `perfkit.wire.grpc_channel`'s, which opens these connections for its `Channel`."""


from __future__ import annotations

import asyncio
import math
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import cast
from urllib.parse import unquote

from v2kit.h2 import frames as h2
from v2kit.h2.frames import (
    MALFORMED,
    BadHeaderBlock,
    EncodedCall,
    FrameReader,
    FrameTooLarge,
    HeaderDecoder,
    frame,
    framing_problem,
    h2_error,
)

__all__ = ["Call", "Connection", "failed"]

_REPLENISH = 1 << 24  # give the receive window back after this many DATA bytes
_TIMER_SLACK_S = 0.001  # a timer may fire this early (libuv counts milliseconds)
_now = time.perf_counter_ns


class Call:
    """One call's state, and its result once `future` is done: `status` (0: OK, `MALFORMED`, else a
    gRPC status code), `details` (the server's grpc-message or what went wrong), `message` (the
    reply without its 5-byte prefix), and `sent_ns` (perf_counter_ns when its last request byte was
    handed to the transport; 0 if it never was)."""

    __slots__ = (
        "future", "status", "details", "message", "sent_ns", "stream_id", "headers", "trailers", "chunks",
        "received", "window", "pending", "deadline",
    )  # fmt: skip

    def __init__(self, future: asyncio.Future[Call]) -> None:
        self.future = future
        self.status = h2.UNKNOWN
        self.details = ""
        self.message = b""
        self.sent_ns = 0
        self.stream_id = 0
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.chunks: list[bytes | bytearray | memoryview] = []
        self.received = 0
        self.window = 0
        self.pending: memoryview | None = None  # the part of the body the windows have not let out yet
        self.deadline = 0.0  # loop.time() by which it must end


def failed(status: int, details: str) -> Call:
    """A call that ended before it could start, with `status` and `details`."""
    call = Call(asyncio.get_running_loop().create_future())
    call.status, call.details = status, details
    return call


# --- the connection --------------------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to a gRPC server and the unary calls on it (see `perfkit.wire.grpc_channel`)."""

    def __init__(self, target: str, tls: bool) -> None:
        self.target = target
        self.usable = True  # takes new calls
        self.error = ""  # why the connection failed, for calls that find it failed
        self.next_stream_id = 1
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tls = tls
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, Call] = {}
        self._blocked: deque[Call] = deque()
        self._room: deque[asyncio.Future[None]] = deque()  # calls waiting for a stream slot
        self._frames = FrameReader()
        self._headers = HeaderDecoder()
        self._continuation: tuple[int, int, bytearray] | None = None
        self._got_settings = False
        self._max_frame = h2.DEFAULT_FRAME
        self._initial_window = h2.DEFAULT_WINDOW
        self._max_streams = h2.LAST_STREAM_ID
        self._send_window = h2.DEFAULT_WINDOW
        self._unacked = 0  # DATA bytes received since the last connection WINDOW_UPDATE
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they have its methods.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        if self._tls:
            ssl_object = transport.get_extra_info("ssl_object")
            protocol = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
            if protocol != "h2":
                self._fail_connection(
                    h2.UNAVAILABLE, f"{self.target} did not agree on HTTP/2 over TLS (ALPN gave {protocol!r}); "
                    "is it a gRPC server, and is --ssl-grpc-use-ssl right?", goaway=None,
                )  # fmt: skip
                return
        settings = struct.pack(">HLHL", h2.ENABLE_PUSH, 0, h2.INITIAL_WINDOW_SIZE, h2.MAX_WINDOW)
        transport.write(
            h2.PREFACE
            + frame(h2.SETTINGS, 0, 0, settings)
            + frame(h2.WINDOW_UPDATE, 0, 0, (h2.MAX_WINDOW - h2.DEFAULT_WINDOW).to_bytes(4, "big"))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.error:
            if isinstance(exc, ConnectionResetError):
                self.error = "connection reset by peer"
            else:
                self.error = f"the connection closed: {exc}" if exc else "the server closed the connection"
        self.usable = False
        self._fail_streams(list(self._streams.values()), h2.UNAVAILABLE, self.error)
        self._wake_all()
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            for ftype, flags, stream_id, payload in self._frames.feed(data):
                self._on_frame(ftype, flags, stream_id, payload)
                if self._transport is None or self._transport.is_closing():
                    return
        except FrameTooLarge as exc:
            reason = str(exc) if self._got_settings else "it is not HTTP/2"
            self._fail_connection(h2.UNAVAILABLE, f"cannot parse the reply from {self.target}: {reason}")

    # -- sending

    def takes_calls(self) -> bool:
        """Usable, and not closing: a transport may close before `connection_lost` says so."""
        return self.usable and self._transport is not None and not self._transport.is_closing()

    def has_room(self) -> bool:
        return len(self._streams) < self._max_streams

    def room(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._room.append(waiter)
        return waiter

    def start(self, encoded: EncodedCall, call: Call, deadline: float) -> None:
        """Send `call`'s HEADERS and as much of its DATA as the windows allow; it fails with
        DEADLINE_EXCEEDED unless it ends by `deadline` (loop time)."""
        transport = self._transport
        assert transport is not None
        stream_id = self.next_stream_id
        self.next_stream_id = stream_id + 2
        if self.next_stream_id > h2.LAST_STREAM_ID:
            self.usable = False
        call.stream_id = stream_id
        self._streams[stream_id] = call
        sid = stream_id.to_bytes(4, "big")
        body = encoded.body
        size = len(body)
        if encoded.largest_frame <= self._max_frame and size <= self._send_window and size <= self._initial_window:
            self._send_window -= size
            transport.write(b"".join((encoded.headers_head, sid, encoded.block_data_head, sid, body)))
            call.sent_ns = _now()
        else:
            self._write_headers(stream_id, encoded.block)
            call.window = self._initial_window
            call.pending = memoryview(body)
            self._blocked.append(call)
            self._pump()
        call.deadline = deadline
        if deadline < self._timer_at:
            self._arm(deadline)

    def cancel(self, call: Call) -> None:
        """Give up on `call` (its caller was cancelled): RST_STREAM, and forget it."""
        if self._streams.pop(call.stream_id, None) is not None:
            self._drop(call)
            self._reset(call.stream_id, h2.CANCEL)

    def _write_headers(self, stream_id: int, block: bytes) -> None:
        assert self._transport is not None
        first, rest = block[: self._max_frame], block[self._max_frame :]
        frames = [frame(h2.HEADERS, 0 if rest else h2.END_HEADERS, stream_id, first)]
        while rest:
            first, rest = rest[: self._max_frame], rest[self._max_frame :]
            frames.append(frame(h2.CONTINUATION, 0 if rest else h2.END_HEADERS, stream_id, first))
        self._write(b"".join(frames))

    def _pump(self) -> None:
        """Send what the windows allow of the blocked bodies, oldest first."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # connection_lost fails the blocked calls
        while self._blocked and self._send_window > 0:
            call = self._blocked[0]
            pending = call.pending
            assert pending is not None
            size = min(len(pending), self._max_frame, self._send_window, call.window)
            if size <= 0:  # this stream's window is shut: the others wait behind it (calls are alike)
                return
            last = size == len(pending)
            transport.write(frame(h2.DATA, h2.END_STREAM if last else 0, call.stream_id, bytes(pending[:size])))
            self._send_window -= size
            call.window -= size
            if last:
                call.pending = None
                call.sent_ns = _now()
                self._blocked.popleft()
            else:
                call.pending = pending[size:]

    def _reset(self, stream_id: int, code: int) -> None:
        self._write(frame(h2.RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def _write(self, data: bytes) -> None:
        # uvloop raises on writes to a closed transport; the calls fail in connection_lost anyway.
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    # -- receiving

    def _on_frame(self, ftype: int, flags: int, stream_id: int, payload: bytes | bytearray | memoryview) -> None:
        if self._continuation is not None and ftype != h2.CONTINUATION:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} broke a header block (frame type {ftype})")
        elif ftype == h2.DATA:
            self._on_data(stream_id, flags, payload)
        elif ftype == h2.HEADERS:
            self._on_headers(stream_id, flags, payload)
        elif not self._got_settings and ftype != h2.SETTINGS:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} did not start with SETTINGS: it is not HTTP/2")
        elif ftype == h2.SETTINGS:
            if not flags & h2.ACK:
                self._on_settings(payload)
        elif ftype == h2.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif ftype == h2.PING:
            if not flags & h2.ACK:
                self._write(frame(h2.PING, h2.ACK, 0, bytes(payload)))
        elif ftype == h2.RST_STREAM:
            call = self._streams.pop(stream_id, None)
            if call is not None and len(payload) == 4:
                code = int.from_bytes(payload, "big")
                self._drop(call)
                status = h2.RESET_STATUS.get(code, h2.INTERNAL)
                self._settle(call, status, f"the server reset the stream ({h2_error(code)})")
        elif ftype == h2.GOAWAY:
            self._on_goaway(payload)
        elif ftype == h2.CONTINUATION:
            self._on_continuation(stream_id, flags, payload)
        elif ftype == h2.PUSH_PROMISE:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} pushed a stream, which we disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1, §5.5).

    def _on_data(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        size = len(payload)  # padding counts against the window too
        self._unacked += size
        if self._unacked >= _REPLENISH:
            self._window_update(0, self._unacked)
            self._unacked = 0
        call = self._streams.get(stream_id)
        if call is None:
            return  # a call we gave up on
        if flags & h2.PADDED:
            payload = payload[1 : size - payload[0]] if size and payload[0] < size else b""
        call.chunks.append(payload)
        call.received += size
        if call.received >= _REPLENISH:
            self._window_update(stream_id, call.received)
            call.received = 0
        if flags & h2.END_STREAM:
            self._finish(call)

    def _on_headers(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        start, stop = 0, len(payload)
        if flags & h2.PADDED:
            start, stop = 1, stop - (payload[0] if stop else 0)
        if flags & h2.PRIORITY:
            start += 5
        block = payload[start:stop] if start or stop != len(payload) else payload
        if flags & h2.END_HEADERS:
            self._on_block(stream_id, flags & h2.END_STREAM, block)
        else:
            self._continuation = (stream_id, flags & h2.END_STREAM, bytearray(block))

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} sent a CONTINUATION frame out of place")
            return
        self._continuation[2].extend(payload)
        if flags & h2.END_HEADERS:
            _, end_stream, block = self._continuation
            self._continuation = None
            self._on_block(stream_id, end_stream, block)

    def _on_block(self, stream_id: int, end_stream: int, block: bytes | bytearray | memoryview) -> None:
        # Decoded even for calls given up on: the server's dynamic table must stay in step.
        if not isinstance(block, bytes):
            block = bytes(block)
        try:
            headers = self._headers.decode(block)
        except BadHeaderBlock as exc:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} sent a bad header block: {exc}", h2.COMPRESSION_ERROR)
            return
        call = self._streams.get(stream_id)
        if call is None:
            return
        if call.headers is None:
            call.headers = headers
            if end_stream:  # trailers-only
                call.trailers = headers
        else:
            call.trailers = headers
        if end_stream:
            self._finish(call)

    def _on_settings(self, payload: bytes | bytearray | memoryview) -> None:
        if len(payload) % 6:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} sent a malformed SETTINGS frame", h2.FRAME_SIZE_ERROR)
            return
        self._got_settings = True
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == h2.INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    self._fail_connection(
                        h2.UNAVAILABLE, f"{self.target} set a window over 2^31-1", h2.FLOW_CONTROL_ERROR
                    )
                    return
                for call in self._blocked:
                    call.window += value - self._initial_window
                self._initial_window = value
            elif key == h2.MAX_FRAME_SIZE:
                self._max_frame = max(h2.DEFAULT_FRAME, min(value, (1 << 24) - 1))
            elif key == h2.MAX_CONCURRENT_STREAMS:
                self._max_streams = value
        self._write(frame(h2.SETTINGS, h2.ACK, 0))
        self._pump()
        self._wake(len(self._room))

    def _on_window_update(self, stream_id: int, payload: bytes | bytearray | memoryview) -> None:
        increment = int.from_bytes(payload, "big") & h2.MAX_WINDOW if len(payload) == 4 else 0
        if stream_id == 0:
            self._send_window += increment
        else:
            call = self._streams.get(stream_id)
            if call is None or call.pending is None:
                return
            call.window += increment
        if self._blocked:
            self._pump()

    def _on_goaway(self, payload: bytes | bytearray | memoryview) -> None:
        if len(payload) < 8:
            self._fail_connection(h2.UNAVAILABLE, f"{self.target} sent a malformed GOAWAY", h2.FRAME_SIZE_ERROR)
            return
        last_id, code = struct.unpack_from(">LL", payload)
        last_id &= h2.LAST_STREAM_ID
        debug = bytes(payload[8:]).decode("utf-8", "replace")
        self.usable = False
        self.error = f"the server closed the connection (GOAWAY {h2_error(code)}{': ' + debug if debug else ''})"
        self._fail_streams([c for i, c in self._streams.items() if i > last_id], h2.UNAVAILABLE, self.error)
        self._wake_all()
        if not self._streams and self._transport is not None:
            self._transport.close()

    # -- ending calls

    def _finish(self, call: Call) -> None:
        """The stream ended: settle the call from its headers, trailers and message."""
        del self._streams[call.stream_id]
        self._drop(call)
        if call.pending is not None:  # answered before it was all sent: stop sending
            self._reset(call.stream_id, h2.NO_ERROR)
        trailers = call.trailers
        headers = call.headers
        status = trailers.get("grpc-status") if trailers is not None else None
        if status == "0" and headers is not None and headers.get(":status") == "200":
            chunks = call.chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if len(body) >= 5 and body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5:
                call.message = bytes(body[5:])
                self._settle(call, h2.OK, "")
            else:
                self._settle(call, MALFORMED, framing_problem(body))
        elif status is not None and trailers is not None:
            code = int(status) if status.isdigit() else h2.UNKNOWN
            self._settle(call, code, unquote(trailers.get("grpc-message", ""), errors="replace"))
        else:
            http = headers.get(":status", "") if headers is not None else ""
            if http != "200":
                code = h2.HTTP_STATUS.get(http, h2.UNKNOWN)
                self._settle(call, code, f"the server answered HTTP status {http or 'none'}")
            else:
                self._settle(call, h2.UNKNOWN, "the server ended the call without a grpc-status")

    def _drop(self, call: Call) -> None:
        """Bookkeeping once `call` has left `_streams`."""
        if call.pending is not None:
            self._blocked.remove(call)
        if self._room:
            self._wake(1)
        if not self.usable and not self._streams and self._transport is not None:
            self._transport.close()  # drained after GOAWAY or its last stream id

    def _settle(self, call: Call, status: int, details: str) -> None:
        call.status, call.details = status, details
        if not call.future.done():
            call.future.set_result(call)

    # One timer per connection, at the earliest deadline of its calls, rather than one a call:
    # calls of one client share a timeout, so it fires about once per timeout and finds the
    # calls in flight then, while a timer a call costs a heap entry per call.

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._expire_due)
        self._timer_at = when

    def _expire_due(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time() + _TIMER_SLACK_S
        for call in [c for c in self._streams.values() if c.deadline <= now]:
            del self._streams[call.stream_id]
            self._drop(call)
            self._reset(call.stream_id, h2.CANCEL)
            self._settle(call, h2.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if self._streams:
            self._arm(min(c.deadline for c in self._streams.values()))

    def _fail_streams(self, calls: Sequence[Call], status: int, details: str) -> None:
        for call in calls:
            del self._streams[call.stream_id]
            self._drop(call)
            self._settle(call, status, details)

    def _fail_connection(self, status: int, details: str, goaway: int | None = h2.PROTOCOL_ERROR) -> None:
        self.usable = False
        self.error = details
        if self._transport is not None and not self._transport.is_closing():
            if goaway is not None:
                self._transport.write(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", 0, goaway)))
            self._transport.close()
        self._fail_streams(list(self._streams.values()), status, details)
        self._wake_all()

    def _window_update(self, stream_id: int, increment: int) -> None:
        self._write(frame(h2.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big")))

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
