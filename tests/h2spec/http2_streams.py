"""h2spec's http2 §3.5-§5.5 cases, ported (see tests/integration/test_h2_conformance.py)."""

from __future__ import annotations

import struct

import pytest

from tests.h2peer import EMPTY_MESSAGE, Peer, request_fields
from tests.h2spec.verify import (
    EH,
    ES,
    PRI,
    A,
    case,
    connection_error,
    expect,
    half_closed,
    ping_answered,
    raw_block,
    response,
    stream_error,
)
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame


@case("http2/3.5/1", "Sends client connection preface")
def _(p: Peer) -> None:
    ping_answered(p)


@case("http2/3.5/2", "Sends invalid connection preface")
def _(p: Peer) -> None:
    pass  # run by test_invalid_connection_preface: it needs a connection without the handshake


@case("http2/4.1/1", "Sends a frame with unknown type")
def _(p: Peer) -> None:
    p.send(frame(0x16, 0, 0, b"\x00" * 8))
    ping_answered(p)


@case("http2/4.1/2", "Sends a frame with undefined flag")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, 0x16, 0, b"undefine"))
    expect(p, lambda f: f.type == h2.PING and f.flags & A != 0 and f.payload == b"undefine", "a PING ACK")


@case("http2/4.1/3", "Sends a frame with reserved field bit")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(len(block).to_bytes(3, "big") + bytes((h2.HEADERS, EH)) + (0x80000001).to_bytes(4, "big") + block)
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("http2/4.2/1", "Sends a DATA frame with 2^14 octets in length")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, bytes(16384)))
    expect(p, lambda f: f.stream_id == 1 and f.type in (h2.HEADERS, h2.RST_STREAM), "an answer")


@case("http2/4.2/2", "Sends a large size DATA frame that exceeds the SETTINGS_MAX_FRAME_SIZE")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, bytes(16385)))
    stream_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/4.2/3", "Sends a large size HEADERS frame that exceeds the SETTINGS_MAX_FRAME_SIZE")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH, 1, raw_block(p, [("x-big", "x" * 20_000)])))
    connection_error(p, h2.FRAME_SIZE_ERROR)


@case("http2/4.3/1", "Sends invalid header block fragment")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 1, b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
    connection_error(p, h2.COMPRESSION_ERROR)


@case("http2/4.3/2", "Sends a PRIORITY frame while sending the header blocks")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, 0, 1, raw_block(p)) + frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 0, 15)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/4.3/3", "Sends a HEADERS frame to another stream while sending the header blocks")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, 0, 1, raw_block(p)) + frame(h2.HEADERS, EH, 3, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1/1", "idle: Sends a DATA frame")
def _(p: Peer) -> None:
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1/2", "idle: Sends a RST_STREAM frame")
def _(p: Peer) -> None:
    p.send(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1/3", "idle: Sends a WINDOW_UPDATE frame")
def _(p: Peer) -> None:
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, (100).to_bytes(4, "big")))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1/4", "idle: Sends a CONTINUATION frame")
def _(p: Peer) -> None:
    p.send(frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1/5", "half closed (remote): Sends a DATA frame")
def _(p: Peer) -> None:
    half_closed(p)
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/6", "half closed (remote): Sends a HEADERS frame")
def _(p: Peer) -> None:
    half_closed(p)
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/7", "half closed (remote): Sends a CONTINUATION frame")
def _(p: Peer) -> None:
    half_closed(p)
    p.send(frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED, h2.PROTOCOL_ERROR)


def _reset(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))


@case("http2/5.1/8", "closed: Sends a DATA frame after sending RST_STREAM frame")
def _(p: Peer) -> None:
    _reset(p)
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/9", "closed: Sends a HEADERS frame after sending RST_STREAM frame")
def _(p: Peer) -> None:
    _reset(p)
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/10", "closed: Sends a CONTINUATION frame after sending RST_STREAM frame")
def _(p: Peer) -> None:
    _reset(p)
    p.send(frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED, h2.PROTOCOL_ERROR)


def _ended(p: Peer) -> None:
    p.call(1)
    expect(p, lambda f: f.stream_id == 1 and f.flags & ES != 0, "the end of stream 1")


@case("http2/5.1/11", "closed: Sends a DATA frame")
def _(p: Peer) -> None:
    _ended(p)
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/12", "closed: Sends a HEADERS frame")
def _(p: Peer) -> None:
    _ended(p)
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/13", "closed: Sends a CONTINUATION frame")
def _(p: Peer) -> None:
    _ended(p)
    p.send(frame(h2.CONTINUATION, EH, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED, h2.PROTOCOL_ERROR)


@case("http2/5.1.1/1", "Sends even-numbered stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 2, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1.1/2", "Sends stream identifier that is numerically smaller than previous")
def _(p: Peer) -> None:
    p.headers(5)
    p.send(frame(h2.HEADERS, EH, 3, raw_block(p)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.1.2/1", "Sends HEADERS frames that causes their advertised concurrent stream limit to be exceeded")
def _(p: Peer) -> None:
    limit = p.server_settings.get(h2.MAX_CONCURRENT_STREAMS)
    if limit is None or limit > 4096:
        pytest.skip("SETTINGS_MAX_CONCURRENT_STREAMS is unlimited or too high to try")
    block = raw_block(p)  # the encoder's table makes the next blocks short: send this first
    p.send(
        b"".join(
            frame(h2.HEADERS, EH, 1 + 2 * i, block if i == 0 else p.block(request_fields())) for i in range(limit + 1)
        )
    )
    stream_error(p, h2.PROTOCOL_ERROR, h2.REFUSED_STREAM)


@case("http2/5.3.1/1", "Sends HEADERS frame that depends on itself")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | PRI, 1, struct.pack(">LB", 1, 15) + raw_block(p)))
    stream_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.3.1/2", "Sends PRIORITY frame that depend on itself")
def _(p: Peer) -> None:
    p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 1, 15)))
    stream_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.4.1/1", "Sends an invalid PING frame for connection close")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, 0, 3, bytes(8)))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.4.1/2", "Sends an invalid PING frame to receive GOAWAY frame")
def _(p: Peer) -> None:
    p.send(frame(h2.PING, 0, 3, bytes(8)))
    expect(p, lambda f: f.type == h2.GOAWAY, "GOAWAY") if p.strict else connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/5.5/1", "Sends an unknown extension frame")
def _(p: Peer) -> None:
    p.send(frame(0xFF, 0, 0, b"unknown"))
    ping_answered(p)


@case("http2/5.5/2", "Sends an unknown extension frame in the middle of a header block")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, 0, 1, raw_block(p)) + frame(0xFF, 0, 1, b"unknown"))
    connection_error(p, h2.PROTOCOL_ERROR)
