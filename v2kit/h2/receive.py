"""Frames in, for `v2kit.h2.connection`: the half of an HTTP/2 connection that reads what the peer
sends and judges it. One dispatch (`_on_frame`), CONTINUATION assembly, HPACK decoding
(`HeaderDecoder`, which judges each distinct header block once), PING answered, SETTINGS followed
and acknowledged, RST_STREAM, GOAWAY, PUSH_PROMISE refused. A rule the peer breaks (`rules`) ends
the connection in one place (`fail`: GOAWAY with its code) or, where RFC 9113 says the stream
alone is broken, the stream (`_stream_error`: RST_STREAM). Answers the peer's frames call for go
through `_answer`, which caps those waiting unread; streams the peer resets are metered (rapid reset).
"""

from __future__ import annotations

import math
import struct
from collections import deque
from collections.abc import Callable
from typing import Generic

from mypy_extensions import mypyc_attr

from v2kit.h2 import frames as h2
from v2kit.h2 import rules
from v2kit.h2.events import Cancellable, Events, Payload, S, Sink
from v2kit.h2.fields import Fields
from v2kit.h2.frames import BadHeaderBlock, FrameReader, FrameTooLarge, HeaderDecoder, frame
from v2kit.h2.pings import TOO_MANY_PINGS, PingStrikes

__all__ = ["Receiver"]

