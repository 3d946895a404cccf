"""One HTTP/2 connection's state (RFC 9113), sans-I/O and blind to its role: the lean gRPC client
(`perfkit.wire.grpc.connection`) and the server's gRPC front end (`reference_server.frontends.grpc.server`)
both drive one. The driver feeds it what arrived (`receive`) and asks it to send (`open_stream`,
`send_headers`, `send_data`, `send_trailers`, `reset_stream`); it writes frames to a `Sink` (a
transport, or a test's buffer) and tells the driver what happened through `Events`. A client opens
streams and reads the answers; a server reads the streams the peer opens (`Events.stream_opened`)
and answers them. `client` only says who sends the preface and which stream ids are whose.

What it owns, once for both ends:
- Frames in (`v2kit.h2.receive`, the base class): one dispatch, CONTINUATION assembly, HPACK
  decoding, PING answered, SETTINGS followed and acknowledged, RST_STREAM, GOAWAY, PUSH_PROMISE
  refused, every rule of RFC 9113 the peer may break (`v2kit.h2.rules`). A broken rule ends the
  connection in one place (`fail`: GOAWAY with its code, and a reason the driver can show) or,
  where the RFC says so, only its stream (RST_STREAM, and `Events.stream_reset` with the code).
- Hostile peers: answers to the peer's own frames are capped while it reads none (PING and
  SETTINGS floods: ENHANCE_YOUR_CALM), and so are the streams it opens and resets (rapid reset).
- Flow control both ways. We advertise stream windows of 4 MiB and a connection window of 16 MiB
  by default (`H2Limits.stream_window`, `connection_window`; DATA past them is FLOW_CONTROL_ERROR) and give
  them back once half is taken: as it comes, or for a stream its driver defers (`Stream.deferred`),
  as the application takes it (`consumed`), so a peer that sends faster than that waits. We send
  nothing larger than the peer's frame size or windows allow: data the windows cannot take yet
  waits, in order, until WINDOW_UPDATEs come, and trailers (or END_STREAM) follow their data.
- Streams: ids, bookkeeping, the peer's stream limit and ours (refused past it, or once going away),
  draining after GOAWAY (close once the last stream is gone).
- Pings, given a `PingPolicy` (`H2Limits.pings`, the server's): keepalive PINGs, the connection
  ended when one's ACK is late, and strikes against a peer that pings too often (`v2kit.h2.pings`).
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

from mypy_extensions import mypyc_attr

from v2kit.h2 import frames as h2
from v2kit.h2.events import Events, Payload, S, Sink, Stream
from v2kit.h2.frames import frame
from v2kit.h2.receive import Receiver

__all__ = ["Connection", "Events", "Payload", "Sink", "Stream"]

TIMER_SLACK_S = 0.001  # a timer may fire this early (libuv counts milliseconds)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed by interpreted classes (compiled: docs/compiled.md)
class Connection(Receiver[S]):
    """One HTTP/2 connection, either end of it; see the module's docstring."""

    # -- the connection's life

    def start(self, sink: Sink) -> None:
        """Begin on `sink`: our preface (client), SETTINGS and the connection window."""
        self._sink = sink
        settings = struct.pack(">HL", h2.ENABLE_PUSH, 0)
        if self._max_peer_streams:
            settings += struct.pack(">HL", h2.MAX_CONCURRENT_STREAMS, self._max_peer_streams)
        settings += struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, self._stream_window)
        opening = (h2.PREFACE if self._client else b"") + frame(h2.SETTINGS, 0, 0, settings)
        if self._connection_window > h2.DEFAULT_WINDOW:  # it starts at 65,535 and cannot shrink
            increment = self._connection_window - h2.DEFAULT_WINDOW
            opening += frame(h2.WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))
        sink.write(opening)
        if self._limits.pings is not None:
            self._keepalive_after(self._limits.pings.keepalive_time_s)

    def lost(self) -> None:
        """The transport is gone: every stream is reset (`Events.stream_reset` with None)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._blocked.clear()
        self._reset_all(list(self.streams.values()))

    def close_when_idle(self) -> None:
        """Take no new streams (GOAWAY); close once those in progress have ended."""
        if self._goaway_sent:
            return
        self.draining = True
        self._goaway(h2.NO_ERROR)
        self._close_if_idle()

    def fail(self, code: int, reason: str, debug: bytes = b"") -> None:
        """End the connection: GOAWAY with `code` (and `debug` data), close, and reset every stream."""
        sink = self._sink
        if sink is not None and not sink.is_closing():
            self._goaway(code, debug)
            sink.close()
        self.events.connection_failed(reason)
        self._reset_all(list(self.streams.values()))

    def closed(self) -> bool:
        return self._sink is None or self._sink.is_closing()

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
        self._data_sent += 1
        return True

    def send_headers(self, stream_id: int, block: bytes, *, end_stream: bool = False) -> None:
        """A header block, in CONTINUATIONs if longer than the peer's frames."""
        self._data_sent += 1
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
        _set_end_block(stream, block)
        self._pump_stream(stream)
        if stream.end_block is not None and stream not in self._blocked:
            self._blocked.append(stream)

    def close_stream(self, stream: S) -> None:
        """Forget `stream`; a side still open is told to stop (RST_STREAM NO_ERROR, RFC 9113 §8.1)."""
        self.streams.pop(stream.id, None)
        if not (stream.local_ended and stream.remote_ended):
            self.send_reset(stream.id, h2.NO_ERROR)
            self._forget(stream)  # it may be waiting for a window
        else:
            if stream.held:  # a deferred stream's DATA its driver never took
                self._credit_connection(stream.held)
                stream.held = 0
            if self.draining:
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
                self._data_sent += 1
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

    def _goaway(self, code: int, debug: bytes = b"") -> None:
        self._goaway_sent = True
        self.write(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", self._last_peer_stream, code) + debug))

    # -- streams' ends

    def _forget(self, stream: S) -> None:
        """Bookkeeping once `stream` has left `streams`; DATA of it nobody will take is given back."""
        if stream.held:
            self._credit_connection(stream.held)
            stream.held = 0
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

    # -- keepalive pings (`H2Limits.pings`; `v2kit.h2.pings` says what they follow)

    def _keepalive_after(self, delay_s: float) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._keepalive = self._call_at(self._now() + delay_s, self._keepalive_due)

    def _keepalive_due(self) -> None:
        """Time for a keepalive PING, or (one is out) its ACK is late: the peer is gone or stuck."""
        self._keepalive = None
        policy = self._limits.pings
        if policy is None or self.closed():
            return
        if self._keepalive_out is not None:
            self.fail(
                h2.NO_ERROR,
                f"{self._peer} did not answer a keepalive PING within {policy.keepalive_timeout_s:g} s",
                b"keepalive watchdog timeout",
            )
            return
        if self._data_sent != self._keepalive_data_seen:
            self._keepalive_data_seen, self._pings_without_data = self._data_sent, 0
        cap = policy.max_pings_without_data
        if (self.streams or policy.permit_without_calls) and not (cap and self._pings_without_data >= cap):
            self._pings_without_data += 1
            self._keepalive_out = payload = b"keepaliv"
            self.write(frame(h2.PING, 0, 0, payload))
            self._keepalive_after(policy.keepalive_timeout_s)
        else:  # nothing to keep alive, or no more pings until data goes out: look again a period later
            self._keepalive_after(policy.keepalive_time_s)

    def _keepalive_acked(self) -> None:
        self._keepalive_out = None
        if self._limits.pings is not None and not self.closed():
            self._keepalive_after(self._limits.pings.keepalive_time_s)


def _set_end_block(stream: Stream, block: bytes) -> None:
    # Not inline in send_trailers: there the type checker would take `end_block` for bytes after
    # `_pump_stream` (which sets it to None once sent), and compiled code checks what it assumes.
    stream.end_block = block
