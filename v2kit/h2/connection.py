"""One HTTP/2 connection's state (RFC 9113), sans-I/O and blind to its role: the lean gRPC client
(`perfkit.wire.grpc_connection`) and the server's gRPC front end (`reference_server.frontends.grpc.server`)
both drive one. The driver feeds it what arrived (`receive`) and asks it to send (`open_stream`,
`send_headers`, `send_data`, `send_trailers`, `reset_stream`); it writes frames to a `Sink` (a
transport, or a test's buffer) and tells the driver what happened through `Events`. A client opens
streams and reads the answers; a server reads the streams the peer opens (`Events.stream_opened`)
and answers them. `client` only says who sends the preface and which stream ids are whose.

What it owns, once for both ends:
- Frames in: one dispatch (`_on_frame`), CONTINUATION assembly, HPACK decoding (`HeaderDecoder`),
  PING answered, SETTINGS followed and acknowledged, RST_STREAM, GOAWAY, PUSH_PROMISE refused.
  A rule the peer breaks ends the connection in one place (`fail`: GOAWAY with its code, and a
  reason the driver can show), so a new validation rule is one more check before a `fail`.
- Flow control both ways. We advertise stream windows of 2 GiB - 1 and raise the connection window
  to match at once, giving the window back in 16 MiB batches, so a peer never waits for us. We send
  nothing larger than the peer's frame size or windows allow: data the windows cannot take yet
  waits, in order, until WINDOW_UPDATEs come, and trailers (or END_STREAM) follow their data.
- Streams: ids, bookkeeping, the peer's stream limit and ours (refused past it, or once going away),
  draining after GOAWAY (close once the last stream is gone).
- Deadlines: one timer per connection (on the driver's clock), at its streams' earliest deadline:
  streams of one peer mostly share a timeout, so it fires about once per timeout, where a timer a
  stream would cost a heap entry per stream.

Both ends are hot paths: frames are views of what arrived, nothing is allocated per frame, and the
events are plain method calls.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Callable
from typing import Generic

from v2kit.h2 import frames as h2
from v2kit.h2 import rules
from v2kit.h2.events import Cancellable, Events, Payload, S, Sink, Stream
from v2kit.h2.frames import BadHeaderBlock, FrameReader, FrameTooLarge, HeaderDecoder, frame

__all__ = ["Connection", "Events", "Payload", "Sink", "Stream"]

REPLENISH = 1 << 24  # give the receive window back after this many DATA bytes
MAX_HEADER_BLOCK = 1 << 20  # a longer header block (HEADERS and CONTINUATIONs) ends the connection
TIMER_SLACK_S = 0.001  # a timer may fire this early (libuv counts milliseconds)


class Connection(Generic[S]):
    """One HTTP/2 connection, either end of it; see the module's docstring."""

    def __init__(
        self,
        events: Events[S],
        *,
        client: bool,
        peer: str,
        now: Callable[[], float],
        call_at: Callable[[float, Callable[[], None]], Cancellable],
        max_peer_streams: int = 0,
    ) -> None:
        """`peer` names the other end in failure reasons; `now` and `call_at` are the driver's
        clock and timers (an event loop's `time` and `call_at`); `max_peer_streams` is how many
        streams the peer may have open (0: it may open none; not advertised)."""
        self.events = events
        self.streams: dict[int, S] = {}
        self.next_stream_id = 1 if client else 2
        self.peer_max_streams = h2.LAST_STREAM_ID  # streams the peer lets us have open
        self.draining = False  # no new streams; closes once the last one is gone
        self._client = client
        self._peer = peer
        self._now, self._call_at = now, call_at
        self._sink: Sink | None = None
        self._preface: bytes | None = None if client else b""  # the client's preface so far (server)
        self._frames = FrameReader()
        self._headers = HeaderDecoder()
        # A header block awaiting its CONTINUATIONs: stream, END_STREAM, the block so far, a stream error.
        self._continuation: tuple[int, bool, bytearray, str | None] | None = None
        self._got_settings = False
        self._max_frame = h2.DEFAULT_FRAME
        self._initial_window = h2.DEFAULT_WINDOW  # the peer's, for the streams we send on
        self._send_window = h2.DEFAULT_WINDOW
        self._blocked: deque[S] = deque()  # streams with data or trailers the windows hold back
        self._unacked = 0  # DATA bytes received since the last connection WINDOW_UPDATE
        self._max_peer_streams = max_peer_streams
        self._last_peer_stream = 0
        self._goaway_sent = False
        self._timer: Cancellable | None = None
        self._timer_at = math.inf
        self._induced = 0  # answers to the peer's frames written since our output last drained
        self._reset_ids: dict[int, None] = {}  # streams we reset lately (rules.RESET_MEMORY), oldest first
        self._reset_tokens = float(rules.RESET_BURST)  # streams the peer may still reset (rapid reset)
        self._reset_at = now()

    # -- the connection's life

    def start(self, sink: Sink) -> None:
        """Begin on `sink`: our preface (client), SETTINGS and the connection window."""
        self._sink = sink
        settings = struct.pack(">HL", h2.ENABLE_PUSH, 0)
        if self._max_peer_streams:
            settings += struct.pack(">HL", h2.MAX_CONCURRENT_STREAMS, self._max_peer_streams)
        settings += struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, h2.MAX_WINDOW)
        sink.write(
            (h2.PREFACE if self._client else b"")
            + frame(h2.SETTINGS, 0, 0, settings)
            + frame(h2.WINDOW_UPDATE, 0, 0, (h2.MAX_WINDOW - h2.DEFAULT_WINDOW).to_bytes(4, "big"))
        )

    def lost(self) -> None:
        """The transport is gone: every stream is reset (`Events.stream_reset` with None)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._blocked.clear()
        self._reset_all(list(self.streams.values()))

    def close_when_idle(self) -> None:
        """Take no new streams (GOAWAY); close once those in progress have ended."""
        if self._goaway_sent:
            return
        self.draining = True
        self._goaway(h2.NO_ERROR)
        self._close_if_idle()

    def fail(self, code: int, reason: str) -> None:
        """End the connection: GOAWAY with `code`, close, and reset every stream."""
        sink = self._sink
        if sink is not None and not sink.is_closing():
            self._goaway(code)
            sink.close()
        self.events.connection_failed(reason)
        self._reset_all(list(self.streams.values()))

    def closed(self) -> bool:
        return self._sink is None or self._sink.is_closing()

    # -- frames in

    def receive(self, data: bytes) -> None:
        """Take what arrived; the events follow, in order, before it returns."""
        if self._preface is not None:
            data = self._after_preface(data)
            if not data:
                return
        sink = self._sink
        if sink is None:
            return
        try:
            for ftype, flags, stream_id, payload in self._frames.feed(data):
                self._on_frame(ftype, flags, stream_id, payload)
                if sink.is_closing():
                    return
        except FrameTooLarge as exc:
            # Before SETTINGS, an oversized "frame" is most likely not HTTP/2 at all.
            reason = str(exc) if self._got_settings else "it is not HTTP/2"
            code = h2.FRAME_SIZE_ERROR if self._got_settings else h2.PROTOCOL_ERROR
            self.fail(code, f"cannot parse the reply from {self._peer}: {reason}")

    def _after_preface(self, data: bytes) -> bytes:
        """What follows the client's connection preface in `data` (b"" until it is all in)."""
        assert self._preface is not None
        size = len(h2.PREFACE)
        seen = self._preface + data
        if seen[: min(len(seen), size)] != h2.PREFACE[: min(len(seen), size)]:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} did not start with the HTTP/2 preface: it is not HTTP/2")
            return b""
        if len(seen) < size:
            self._preface = seen
            return b""
        self._preface = None
        return seen[size:]

    def _on_frame(self, ftype: int, flags: int, stream_id: int, payload: Payload) -> None:
        if self._continuation is not None and ftype != h2.CONTINUATION:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} broke a header block (frame type {ftype})")
        elif ftype == h2.DATA:
            self._on_data(stream_id, flags, payload)
        elif ftype == h2.HEADERS:
            self._on_headers(stream_id, flags, payload)
        elif not self._got_settings and ftype != h2.SETTINGS:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} did not start with SETTINGS: it is not HTTP/2")
        elif ftype > h2.CONTINUATION:
            return  # unknown frame types are ignored (RFC 9113 §5.5)
        elif (problem := rules.control_problem(ftype, flags, stream_id, payload)) is not None:
            self.fail(problem[0], f"{self._peer} sent {problem[1]}")
        elif ftype == h2.SETTINGS:
            if not flags & h2.ACK:
                self._on_settings(payload)
        elif ftype == h2.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif ftype == h2.PING:
            if not flags & h2.ACK:
                self._answer(frame(h2.PING, h2.ACK, 0, bytes(payload)))
        elif ftype == h2.RST_STREAM:
            self._on_reset(stream_id, payload)
        elif ftype == h2.GOAWAY:
            self._on_goaway(payload)
        elif ftype == h2.CONTINUATION:
            self._on_continuation(stream_id, flags, payload)
        elif ftype == h2.PUSH_PROMISE:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} pushed a stream, which we disabled")
        elif ftype == h2.PRIORITY_FRAME:
            self._on_priority(stream_id, payload)

    def _on_data(self, stream_id: int, flags: int, payload: Payload) -> None:
        size = len(payload)  # padding counts against the window too
        self._unacked += size
        if self._unacked >= REPLENISH:
            self._window_update(0, self._unacked)
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            self._stray_data(stream_id, stream)
            return
        if flags & h2.PADDED:
            if not size or payload[0] >= size:
                self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent DATA padded beyond its length")
                return
            payload = payload[1 : size - payload[0]]
        stream.received += size
        if stream.received >= REPLENISH:
            self._window_update(stream_id, stream.received)
            stream.received = 0
        if stream.length_left >= 0:  # content-length announced: DATA must not run past it
            stream.length_left -= len(payload)
            if stream.length_left < 0 or (flags & h2.END_STREAM and stream.length_left):
                self._stream_error(stream, h2.PROTOCOL_ERROR, "DATA that disagrees with its content-length")
                return
        if payload:
            self.events.stream_data(stream, payload)
        if flags & h2.END_STREAM and self.streams.get(stream_id) is stream:
            stream.remote_ended = True
            self.events.stream_ended(stream)

    def _stray_data(self, stream_id: int, stream: S | None) -> None:
        """DATA on a stream that takes none (RFC 9113 §5.1, §6.1)."""
        if stream is not None:  # half-closed (remote)
            self._stream_error(stream, h2.STREAM_CLOSED, "DATA after the end of its stream")
        elif stream_id == 0 or self._idle(stream_id):
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent DATA on stream {stream_id}, which is not open")
        elif stream_id not in self._reset_ids:  # ignored after our RST_STREAM: it may have been in flight
            self._answer(frame(h2.RST_STREAM, 0, stream_id, h2.STREAM_CLOSED.to_bytes(4, "big")))
            self._remember_reset(stream_id)

    def _idle(self, stream_id: int) -> bool:
        """Whether `stream_id` has never been opened, by either end (RFC 9113 §5.1)."""
        if stream_id % 2 == self.next_stream_id % 2:
            return stream_id >= self.next_stream_id
        return stream_id > self._last_peer_stream

    def _on_headers(self, stream_id: int, flags: int, payload: Payload) -> None:
        if not stream_id:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent HEADERS on stream 0")
            return
        start, stop = 0, len(payload)
        if flags & h2.PADDED:
            start, stop = 1, stop - (payload[0] if stop else 1)
        problem = None
        if flags & h2.PRIORITY:
            if stop - start >= 5 and int.from_bytes(payload[start : start + 4], "big") & h2.LAST_STREAM_ID == stream_id:
                problem = "a stream that depends on itself"  # RFC 9113 §5.3.1: a stream error
            start += 5
        if start > stop:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent a malformed HEADERS frame")
            return
        block = payload[start:stop] if start or stop != len(payload) else payload
        if flags & h2.END_HEADERS:
            self._on_block(stream_id, flags & h2.END_STREAM != 0, block, problem)
        else:
            self._continuation = (stream_id, flags & h2.END_STREAM != 0, bytearray(block), problem)

    def _on_continuation(self, stream_id: int, flags: int, payload: Payload) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent a CONTINUATION frame out of place")
            return
        pending[2].extend(payload)
        if len(pending[2]) > MAX_HEADER_BLOCK:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent a header block over {MAX_HEADER_BLOCK} bytes")
            return
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._on_block(stream_id, pending[1], pending[2], pending[3])

    def _on_block(self, stream_id: int, end_stream: bool, block: Payload, problem: str | None) -> None:
        # Decoded even on streams given up on: the peer's dynamic table must stay in step.
        try:
            fields = self._headers.decode(block if isinstance(block, bytes) else bytes(block))
        except BadHeaderBlock as exc:
            self.fail(h2.COMPRESSION_ERROR, f"{self._peer} sent a bad header block: {exc}")
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            if stream.remote_ended:
                self._stream_error(stream, h2.STREAM_CLOSED, "headers after the end of its stream")
                return
            if not stream.headers_in:  # a response (we are the client)
                stream.headers_in = True
                problem = problem or fields.response
                if problem is None and (length := fields.headers.get("content-length")) is not None:
                    stream.length_left = int(length)
            elif not end_stream:
                problem = problem or "a second header block that does not end its stream"
            else:
                problem = problem or fields.trailers
                if problem is None and stream.length_left > 0:
                    problem = "a body short of its content-length"
            if problem is not None:
                self._stream_error(stream, h2.PROTOCOL_ERROR, problem)
                return
            self.events.headers_received(stream, fields.headers, end_stream)
            if end_stream and self.streams.get(stream_id) is stream:
                stream.remote_ended = True
                self.events.stream_ended(stream)
        elif stream_id % 2 == self.next_stream_id % 2:  # ours
            if stream_id >= self.next_stream_id:
                self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent headers on stream {stream_id}, which we never opened")
            # else one we have given up on: nothing more to do
        elif stream_id <= self._last_peer_stream:
            if stream_id not in self._reset_ids:
                # The last stream it opened has closed; one below it may never have been opened (§5.1.1).
                code = h2.STREAM_CLOSED if stream_id == self._last_peer_stream else h2.PROTOCOL_ERROR
                self.fail(code, f"{self._peer} sent headers on stream {stream_id}, which is closed")
        else:
            self._open_peer_stream(stream_id, fields, end_stream, problem)

    def _open_peer_stream(self, stream_id: int, fields: rules.Fields, end_stream: bool, problem: str | None) -> None:
        self._last_peer_stream = stream_id
        problem = problem or fields.request
        if problem is not None:
            self._answer(frame(h2.RST_STREAM, 0, stream_id, h2.PROTOCOL_ERROR.to_bytes(4, "big")))
            self._remember_reset(stream_id)
            return
        if self.draining or len(self.streams) >= self._max_peer_streams:
            self.send_reset(stream_id, h2.REFUSED_STREAM)
            return
        headers = fields.headers
        stream = self.events.stream_opened(stream_id, headers, end_stream)
        if stream is None:
            if not end_stream:
                self._remember_reset(stream_id)  # the driver answered and reset it
            return
        stream.id = stream_id
        stream.window = self._initial_window
        stream.headers_in = True
        self.streams[stream_id] = stream
        if (length := headers.get("content-length")) is not None:
            stream.length_left = int(length)
        if end_stream:
            if stream.length_left > 0:
                self._stream_error(stream, h2.PROTOCOL_ERROR, "a body short of its content-length")
                return
            stream.remote_ended = True
            self.events.stream_ended(stream)

    def _on_settings(self, payload: Payload) -> None:
        problem = rules.settings_problem(payload, client=self._client)
        if problem is not None:
            self.fail(problem[0], f"{self._peer} sent {problem[1]}")
            return
        self._got_settings = True
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == h2.INITIAL_WINDOW_SIZE:
                delta = value - self._initial_window
                self._initial_window = value
                for stream in self.streams.values():
                    stream.window += delta
                    if stream.window > h2.MAX_WINDOW:
                        self.fail(h2.FLOW_CONTROL_ERROR, f"{self._peer}'s SETTINGS took a window over 2^31-1")
                        return
            elif key == h2.MAX_FRAME_SIZE:
                # We never send more than the default: larger frames save nothing on a unary call.
                self._max_frame = min(value, h2.DEFAULT_FRAME) if value >= h2.DEFAULT_FRAME else h2.DEFAULT_FRAME
            elif key == h2.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self._answer(frame(h2.SETTINGS, h2.ACK, 0))
        self._pump()
        self.events.settings_changed()

    def _on_window_update(self, stream_id: int, payload: Payload) -> None:
        increment = int.from_bytes(payload, "big") & h2.MAX_WINDOW
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > h2.MAX_WINDOW:
                self.fail(h2.FLOW_CONTROL_ERROR, f"{self._peer} took the connection's window over 2^31-1")
                return
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                if self._idle(stream_id):
                    self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent WINDOW_UPDATE on idle stream {stream_id}")
                return  # closed: it may have been in flight
            if not increment:
                self._stream_error(stream, h2.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
                return
            stream.window += increment
            if stream.window > h2.MAX_WINDOW:
                self._stream_error(stream, h2.FLOW_CONTROL_ERROR, "a window over 2^31-1")
                return
        if self._blocked:
            self._pump()

    def _on_priority(self, stream_id: int, payload: Payload) -> None:
        """PRIORITY is ignored (RFC 9113 §5.3.2), but for what makes it a stream error."""
        if len(payload) != 5:
            code, problem = h2.FRAME_SIZE_ERROR, "a malformed PRIORITY frame"
        elif int.from_bytes(payload[:4], "big") & h2.LAST_STREAM_ID == stream_id:
            code, problem = h2.PROTOCOL_ERROR, "a stream that depends on itself"
        else:
            return
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._stream_error(stream, code, problem)
        else:
            self._answer(frame(h2.RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))

    def _on_reset(self, stream_id: int, payload: Payload) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            if self._idle(stream_id):
                self.fail(h2.PROTOCOL_ERROR, f"{self._peer} reset idle stream {stream_id}")
            return
        self._forget(stream)
        self.events.stream_reset(stream, int.from_bytes(payload, "big"))
        if stream_id % 2 != self.next_stream_id % 2:  # one it opened: count it (rapid reset)
            now = self._now()
            tokens = min(rules.RESET_BURST, self._reset_tokens + (now - self._reset_at) * rules.RESET_RATE_PER_S)
            self._reset_at = now
            if tokens < 1:
                self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} reset streams faster than {rules.RESET_RATE_PER_S:g}/s")
                return
            self._reset_tokens = tokens - 1

    def _on_goaway(self, payload: Payload) -> None:
        last_id, code = struct.unpack_from(">LL", payload)
        last_id &= h2.LAST_STREAM_ID
        self.draining = True
        self.events.goaway_received(last_id, code, bytes(payload[8:]))
        ours = self.next_stream_id % 2
        self._reset_all([s for i, s in self.streams.items() if i > last_id and i % 2 == ours])
        self._close_if_idle()

    # -- errors and answers

    def _stream_error(self, stream: S, code: int, problem: str) -> None:
        """The peer broke a rule on `stream` alone (RFC 9113 §5.4.2): RST_STREAM `code`, and the
        driver told (`Events.stream_reset`)."""
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
            self._forget(stream)
        self._answer(frame(h2.RST_STREAM, 0, stream.id, code.to_bytes(4, "big")))
        self._remember_reset(stream.id)
        self.events.stream_reset(stream, code)

    def _answer(self, data: bytes) -> None:
        """Write a frame the peer's own frame called for. Answers that wait behind what the peer
        has not read are counted: past `rules.MAX_INDUCED` of them the peer is flooding us without
        reading (PING, SETTINGS, stream errors; CVE-2019-9512/9515), and the connection ends with
        ENHANCE_YOUR_CALM, its unread output dropped."""
        sink = self._sink
        if sink is None or sink.is_closing():
            return
        if not sink.get_write_buffer_size():
            self._induced = 0  # all written so far has left: the peer reads
        else:
            self._induced += 1
            if self._induced > rules.MAX_INDUCED:
                self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} floods us with frames to answer and reads none")
                sink.abort()
                return
        sink.write(data)

    def _remember_reset(self, stream_id: int) -> None:
        reset_ids = self._reset_ids
        reset_ids[stream_id] = None
        if len(reset_ids) > rules.RESET_MEMORY:
            del reset_ids[next(iter(reset_ids))]

    # -- frames out

    def write(self, data: bytes) -> None:
        """Write frames encoded elsewhere (a call encoded once); nothing once closing."""
        # uvloop raises on writes to a closed transport; nobody is left to read them anyway.
        sink = self._sink
        if sink is not None and not sink.is_closing():
            sink.write(data)

    def open_stream(self, stream: S, deadline: float = math.inf) -> int:
        """Register `stream` under our next stream id, to end by `deadline` (`set_deadline`), and
        return the id; the last id drains us."""
        stream_id = self.next_stream_id
        self.next_stream_id = stream_id + 2
        if self.next_stream_id > h2.LAST_STREAM_ID:
            self.draining = True
        stream.id = stream_id
        stream.window = self._initial_window
        self.streams[stream_id] = stream
        stream.deadline = deadline
        if deadline < self._timer_at:
            self._arm(deadline)
        return stream_id

    def can_open(self) -> bool:
        """Whether the peer's stream limit has room for one more of ours."""
        return len(self.streams) < self.peer_max_streams

    def reserve_final(self, stream: S, size: int, largest_frame: int) -> bool:
        """Whether the rest of our side of `stream`, `size` DATA bytes in frames up to
        `largest_frame`, may leave at once with nothing queued before it. If so it is counted
        against the windows and our side as ended: the caller writes it, encoded, with `write`."""
        if self._blocked or largest_frame > self._max_frame or size > self._send_window or size > stream.window:
            return False
        self._send_window -= size
        stream.window -= size
        stream.local_ended = True
        return True

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        """A header block, in CONTINUATIONs if longer than the peer's frames."""
        max_frame = self._max_frame
        first, rest = block[:max_frame], block[max_frame:]
        flags = h2.END_STREAM if end_stream else 0
        frames = [frame(h2.HEADERS, flags | (0 if rest else h2.END_HEADERS), stream_id, first)]
        while rest:
            first, rest = rest[:max_frame], rest[max_frame:]
            frames.append(frame(h2.CONTINUATION, 0 if rest else h2.END_HEADERS, stream_id, first))
        self.write(b"".join(frames))

    def send_data(self, stream: S, data: bytes, *, end_stream: bool = False) -> None:
        """Queue `data` on `stream` and send what the windows allow; `Events.drained` says when it
        has all gone (at once, if the windows allow)."""
        if stream.pending is None:
            stream.pending = deque()
        stream.pending.append(memoryview(data))
        stream.end_data = end_stream
        self._pump_stream(stream)
        if stream.pending and stream not in self._blocked:
            self._blocked.append(stream)

    def send_trailers(self, stream: S, block: bytes) -> None:
        """End our side of `stream` with `block` after the data still queued on it, then close
        the stream (`close_stream`): trailers end an answer."""
        stream.end_block = block
        self._pump_stream(stream)
        if stream.end_block is not None and stream not in self._blocked:
            self._blocked.append(stream)

    def close_stream(self, stream: S) -> None:
        """Forget `stream`; a side still open is told to stop (RST_STREAM NO_ERROR, RFC 9113 §8.1)."""
        self.streams.pop(stream.id, None)
        if not (stream.local_ended and stream.remote_ended):
            self.send_reset(stream.id, h2.NO_ERROR)
            self._forget(stream)  # it may be waiting for a window
        elif self.draining:
            self._close_if_idle()

    def reset_stream(self, stream: S, code: int) -> bool:
        """Give up on `stream`, if still open (returns whether it was): forget it, RST_STREAM `code`."""
        if self.streams.get(stream.id) is not stream:
            return False
        del self.streams[stream.id]
        self._forget(stream)
        self.send_reset(stream.id, code)
        return True

    def send_reset(self, stream_id: int, code: int) -> None:
        self.write(frame(h2.RST_STREAM, 0, stream_id, code.to_bytes(4, "big")))
        self._remember_reset(stream_id)

    def _pump(self) -> None:
        """Send what the windows allow of the waiting streams, oldest first."""
        blocked = self._blocked
        for _ in range(len(blocked)):
            stream = blocked.popleft()
            self._pump_stream(stream)
            if stream.pending or stream.end_block is not None:
                blocked.append(stream)
            if self._send_window <= 0:
                break

    def _pump_stream(self, stream: S) -> None:
        if self.closed():
            return
        pending = stream.pending
        if pending:
            parts: list[bytes | memoryview] = []  # frame headers and views of the data: no copy here
            while pending:
                chunk = pending[0]
                size = min(len(chunk), self._max_frame, self._send_window, stream.window)
                if size < 0 or (size == 0 and chunk):
                    break  # a window is shut (an empty chunk, END_STREAM alone, needs none)
                whole = size == len(chunk)
                flags = h2.END_STREAM if whole and stream.end_data and len(pending) == 1 else 0
                parts.append(size.to_bytes(3, "big") + bytes((h2.DATA, flags)) + stream.id.to_bytes(4, "big"))
                if whole:
                    parts.append(chunk)
                    pending.popleft()
                else:
                    parts.append(chunk[:size])
                    pending[0] = chunk[size:]
                self._send_window -= size
                stream.window -= size
            if parts:
                assert self._sink is not None
                self._sink.writelines(parts)
            if pending:
                return
            if stream.end_data:
                stream.local_ended = True
            self.events.drained(stream)
        if stream.end_block is not None:
            block, stream.end_block = stream.end_block, None
            self.send_headers(stream.id, block, end_stream=True)
            stream.local_ended = True
            self.close_stream(stream)

    def _window_update(self, stream_id: int, increment: int) -> None:
        self.write(frame(h2.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big")))

    def _goaway(self, code: int) -> None:
        self._goaway_sent = True
        self.write(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", self._last_peer_stream, code)))

    # -- streams' ends

    def _forget(self, stream: S) -> None:
        """Bookkeeping once `stream` has left `streams`."""
        if (stream.pending or stream.end_block is not None) and stream in self._blocked:
            self._blocked.remove(stream)
        if self.draining:
            self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.draining and not self.streams and self._sink is not None:
            self._sink.close()

    def _reset_all(self, streams: list[S]) -> None:
        for stream in streams:
            del self.streams[stream.id]
            self._forget(stream)
            self.events.stream_reset(stream, None)

    # -- deadlines

    def set_deadline(self, stream: S, when: float) -> None:
        """`Events.deadline_passed` for `stream` unless it has gone by `when` (the driver's clock)."""
        stream.deadline = when
        if when < self._timer_at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._call_at(when, self._expire_due)
        self._timer_at = when

    def _expire_due(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._now() + TIMER_SLACK_S
        for stream in [s for s in self.streams.values() if s.deadline <= now]:
            stream.deadline = math.inf  # told once
            self.events.deadline_passed(stream)
        if self.streams:
            when = min(s.deadline for s in self.streams.values())
            if when < math.inf:
                self._arm(when)
