"""The HTTP/2 half of the gRPC front end: one server connection's frames, HPACK and flow control.

No gRPC here: `grpc_server` builds calls on `H2Connection`'s hooks (a stream opened with its
headers, its data, its end, its reset) and answers with `send_headers`, `send_data` and
`send_trailers` (RFC 9113 for HTTP/2, RFC 7541 for HPACK).

- The server sends its SETTINGS at once (no push; stream windows of 2 GiB - 1, `MAX_STREAMS`
  concurrent streams) and raises the connection window to match, giving the window back in 16 MiB
  batches, so a client never waits for us. It answers PING, follows the client's SETTINGS
  (initial window, frame size) and WINDOW_UPDATEs, and sends nothing larger than the client's
  frame size or windows allow: data the windows cannot take yet waits, in order, until
  WINDOW_UPDATEs come, and trailers follow their stream's data.
- HPACK decoding (`grpc_frames.HeaderDecoder`, one per connection) is cached by the block's bytes
  for blocks that leave the dynamic table as it is: a warm client sends the same few blocks over
  and over.
  Our own header blocks are literals without indexing, so they never touch the client's table.
- A broken preface, an oversized frame, a bad header block or a frame out of place ends the
  connection with GOAWAY; a stream past `MAX_STREAMS` is refused (RST_STREAM REFUSED_STREAM).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from typing import cast

from v2kit.h2 import frames as h2
from v2kit.h2.frames import BadHeaderBlock, FrameReader, FrameTooLarge, HeaderDecoder, frame

__all__ = ["MAX_STREAMS", "H2Connection", "H2Stream"]

# hpack logs every header it decodes at DEBUG, `authorization` values included: never that.
logging.getLogger("hpack").setLevel(logging.INFO)

#: Streams a client may have open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS).
MAX_STREAMS = 1024

_REPLENISH = 1 << 24  # give the receive window back after this many DATA bytes
_MAX_HEADER_BLOCK = 1 << 20  # a longer header block (HEADERS and CONTINUATIONs) ends the connection


class H2Stream:
    """A stream's flow-control state and what it still has to send."""

    __slots__ = ("id", "window", "received", "pending", "trailers", "drained", "finished", "headers_sent")

    def __init__(self, stream_id: int, window: int) -> None:
        self.id = stream_id
        self.window = window  # what the client's window lets us send on this stream
        self.received = 0  # DATA bytes since this stream's last WINDOW_UPDATE
        self.pending: deque[memoryview] = deque()  # DATA the windows have not let out yet, in order
        self.trailers: bytes | None = None  # sent, ending the stream, once `pending` is out
        self.drained: asyncio.Future[None] | None = None  # a sender waiting for `pending` to go
        self.finished = False  # the client ended its side
        self.headers_sent = False