#: The windows we advertise by default (`H2Limits.stream_window`, `connection_window`): what the peer
#: may send on a stream, and on the connection, before we give it back (WINDOW_UPDATE, once half a
#: window has been taken). A stream's DATA is taken as it comes unless its driver defers it
#: (`Stream.deferred`: then as the application takes it, so that a peer sending faster than the
#: application reads waits on the windows, and then on TCP).
STREAM_WINDOW = rules.STREAM_WINDOW
CONNECTION_WINDOW = rules.CONNECTION_WINDOW
MAX_HEADER_BLOCK = rules.MAX_HEADER_BLOCK  # a longer header block (HEADERS and CONTINUATIONs) ends the connection


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class Receiver(Generic[S]):
    """A connection's state and what it does with the frames that come; `Connection` adds the rest."""

    def __init__(
        self,
        events: Events[S],
        *,
        client: bool,
        peer: str,
        now: Callable[[], float],
        call_at: Callable[[float, Callable[[], None]], Cancellable],
        max_peer_streams: int = 0,
        limits: rules.H2Limits = rules.DEFAULT_H2_LIMITS,
    ) -> None:
        """`peer` names the other end in failure reasons; `now` and `call_at` are the driver's
        clock and timers (an event loop's `time` and `call_at`); `max_peer_streams` is how many
        streams the peer may have open (0: it may open none; not advertised); `limits` bound what
        a hostile peer may make the connection do (`rules.H2Limits`)."""
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
        self._unacked = 0  # DATA bytes received that no connection WINDOW_UPDATE has given back yet
        self._credit = 0  # of those, bytes taken, to give back in the next connection WINDOW_UPDATE
        self._max_peer_streams = max_peer_streams
        self._limits = limits
        self._stream_window = limits.stream_window
        self._connection_window = limits.connection_window
        self._last_peer_stream = 0
        self._goaway_sent = False
        self._timer: Cancellable | None = None
        self._timer_at = math.inf
        self._induced = 0  # answers to the peer's frames written since our output last drained
        self._empty = 0  # DATA and CONTINUATION frames in a row that carried nothing (limits.max_empty_frames)
        self._reset_ids: dict[int, None] = {}  # streams we reset lately (rules.RESET_MEMORY), oldest first
        self._reset_tokens = float(limits.reset_burst)  # streams the peer may still reset (rapid reset)
        self._reset_at = now()
        self._data_sent = 0  # HEADERS and DATA writes so far: ping strikes and keepalive pings count from them
        pings = limits.pings
        self._strikes = PingStrikes(pings) if pings is not None and not client else None
        self._keepalive: Cancellable | None = None  # the keepalive timer (`limits.pings`)
        self._keepalive_out: bytes | None = None  # our keepalive PING's payload, until its ACK comes
        self._keepalive_data_seen = 0  # `_data_sent` when the keepalive last looked
        self._pings_without_data = 0  # keepalive PINGs sent since HEADERS or DATA last were

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
            if self._frames.pending():  # a frame split across reads: the reader puts it together
                for ftype, flags, stream_id, payload in self._frames.feed(data):
                    self._on_frame(ftype, flags, stream_id, payload)
                    if sink.is_closing():
                        return
            else:
                self._on_whole_frames(data, sink)
        except FrameTooLarge as exc:
            # Before SETTINGS, an oversized "frame" is most likely not HTTP/2 at all.
            reason = str(exc) if self._got_settings else "it is not HTTP/2"
            code = h2.FRAME_SIZE_ERROR if self._got_settings else h2.PROTOCOL_ERROR
            self.fail(code, f"cannot parse the reply from {self._peer}: {reason}")

    def _on_whole_frames(self, data: bytes, sink: Sink) -> None:
        """`FrameReader.feed` for a read that starts a frame, inlined: each frame goes to `_on_frame`
        as it is cut, with no generator and no tuple per frame (a unary call's reply is three
        frames, and this runs for every read); the start of a frame the read does not complete
        goes to the reader."""
        pos, end = 0, len(data)
        view = memoryview(data)
        while end - pos >= 9:
            length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
            if length > h2.DEFAULT_FRAME:
                raise FrameTooLarge(length)
            stop = pos + 9 + length
            if stop > end:
                break
            stream_id = (data[pos + 5] & 0x7F) << 24 | data[pos + 6] << 16 | data[pos + 7] << 8 | data[pos + 8]
            self._on_frame(data[pos + 3], data[pos + 4], stream_id, view[pos + 9 : stop])
            if sink.is_closing():
                return
            pos = stop
        if pos < end:
            self._frames.hold(view[pos:])

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
            if flags & h2.ACK:
                if self._keepalive_out is not None and payload == self._keepalive_out:
                    self._keepalive_acked()
            elif self._strikes is not None and self._strikes.too_many(self._now(), self._data_sent, bool(self.streams)):
                self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} sent PINGs too often", TOO_MANY_PINGS)
            else:
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
        if size:
            self._empty = 0
        elif not flags & h2.END_STREAM and self._empty_frame():
            return
        self._unacked += size
        if self._unacked > self._connection_window:
            self.fail(h2.FLOW_CONTROL_ERROR, f"{self._peer} sent DATA past the connection's window")
            return
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            self._credit_connection(size)
            self._stray_data(stream_id, stream)
            return
        if flags & h2.PADDED:
            if not size or payload[0] >= size:
                self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent DATA padded beyond its length")
                return
            payload = payload[1 : size - payload[0]]
        stream.received += size
        if stream.received > self._stream_window:
            self._credit_connection(size)
            self._stream_error(stream, h2.FLOW_CONTROL_ERROR, "DATA past the stream's window")
            return
        if stream.deferred:
            stream.held += len(payload)
            if size > len(payload):
                self._credit_stream(stream, size - len(payload))  # padding: nobody takes it
        else:
            self._credit_stream(stream, size)
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

    def consumed(self, stream: S) -> None:
        """The driver took all the DATA `stream` has had (a deferred stream): the peer may send more."""
        held, stream.held = stream.held, 0
        if held:
            self._credit_stream(stream, held)

    def _credit_stream(self, stream: S, size: int) -> None:
        """`size` bytes of `stream`'s DATA were taken: given back, on the stream (while it may still
        send) and on the connection, once half a window's worth is due."""
        credit = stream.credit + size
        if credit >= self._stream_window // 2 and not stream.remote_ended and self.streams.get(stream.id) is stream:
            self._window_update(stream.id, credit)
            stream.received -= credit
            credit = 0
        stream.credit = credit
        self._credit_connection(size)

    def _credit_connection(self, size: int) -> None:
        credit = self._credit + size
        if credit >= self._connection_window // 2:
            self._window_update(0, credit)
            self._unacked -= credit
            credit = 0
        self._credit = credit

    def _empty_frame(self) -> bool:
        """Count a frame that carried nothing and ended nothing; True once there were too many in a row,
        and the connection has failed."""
        self._empty += 1
        if self._empty > self._limits.max_empty_frames:
            self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} sends empty frames without end")
            return True
        return False

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
        if stop - start > self._limits.max_header_block:  # a limit under one frame's size
            self._block_too_long()
        elif flags & h2.END_HEADERS:
            self._on_block(stream_id, flags & h2.END_STREAM != 0, block, problem)
        else:
            self._continuation = (stream_id, flags & h2.END_STREAM != 0, bytearray(block), problem)

    def _block_too_long(self) -> None:
        limit = self._limits.max_header_block
        self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent a header block over {limit} bytes")

    def _on_continuation(self, stream_id: int, flags: int, payload: Payload) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            self.fail(h2.PROTOCOL_ERROR, f"{self._peer} sent a CONTINUATION frame out of place")
            return
        if payload:
            self._empty = 0
        elif not flags & h2.END_HEADERS and self._empty_frame():
            return
        pending[2].extend(payload)
        if len(pending[2]) > self._limits.max_header_block:
            self._block_too_long()
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

    def _open_peer_stream(self, stream_id: int, fields: Fields, end_stream: bool, problem: str | None) -> None:
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
                self._max_frame = value  # within 2^14..2^24-1: `rules.settings_problem` checked it
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
            limits = self._limits
            tokens = min(limits.reset_burst, self._reset_tokens + (now - self._reset_at) * limits.reset_rate_per_s)
            self._reset_at = now
            if tokens < 1:
                self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} reset streams faster than {limits.reset_rate_per_s:g}/s")
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
        has not read are counted: past `H2Limits.max_induced` of them the peer is flooding us without
        reading (PING, SETTINGS, stream errors; CVE-2019-9512/9515), and the connection ends with
        ENHANCE_YOUR_CALM, its unread output dropped."""
        sink = self._sink
        if sink is None or sink.is_closing():
            return
        if not sink.get_write_buffer_size():
            self._induced = 0  # all written so far has left: the peer reads
        else:
            self._induced += 1
            if self._induced > self._limits.max_induced:
                self.fail(h2.ENHANCE_YOUR_CALM, f"{self._peer} floods us with frames to answer and reads none")
                sink.abort()
                return
        sink.write(data)

    def _remember_reset(self, stream_id: int) -> None:
        reset_ids = self._reset_ids
        reset_ids[stream_id] = None
        if len(reset_ids) > rules.RESET_MEMORY:
            del reset_ids[next(iter(reset_ids))]

    # -- what `Connection` provides

    def fail(self, code: int, reason: str, debug: bytes = b"") -> None:
        raise NotImplementedError

    def _keepalive_acked(self) -> None:
        raise NotImplementedError

    def send_reset(self, stream_id: int, code: int) -> None:
        raise NotImplementedError

    def _pump(self) -> None:
        raise NotImplementedError

    def _window_update(self, stream_id: int, increment: int) -> None:
        raise NotImplementedError

    def _forget(self, stream: S) -> None:
        raise NotImplementedError

    def _close_if_idle(self) -> None:
        raise NotImplementedError

    def _reset_all(self, streams: list[S]) -> None:
        raise NotImplementedError
