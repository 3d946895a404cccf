"""h2spec's http2 §6-§8 cases, ported (see tests/integration/test_h2_conformance.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from tests.h2peer import EMPTY_MESSAGE, Peer, request_fields
from tests.h2spec.verify import (
    EH,
    ES,
    PAD,
    A,
    answered_or_closed,
    case,
    connection_error,
    data_frame,
    expect,
    half_closed,
    ping_answered,
    raw_block,
    response,
    settings,
    stream_error,
)
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame


@case("http2/6.1/1", "Sends a DATA frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.DATA, ES, 0, b"test"))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.1/2", "Sends a DATA frame on the stream that is not in open or half-closed (local) state")
def _(p: Peer) -> None:
    half_closed(p)
    p.send(frame(h2.DATA, ES, 1, b"test"))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/6.1/3", "Sends a DATA frame with invalid pad length")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, ES | PAD, 1, b"\x06" + b"test"))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.2/1", "Sends a HEADERS frame without the END_HEADERS flag, and a PRIORITY frame")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, 0, 1, raw_block(p)) + frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 0, 15)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.2/2", "Sends a HEADERS frame to another stream while sending a HEADERS frame")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, 0, 1, raw_block(p)) + frame(h2.HEADERS, EH, 3, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.2/3", "Sends a HEADERS frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 0, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.2/4", "Sends a HEADERS frame with invalid pad length")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, EH | ES | PAD, 1, bytes((len(block) + 2,)) + block))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.3/1", "Sends a PRIORITY frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.PRIORITY_FRAME, 0, 0, struct.pack(">LB", 1, 15)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.3/2", "Sends a PRIORITY frame with a length other than 5 octets")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LBB", 0, 15, 0)))
    stream_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.4/1", "Sends a RST_STREAM frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.RST_STREAM, 0, 0, h2.CANCEL.to_bytes(4, "big")))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.4/2", "Sends a RST_STREAM frame on a idle stream")
def _(p: Peer) -> None:
    p.send(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.4/3", "Sends a RST_STREAM frame with a length other than 4 octets")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.RST_STREAM, 0, 1, b"\x00\x00\x00"))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.5/1", "Sends a SETTINGS frame with ACK flag and payload")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, A, 0, settings((h2.ENABLE_PUSH, 0))))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.5/2", "Sends a SETTINGS frame with a stream identifier other than 0x0")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 1, settings((h2.ENABLE_PUSH, 0))))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.5/3", "Sends a SETTINGS frame with a length other than a multiple of 6 octets")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.ENABLE_PUSH, 0))[:5]))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.5.2/1", "SETTINGS_ENABLE_PUSH (0x2): Sends the value other than 0 or 1")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.ENABLE_PUSH, 2))))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.5.2/2", "SETTINGS_INITIAL_WINDOW_SIZE (0x4): Sends the value above the maximum flow control window size")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 2**31))))
    connection_error(p, h2.FLOW_CONTROL_ERROR)


@case("http2/6.5.2/3", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value below the initial value")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.MAX_FRAME_SIZE, 16383))))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.5.2/4", "SETTINGS_MAX_FRAME_SIZE (0x5): Sends the value above the maximum allowed frame size")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.MAX_FRAME_SIZE, 2**24))))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.5.2/5", "Sends a SETTINGS frame with unknown identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((0xFF, 1))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")


@case("http2/6.5.3/1", "Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 100), (h2.INITIAL_WINDOW_SIZE, 1))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")
    p.call(1)
    assert len(data_frame(p).payload) == 1


@case("http2/6.5.3/2", "Sends a SETTINGS frame without ACK flag")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.ENABLE_PUSH, 0))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")


@case("http2/6.7/1", "Sends a PING frame")
def _(p: Peer) -> None:
    ping_answered(p)


@case("http2/6.7/2", "Sends a PING frame with ACK")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, A, 0, b"unexpect"))
    ping_answered(p)  # the next ACK is ours, not one of "unexpect"


@case("http2/6.7/3", "Sends a PING frame with a stream identifier field value other than 0x0")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, 0, 1, bytes(8)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.7/4", "Sends a PING frame with a length field value other than 8")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, 0, 0, bytes(6)))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.8/1", "Sends a GOAWAY frame with a stream identifier other than 0x0")
def _(p: Peer) -> None:
    p.send(frame(h2.GOAWAY, 0, 1, struct.pack(">LL", 0, 0)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.9/1", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0")
def _(p: Peer) -> None:
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, bytes(4)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.9/2", "Sends a WINDOW_UPDATE frame with a flow control window increment of 0 on a stream")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, bytes(4)))
    stream_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.9/3", "Sends a WINDOW_UPDATE frame with a length other than 4 octets")
def _(p: Peer) -> None:
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/6.9.1/1", "Sends SETTINGS frame to set the initial window size to 1 and sends HEADERS frame")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 1))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")
    p.call(1)
    assert len(data_frame(p).payload) == 1


@case("http2/6.9.1/2", "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1")
def _(p: Peer) -> None:
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, h2.MAX_WINDOW.to_bytes(4, "big")) * 2)
    connection_error(p, h2.FLOW_CONTROL_ERROR)


@case(
    "http2/6.9.1/3",
    "Sends multiple WINDOW_UPDATE frames increasing the flow control window to above 2^31-1 on a stream",
)
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, h2.MAX_WINDOW.to_bytes(4, "big")) * 2)
    stream_error(p, h2.FLOW_CONTROL_ERROR)


@case("http2/6.9.2/1", "Changes SETTINGS_INITIAL_WINDOW_SIZE after sending HEADERS frame")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 0))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")
    p.call(1)
    response(p)
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 1))))
    assert len(data_frame(p).payload) == 1


@case("http2/6.9.2/2", "Sends a SETTINGS frame for window size to be negative")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 3))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")
    p.call(1)
    assert len(data_frame(p).payload) == 3
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 0))))  # the stream's window: 0 - 3 = -3
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, (4).to_bytes(4, "big")))  # -3 + 4: one more byte may go
    assert len(data_frame(p).payload) == 1


@case("http2/6.9.2/3", "Sends a SETTINGS_INITIAL_WINDOW_SIZE settings with an exceeded maximum window size value")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.INITIAL_WINDOW_SIZE, 2**31))))
    connection_error(p, h2.FLOW_CONTROL_ERROR)


@case("http2/6.10/1", "Sends multiple CONTINUATION frames preceded by a HEADERS frame")
def _(p: Peer) -> None:
    block = raw_block(p, [("x-a", "a" * 100), ("x-b", "b" * 100)])
    p.send(frame(h2.HEADERS, 0, 1, block[:10]) + frame(h2.CONTINUATION, 0, 1, block[10:100]))
    p.send(frame(h2.CONTINUATION, EH, 1, block[100:]) + frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("http2/6.10/2", "Sends a CONTINUATION frame followed by any frame other than CONTINUATION")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, 0, 1, block[:5]) + frame(h2.CONTINUATION, 0, 1, block[5:]))
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.10/3", "Sends a CONTINUATION frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, 0, 1, block[:5]) + frame(h2.CONTINUATION, EH, 0, block[5:]))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.10/4", "Sends a CONTINUATION frame preceded by a HEADERS frame with END_HEADERS flag")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH, 1, raw_block(p)) + frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.10/5", "Sends a CONTINUATION frame preceded by a CONTINUATION frame with END_HEADERS flag")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, 0, 1, block[:5]) + frame(h2.CONTINUATION, EH, 1, block[5:]))
    p.send(frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.10/6", "Sends a CONTINUATION frame preceded by a DATA frame")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE) + frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/7/1", "Sends a GOAWAY frame with unknown error code")
def _(p: Peer) -> None:
    p.send(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", 0, 0xFF)))
    answered_or_closed(p)


@case("http2/7/2", "Sends a RST_STREAM frame with unknown error code")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.RST_STREAM, 0, 1, (0xFF).to_bytes(4, "big")))
    ping_answered(p)


@case("http2/8.1/1", "Sends a second HEADERS frame without the END_STREAM flag")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE) + frame(h2.HEADERS, EH, 1, p.block([("x-trailer", "a")])))
    stream_error(p, h2.PROTOCOL_ERROR)


def _malformed(key: str, title: str, fields: Callable[[], list[tuple[str, str]]], trailers: bool = False) -> None:
    @case(key, title)
    def _(p: Peer) -> None:
        if trailers:
            p.headers(1)
            p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE) + frame(h2.HEADERS, EH | ES, 1, p.block(fields())))
        else:
            p.send(frame(h2.HEADERS, EH | ES, 1, p.block(fields())))
        stream_error(p, h2.PROTOCOL_ERROR)


def _without(name: str) -> list[tuple[str, str]]:
    return [f for f in request_fields() if f[0] != name]


def _twice(name: str) -> list[tuple[str, str]]:
    fields = request_fields()
    value = dict(fields)[name]
    return fields[:3] + [(name, value)] + fields[3:]


_malformed(
    "http2/8.1.2/1",
    "Sends a HEADERS frame that contains the header field name in uppercase letters",
    lambda: [*request_fields(), ("X-TEST", "ok")],
)
_malformed(
    "http2/8.1.2.1/1",
    "Sends a HEADERS frame that contains a unknown pseudo-header field",
    lambda: request_fields()[:4] + [(":test", "ok")] + request_fields()[4:],
)
_malformed(
    "http2/8.1.2.1/2",
    "Sends a HEADERS frame that contains the pseudo-header field defined for response",
    lambda: request_fields()[:4] + [(":status", "200")] + request_fields()[4:],
)
_malformed(
    "http2/8.1.2.1/3",
    "Sends a HEADERS frame that contains a pseudo-header field as trailers",
    lambda: [(":method", "POST")],
    trailers=True,
)
_malformed(
    "http2/8.1.2.1/4",
    "Sends a HEADERS frame that contains a pseudo-header field that appears in a header block after a regular header field",
    lambda: [request_fields()[0], ("x-a", "1"), *request_fields()[1:]],
)
_malformed(
    "http2/8.1.2.2/1",
    "Sends a HEADERS frame that contains the connection-specific header field",
    lambda: [*request_fields(), ("connection", "keep-alive")],
)
_malformed(
    "http2/8.1.2.2/2",
    'Sends a HEADERS frame that contains the TE header field with any value other than "trailers"',
    lambda: [*_without("te"), ("te", "trailers, deflate")],
)
_malformed(
    "http2/8.1.2.3/1",
    'Sends a HEADERS frame with empty ":path" pseudo-header field',
    lambda: [(":path", "") if k == ":path" else (k, v) for k, v in request_fields()],
)
_malformed(
    "http2/8.1.2.3/2", 'Sends a HEADERS frame that omits ":method" pseudo-header field', lambda: _without(":method")
)
_malformed(
    "http2/8.1.2.3/3", 'Sends a HEADERS frame that omits ":scheme" pseudo-header field', lambda: _without(":scheme")
)
_malformed("http2/8.1.2.3/4", 'Sends a HEADERS frame that omits ":path" pseudo-header field', lambda: _without(":path"))
_malformed(
    "http2/8.1.2.3/5", 'Sends a HEADERS frame with duplicated ":method" pseudo-header field', lambda: _twice(":method")
)
_malformed(
    "http2/8.1.2.3/6", 'Sends a HEADERS frame with duplicated ":scheme" pseudo-header field', lambda: _twice(":scheme")
)
_malformed(
    "http2/8.1.2.3/7", 'Sends a HEADERS frame with duplicated ":path" pseudo-header field', lambda: _twice(":path")
)


@case(
    "http2/8.1.2.6/1",
    'Sends a HEADERS frame with the "content-length" header field which does not equal the DATA frame payload length',
)
def _(p: Peer) -> None:
    p.headers(1, [*request_fields(), ("content-length", "1")])
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    stream_error(p, h2.PROTOCOL_ERROR)


@case(
    "http2/8.1.2.6/2",
    'Sends a HEADERS frame with the "content-length" header field which does not equal the sum of the multiple DATA frames payload length',
)
def _(p: Peer) -> None:
    p.headers(1, [*request_fields(), ("content-length", "1")])
    p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE[:2]) + frame(h2.DATA, ES, 1, EMPTY_MESSAGE[2:]))
    stream_error(p, h2.PROTOCOL_ERROR)


@case("http2/8.2/1", "Sends a PUSH_PROMISE frame")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.PUSH_PROMISE, EH, 1, (2).to_bytes(4, "big") + raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)