class H2Connection(asyncio.Protocol):
    """An HTTP/2 server connection; subclasses handle the streams (the `stream_*` hooks)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self.going_away = False
        self._frames = FrameReader()
        self._preface = True  # the client's preface has not all arrived yet
        self._preface_seen = b""
        self._last_stream = 0
        self._headers = HeaderDecoder()
        self._continuation: tuple[int, int, bytearray] | None = None
        self._max_frame = h2.DEFAULT_FRAME
        self.initial_window = h2.DEFAULT_WINDOW
        self._send_window = h2.DEFAULT_WINDOW
        self._blocked: deque[H2Stream] = deque()
        self._unacked = 0

    # -- hooks for subclasses

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> None:
        """A client opened a stream; register an `H2Stream` in `streams` to take it."""
        raise NotImplementedError

    def stream_data(self, stream: H2Stream, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    def stream_finished(self, stream: H2Stream) -> None:
        """The client ended its side of `stream` (END_STREAM)."""
        raise NotImplementedError

    def stream_reset(self, stream: H2Stream) -> None:
        """The client reset `stream`, or the connection ended under it; it is forgotten already."""

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but they have its methods.
        self.transport = cast(asyncio.Transport, transport)
        settings = struct.pack(
            ">HLHLHL", h2.ENABLE_PUSH, 0, h2.MAX_CONCURRENT_STREAMS, MAX_STREAMS, h2.INITIAL_WINDOW_SIZE, h2.MAX_WINDOW
        )
        self.transport.write(
            frame(h2.SETTINGS, 0, 0, settings)
            + frame(h2.WINDOW_UPDATE, 0, 0, (h2.MAX_WINDOW - h2.DEFAULT_WINDOW).to_bytes(4, "big"))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        streams = list(self.streams.values())
        self.streams.clear()
        self._blocked.clear()
        for stream in streams:
            _wake(stream)
            self.stream_reset(stream)

    def data_received(self, data: bytes) -> None:
        if self._preface:
            data = self._after_preface(data)
            if not data:
                return
        try:
            for ftype, flags, stream_id, payload in self._frames.feed(data):
                self._on_frame(ftype, flags, stream_id, payload)
                if self.transport is None or self.transport.is_closing():
                    return
        except FrameTooLarge:
            self.fail(h2.FRAME_SIZE_ERROR)

    def _after_preface(self, data: bytes) -> bytes:
        """What follows the client's connection preface in `data` (b"" until it is all in)."""
        size = len(h2.PREFACE)
        seen = self._preface_seen + data
        if seen[: min(len(seen), size)] != h2.PREFACE[: min(len(seen), size)]:
            self.fail(h2.PROTOCOL_ERROR)
            return b""
        if len(seen) < size:
            self._preface_seen = seen
            return b""
        self._preface = False
        return seen[size:]

    # -- frames in

    def _on_frame(self, ftype: int, flags: int, stream_id: int, payload: bytes | bytearray | memoryview) -> None:
        if self._continuation is not None and ftype != h2.CONTINUATION:
            self.fail(h2.PROTOCOL_ERROR)
        elif ftype == h2.DATA:
            self._on_data(stream_id, flags, payload)
        elif ftype == h2.HEADERS:
            self._on_headers(stream_id, flags, payload)
        elif ftype == h2.CONTINUATION:
            self._on_continuation(stream_id, flags, payload)
        elif ftype == h2.SETTINGS:
            if not flags & h2.ACK:
                self._on_settings(payload)
        elif ftype == h2.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif ftype == h2.PING:
            if not flags & h2.ACK:
                self._write(frame(h2.PING, h2.ACK, 0, bytes(payload)))
        elif ftype == h2.RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._forget(stream)
                self.stream_reset(stream)
        elif ftype == h2.GOAWAY:
            self.close_when_idle()
        elif ftype == h2.PUSH_PROMISE:
            self.fail(h2.PROTOCOL_ERROR)
        # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1, §5.5).

    def _on_settings(self, payload: bytes | bytearray | memoryview) -> None:
        if len(payload) % 6:
            self.fail(h2.FRAME_SIZE_ERROR)
            return
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == h2.INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    self.fail(h2.FLOW_CONTROL_ERROR)
                    return
                delta = value - self.initial_window
                self.initial_window = value
                for stream in self.streams.values():
                    stream.window += delta
            elif key == h2.MAX_FRAME_SIZE:
                self._max_frame = max(h2.DEFAULT_FRAME, min(value, (1 << 24) - 1))
        self._write(frame(h2.SETTINGS, h2.ACK, 0))
        self._pump()

    def _on_window_update(self, stream_id: int, payload: bytes | bytearray | memoryview) -> None:
        if len(payload) != 4:
            self.fail(h2.FRAME_SIZE_ERROR)
            return
        increment = int.from_bytes(payload, "big") & h2.MAX_WINDOW
        if stream_id == 0:
            self._send_window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.window += increment
        self._pump()

    def _on_headers(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        start, stop = 0, len(payload)
        if flags & h2.PADDED:
            if not stop:
                self.fail(h2.PROTOCOL_ERROR)
                return
            start, stop = 1, stop - payload[0]
        if flags & h2.PRIORITY:
            start += 5
        if start > stop:
            self.fail(h2.PROTOCOL_ERROR)
            return
        block = payload[start:stop]
        if flags & h2.END_HEADERS:
            self._on_block(stream_id, flags & h2.END_STREAM, bytes(block))
        else:
            self._continuation = (stream_id, flags & h2.END_STREAM, bytearray(block))

    def _on_continuation(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            self.fail(h2.PROTOCOL_ERROR)
            return
        pending[2].extend(payload)
        if len(pending[2]) > _MAX_HEADER_BLOCK:
            self.fail(h2.PROTOCOL_ERROR)
            return
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._on_block(stream_id, pending[1], bytes(pending[2]))

    def _on_block(self, stream_id: int, end_stream: int, block: bytes) -> None:
        headers = self._decode(block)
        if headers is None:
            return
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: its side ends here
            if end_stream and not stream.finished:
                stream.finished = True
                self.stream_finished(stream)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            self.fail(h2.PROTOCOL_ERROR)
            return
        self._last_stream = stream_id
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self.reset(stream_id, h2.REFUSED_STREAM)
            return
        self.stream_opened(stream_id, headers, bool(end_stream))

    def _decode(self, block: bytes) -> dict[str, str] | None:
        try:
            return self._headers.decode(block)
        except BadHeaderBlock:
            self.fail(h2.COMPRESSION_ERROR)
            return None

    def _on_data(self, stream_id: int, flags: int, payload: bytes | bytearray | memoryview) -> None:
        size = len(payload)  # padding counts against the window too
        self._unacked += size
        if self._unacked >= _REPLENISH:
            self._window_update(0, self._unacked)
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.finished:
            return  # a stream answered or reset already
        if flags & h2.PADDED:
            payload = payload[1 : size - payload[0]] if size and payload[0] < size else b""
        stream.received += size
        if stream.received >= _REPLENISH:
            self._window_update(stream_id, stream.received)
            stream.received = 0
        if payload:
            self.stream_data(stream, payload)
        if flags & h2.END_STREAM and self.streams.get(stream_id) is stream:
            stream.finished = True
            self.stream_finished(stream)

    # -- frames out

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        first, rest = block[: self._max_frame], block[self._max_frame :]
        flags = h2.END_STREAM if end_stream else 0
        frames = [frame(h2.HEADERS, flags | (0 if rest else h2.END_HEADERS), stream_id, first)]
        while rest:
            first, rest = rest[: self._max_frame], rest[self._max_frame :]
            frames.append(frame(h2.CONTINUATION, 0 if rest else h2.END_HEADERS, stream_id, first))
        self._write(b"".join(frames))

    def send_answer(self, stream: H2Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        """Headers, data and trailers that end `stream`: one write when the windows allow."""
        size = len(data)
        if not self._blocked and size <= self._max_frame and size <= self._send_window and size <= stream.window:
            self._send_window -= size
            stream.window -= size
            sid = stream.id
            self._write(
                b"".join((
                    frame(h2.HEADERS, h2.END_HEADERS, sid, headers),
                    frame(h2.DATA, 0, sid, data),
                    frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, trailers),
                ))
            )  # fmt: skip
            self.close_stream(stream)
            return
        stream.headers_sent = True
        self.send_headers(stream.id, headers)
        stream.pending.append(memoryview(data))
        self.send_trailers(stream, trailers)

    def send_data(self, stream: H2Stream, data: bytes) -> None:
        """Queue `data` on `stream` and send what the windows allow; `stream.drained` is set when
        some had to wait."""
        stream.pending.append(memoryview(data))
        self._pump_stream(stream)
        if stream.pending:
            if stream.drained is None or stream.drained.done():
                stream.drained = self.loop.create_future()
            if stream not in self._blocked:
                self._blocked.append(stream)

    def send_trailers(self, stream: H2Stream, block: bytes) -> None:
        """End `stream` with `block`, after the data still waiting on it."""
        stream.trailers = block
        self._pump_stream(stream)
        if stream.trailers is not None and stream not in self._blocked:
            self._blocked.append(stream)

    def reset(self, stream_id: int, code: int) -> None:
        self._write(frame(h2.RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def close_stream(self, stream: H2Stream) -> None:
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if not stream.finished:  # the client is still sending: tell it to stop (RFC 9113 §8.1)
            self.reset(stream.id, h2.NO_ERROR)
        self._forget(stream)

    def _pump(self) -> None:
        """Send what the windows allow of the waiting streams, oldest first."""
        blocked = self._blocked
        for _ in range(len(blocked)):
            stream = blocked.popleft()
            self._pump_stream(stream)
            if stream.pending or stream.trailers is not None:
                blocked.append(stream)
            if self._send_window <= 0:
                break

    def _pump_stream(self, stream: H2Stream) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        pending = stream.pending
        parts: list[bytes | memoryview] = []  # frame headers and views of the data: no copy here
        while pending:
            chunk = pending[0]
            size = min(len(chunk), self._max_frame, self._send_window, stream.window)
            if size <= 0:
                break
            parts.append(_data_head(size, stream.id))
            if size == len(chunk):
                parts.append(chunk)
                pending.popleft()
            else:
                parts.append(chunk[:size])
                pending[0] = chunk[size:]
            self._send_window -= size
            stream.window -= size
        if parts:
            transport.writelines(parts)
        if pending:
            return
        _wake(stream)
        if stream.trailers is not None:
            trailers, stream.trailers = stream.trailers, None
            self.send_headers(stream.id, trailers, end_stream=True)
            self.close_stream(stream)

    def _window_update(self, stream_id: int, increment: int) -> None:
        self._write(frame(h2.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big")))

    def _write(self, data: bytes) -> None:
        # uvloop raises on writes to a closed transport; nobody is left to read them anyway.
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _forget(self, stream: H2Stream) -> None:
        if stream in self._blocked:
            self._blocked.remove(stream)
        _wake(stream)
        if self.going_away and not self.streams and self.transport is not None:
            self.transport.close()

    # -- the connection's end

    def close_when_idle(self) -> None:
        """Take no new streams (GOAWAY); close once those in progress have ended."""
        if self.going_away:
            return
        self.going_away = True
        self._write(frame(h2.GOAWAY, 0, 0, self._last_stream.to_bytes(4, "big") + h2.NO_ERROR.to_bytes(4, "big")))
        if not self.streams and self.transport is not None:
            self.transport.close()

    def fail(self, code: int) -> None:
        self._write(frame(h2.GOAWAY, 0, 0, self._last_stream.to_bytes(4, "big") + code.to_bytes(4, "big")))
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _data_head(size: int, stream_id: int) -> bytes:
    """A DATA frame's header (no flags): the stream ends with its trailers, not its data."""
    return size.to_bytes(3, "big") + bytes((h2.DATA, 0)) + stream_id.to_bytes(4, "big")


def _wake(stream: H2Stream) -> None:
    if stream.drained is not None and not stream.drained.done():
        stream.drained.set_result(None)
