"""The rules a peer's control frames must keep (RFC 9113 §6), as pure checks, and the limits that
keep a hostile peer from making a connection grow without bound. `v2kit.h2.receive` applies them:
a check's answer is a code and a reason, and the connection turns it into a connection error
(GOAWAY). Header blocks have their own rules, in `v2kit.h2.fields`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from v2kit.compiled import by_constructor
from v2kit.h2 import frames as h2
from v2kit.h2.pings import PingPolicy

__all__ = [
    "DEFAULT_H2_LIMITS",
    "MAX_EMPTY_FRAMES",
    "MAX_HEADER_BLOCK",
    "MAX_INDUCED",
    "RESET_BURST",
    "RESET_MEMORY",
    "RESET_RATE_PER_S",
    "STREAM_WINDOW",
    "CONNECTION_WINDOW",
    "H2Limits",
    "control_problem",
    "settings_problem",
]

#: Answers the peer's own frames make us send (PING and SETTINGS ACKs, RST_STREAMs) that may wait,
#: unread, behind what the peer has not read yet; one more is ENHANCE_YOUR_CALM (nghttp2: 1000).
MAX_INDUCED = 1000
#: DATA frames that carry nothing and end nothing, and empty CONTINUATIONs, in a row: they cost us a
#: frame's work each and move nothing, so one more is ENHANCE_YOUR_CALM (the empty-frames flood of
#: CVE-2019-9518; nghttp2 and Go's x/net bound them too). Any frame that carries data starts anew.
MAX_EMPTY_FRAMES = 1000
#: Streams the peer may reset at once (a burst), and per second after it, before the connection
#: ends with ENHANCE_YOUR_CALM: the rapid-reset attack (CVE-2023-44487); nghttp2's numbers.
RESET_BURST = 1000
RESET_RATE_PER_S = 33.0
#: Stream ids we reset that are remembered, so the DATA the peer had in flight is ignored
#: (RFC 9113 §5.1, "closed") rather than answered with STREAM_CLOSED.
RESET_MEMORY = 1024
#: The longest header block (HEADERS and its CONTINUATIONs, as compressed) before the connection
#: ends with PROTOCOL_ERROR: what one call's metadata may make us buffer before it is decoded.
MAX_HEADER_BLOCK = 1 << 20
#: The windows we advertise: what the peer may send on a stream (SETTINGS_INITIAL_WINDOW_SIZE), and
#: on the connection (WINDOW_UPDATE on stream 0), before we give it back (once half a window has been
#: taken). They bound what a peer may make us hold unread: a stream's window per deferred stream, the
#: connection's across them all.
STREAM_WINDOW = 1 << 22
CONNECTION_WINDOW = 1 << 24


@dataclass(frozen=True, slots=True)
class H2Limits:
    """The limits above, for one connection: the server sets them from its flags (docs/server.md,
    "HTTP/2 limits"); the defaults are the constants. `RESET_MEMORY` stays a constant: it bounds
    our own bookkeeping, not what a peer may do. `pings`: keepalive pings and ping strikes
    (`v2kit.h2.pings`); None, as for perfkit's client, sends no pings and answers every PING."""

    max_induced: int = MAX_INDUCED
    max_empty_frames: int = MAX_EMPTY_FRAMES
    reset_burst: int = RESET_BURST
    reset_rate_per_s: float = RESET_RATE_PER_S
    max_header_block: int = MAX_HEADER_BLOCK
    stream_window: int = STREAM_WINDOW
    connection_window: int = CONNECTION_WINDOW
    pings: PingPolicy | None = None

    def __reduce__(self) -> tuple[type[H2Limits], tuple[Any, ...]]:
        # The server hands its limits to each front-end worker pickled. Compiled by mypyc, a frozen
        # dataclass's default unpickling (an empty instance, then each field set) fails with
        # "cannot assign to field": rebuild it by its constructor instead.
        return by_constructor(self)


DEFAULT_H2_LIMITS = H2Limits()


def control_problem(
    ftype: int, flags: int, stream_id: int, payload: bytes | bytearray | memoryview
) -> tuple[int, str] | None:
    """What is wrong with a control frame in itself, as a connection error (code, reason): its
    stream id and its length (RFC 9113 §6.3-§6.9). PRIORITY's length is a stream error, left out."""
    size = len(payload)
    if ftype == h2.SETTINGS:
        if stream_id:
            return h2.PROTOCOL_ERROR, f"SETTINGS on stream {stream_id}"
        if flags & h2.ACK and size:
            return h2.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload"
        if size % 6:
            return h2.FRAME_SIZE_ERROR, "a malformed SETTINGS frame"
    elif ftype == h2.PING:
        if stream_id:
            return h2.PROTOCOL_ERROR, f"PING on stream {stream_id}"
        if size != 8:
            return h2.FRAME_SIZE_ERROR, f"a {size}-byte PING"
    elif ftype == h2.GOAWAY:
        if stream_id:
            return h2.PROTOCOL_ERROR, f"GOAWAY on stream {stream_id}"
        if size < 8:
            return h2.FRAME_SIZE_ERROR, "a malformed GOAWAY"
    elif ftype == h2.RST_STREAM:
        if not stream_id:
            return h2.PROTOCOL_ERROR, "RST_STREAM on stream 0"
        if size != 4:
            return h2.FRAME_SIZE_ERROR, "a malformed RST_STREAM"
    elif ftype == h2.WINDOW_UPDATE:
        if size != 4:
            return h2.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE"
        if not stream_id and not int.from_bytes(payload, "big") & h2.MAX_WINDOW:
            return h2.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection"
    elif ftype == h2.PRIORITY_FRAME and not stream_id:
        return h2.PROTOCOL_ERROR, "PRIORITY on stream 0"
    return None


def settings_problem(payload: bytes | bytearray | memoryview, *, client: bool) -> tuple[int, str] | None:
    """What is wrong with a SETTINGS frame's values (RFC 9113 §6.5.2), as a connection error."""
    for offset in range(0, len(payload), 6):
        key, value = struct.unpack_from(">HL", payload, offset)
        if key == h2.ENABLE_PUSH and (value > 1 or (client and value)):
            return h2.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}"
        if key == h2.INITIAL_WINDOW_SIZE and value > h2.MAX_WINDOW:
            return h2.FLOW_CONTROL_ERROR, "a window over 2^31-1"
        if key == h2.MAX_FRAME_SIZE and not h2.DEFAULT_FRAME <= value <= h2.LARGEST_FRAME_SETTING:
            return h2.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}, outside 2^14..2^24-1"
    return None
