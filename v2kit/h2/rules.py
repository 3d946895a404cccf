"""The rules a peer's frames and header blocks must keep (RFC 9113 §4-§8), as pure checks, and the
limits that keep a hostile peer from making a connection grow without bound. `v2kit.h2.connection`
applies them: a check's answer is a reason, and the connection turns it into a connection error
(GOAWAY) or a stream error (RST_STREAM) with the code RFC 9113 names for it.

Header blocks (§8.2, §8.3) are judged once per distinct block: `HeaderDecoder` caches a block's
`Fields` by its bytes, so a warm peer's repeated requests cost a dict lookup, as before.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from v2kit.h2 import frames as h2

__all__ = [
    "MAX_INDUCED", "RESET_BURST", "RESET_RATE_PER_S", "RESET_MEMORY", "Fields", "classify", "control_problem",
    "settings_problem",
]  # fmt: skip

#: Answers the peer's own frames make us send (PING and SETTINGS ACKs, RST_STREAMs) that may wait,
#: unread, behind what the peer has not read yet; one more is ENHANCE_YOUR_CALM (nghttp2: 1000).
MAX_INDUCED = 1000
#: Streams the peer may reset at once (a burst), and per second after it, before the connection
#: ends with ENHANCE_YOUR_CALM: the rapid-reset attack (CVE-2023-44487); nghttp2's numbers.
RESET_BURST = 1000
RESET_RATE_PER_S = 33.0
#: Stream ids we reset that are remembered, so the DATA the peer had in flight is ignored
#: (RFC 9113 §5.1, "closed") rather than answered with STREAM_CLOSED.
RESET_MEMORY = 1024

_CONNECTION_FIELDS = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"))
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))
_FORBIDDEN_IN_VALUES = ("\r", "\n", "\x00")


class Fields:
    """A decoded header block: its fields by name (the last of a repeated regular name), and what
    makes it malformed (RFC 9113 §8.1.1) as a request, a response or trailers (None: nothing)."""

    __slots__ = ("headers", "request", "response", "trailers")

    def __init__(self, headers: dict[str, str], request: str | None, response: str | None, trailers: str | None):
        self.headers = headers
        self.request = request
        self.response = response
        self.trailers = trailers


def classify(fields: Sequence[tuple[str, str]]) -> Fields:
    """Judge a decoded header block once for each use it may be put to."""
    pseudo: dict[str, str] = {}
    common: str | None = None
    regular = False
    for name, value in fields:
        if any(c in value for c in _FORBIDDEN_IN_VALUES) or not name:
            common = common or f"field {name!r} has a forbidden character"
        if name.startswith(":"):
            if regular:
                common = common or f"pseudo-header {name} after regular fields"
            if name in pseudo:
                common = common or f"pseudo-header {name} repeated"
            pseudo[name] = value
            continue
        regular = True
        if name != name.lower():
            common = common or f"field name {name!r} has upper-case letters"
        elif name in _CONNECTION_FIELDS:
            common = common or f"connection-specific field {name!r}"
        elif name == "te" and value.strip().lower() != "trailers":
            common = common or f"te: {value!r} (only 'trailers' is allowed)"
        elif name == "content-length" and not value.isdigit():
            common = common or f"content-length {value!r} is not a number"
    headers = {name: value for name, value in fields}
    if common is not None:
        return Fields(headers, common, common, common)
    return Fields(headers, _request_problem(pseudo), _response_problem(pseudo), _trailers_problem(pseudo))


def _request_problem(pseudo: dict[str, str]) -> str | None:
    unknown = pseudo.keys() - _REQUEST_PSEUDO
    if unknown:
        return f"pseudo-header {min(unknown)} in a request"
    if pseudo.get(":method") == "CONNECT":  # §8.5: :authority only
        return None if ":authority" in pseudo and len(pseudo) == 2 else "a malformed CONNECT request"
    for name in (":method", ":scheme", ":path"):
        if name not in pseudo:
            return f"a request without {name}"
    if not pseudo[":path"]:
        return "a request with an empty :path"
    return None


def _response_problem(pseudo: dict[str, str]) -> str | None:
    status = pseudo.get(":status")
    if status is None:
        return "a response without :status"
    if len(pseudo) > 1:
        return f"pseudo-header {min(pseudo.keys() - {':status'})} in a response"
    if len(status) != 3 or not status.isdigit():
        return f":status {status!r} is not a three-digit code"
    return None


def _trailers_problem(pseudo: dict[str, str]) -> str | None:
    return f"pseudo-header {min(pseudo)} in trailers" if pseudo else None


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
