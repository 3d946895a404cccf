"""h2spec's generic cases, ported (see tests/integration/test_h2_conformance.py)."""

from __future__ import annotations

import struct

from tests.h2peer import EMPTY_MESSAGE, LIVE, Peer, request_fields
from tests.h2spec.verify import (
    EH,
    ES,
    PAD,
    PRI,
    A,
    answered_or_closed,
    case,
    data_frame,
    expect,
    ping_answered,
    raw_block,
    response,
    settings,
)
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame


@case("generic/1/1", "Sends a client connection preface")
def _(p: Peer) -> None:
    ping_answered(p)


@case("generic/2/1", "Sends a PRIORITY frame on idle stream")
def _(p: Peer) -> None:
    p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 0, 15)))
    ping_answered(p)


@case("generic/2/2", "Sends a WINDOW_UPDATE frame on half-closed (remote) stream")
def _(p: Peer) -> None:
    p.call(1)
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
    response(p)


@case("generic/2/3", "Sends a PRIORITY frame on half-closed (remote) stream")
def _(p: Peer) -> None:
    p.call(1)
    p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 0, 15)))
    response(p)


@case("generic/2/4", "Sends a RST_STREAM frame on half-closed (remote) stream")
def _(p: Peer) -> None:
    p.call(1)
    p.send(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))
    ping_answered(p)


@case("generic/2/5", "Sends a PRIORITY frame on closed stream")
def _(p: Peer) -> None:
    p.call(1)
    expect(p, lambda f: f.stream_id == 1 and f.flags & ES != 0, "the end of stream 1")
    p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", 0, 15)))
    ping_answered(p)


@case("generic/3.1/1", "Sends a DATA frame")
def _(p: Peer) -> None:
    p.call(1)
    response(p)


@case("generic/3.1/2", "Sends multiple DATA frames")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE[:2]) + frame(h2.DATA, ES, 1, EMPTY_MESSAGE[2:]))
    response(p)


@case("generic/3.1/3", "Sends a DATA frame with padding")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, ES | PAD, 1, b"\x08" + EMPTY_MESSAGE + bytes(8)))
    response(p)


@case("generic/3.2/1", "Sends a HEADERS frame")
def _(p: Peer) -> None:
    p.call(1)
    response(p)


@case("generic/3.2/2", "Sends a HEADERS frame with padding")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | PAD, 1, b"\x08" + raw_block(p) + bytes(8)))
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("generic/3.2/3", "Sends a HEADERS frame with priority")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | PRI, 1, struct.pack(">LB", 0, 255) + raw_block(p)))
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


for _n, (_dep, _weight) in enumerate([(0, 0), (0, 255), (3, 15), (0x80000003, 15)], 1):

    @case(f"generic/3.3/{_n}", f"Sends a PRIORITY frame (dependency {_dep:#x}, weight {_weight})")
    def _(p: Peer, dep: int = _dep, weight: int = _weight) -> None:
        p.send(frame(h2.PRIORITY_FRAME, 0, 1, struct.pack(">LB", dep, weight)))
        p.call(1)
        response(p)


@case("generic/3.3/5", "Sends a PRIORITY frame for an idle stream, then a HEADERS frame for a lower stream ID")
def _(p: Peer) -> None:
    p.send(frame(h2.PRIORITY_FRAME, 0, 3, struct.pack(">LB", 0, 15)))
    p.call(1)
    response(p)


@case("generic/3.4/1", "Sends a RST_STREAM frame")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))
    ping_answered(p)


@case("generic/3.5/1", "Sends a SETTINGS frame")
def _(p: Peer) -> None:
    p.send(frame(h2.SETTINGS, 0, 0, settings((h2.ENABLE_PUSH, 0))))
    expect(p, lambda f: f.type == h2.SETTINGS and f.flags & A != 0, "a SETTINGS ACK")


@case("generic/3.7/1", "Sends a PING frame")
def _(p: Peer) -> None:
    ping_answered(p)


@case("generic/3.8/1", "Sends a GOAWAY frame")
def _(p: Peer) -> None:
    p.send(frame(h2.GOAWAY, 0, 0, struct.pack(">LL", 0, h2.NO_ERROR)))
    answered_or_closed(p)


@case("generic/3.9/1", "Sends a WINDOW_UPDATE frame with arbitrary increment on the connection")
def _(p: Peer) -> None:
    p.send(frame(h2.WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")))
    ping_answered(p)


@case("generic/3.9/2", "Sends a WINDOW_UPDATE frame with arbitrary increment on a stream")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("generic/3.10/1", "Sends a CONTINUATION frame")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, 0, 1, block[:5]) + frame(h2.CONTINUATION, EH, 1, block[5:]))
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("generic/3.10/2", "Sends multiple CONTINUATION frames")
def _(p: Peer) -> None:
    block = raw_block(p)
    p.send(frame(h2.HEADERS, 0, 1, block[:5]) + frame(h2.CONTINUATION, 0, 1, block[5:10]))
    p.send(frame(h2.CONTINUATION, EH, 1, block[10:]) + frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    response(p)


@case("generic/4/1", "Sends a GET request")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p, fields=request_fields("/", "GET"))))
    response(p)


@case("generic/4/2", "Sends a HEAD request")
def _(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p, fields=request_fields("/", "HEAD"))))
    response(p)


@case("generic/4/3", "Sends a POST request")
def _(p: Peer) -> None:
    p.call(1)
    data_frame(p)


@case("generic/4/4", "Sends a POST request with trailers")
def _(p: Peer) -> None:
    p.headers(1)
    p.send(frame(h2.DATA, 0, 1, EMPTY_MESSAGE))
    p.send(frame(h2.HEADERS, EH | ES, 1, p.block([("x-trailer", "yes")])))
    data_frame(p)


_HPACK_GENERIC = {
    1: ("indexed header field", b"\x82\x86\x84\x41\x09127.0.0.1"),
    2: (
        "literal header field with incremental indexing, indexed name",
        b"\x83\x86\x44\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1",
    ),
    3: (
        "literal header field with incremental indexing, new name",
        b"\x83\x86\x40\x05:path\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1",
    ),
    4: (
        "literal header field without indexing, indexed name",
        b"\x83\x86\x04\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1",
    ),
    5: (
        "literal header field without indexing, new name",
        b"\x83\x86\x00\x05:path\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1",
    ),
    6: ("literal header field never indexed, indexed name", b"\x83\x86\x14\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1"),
    7: (
        "literal header field never indexed, new name",
        b"\x83\x86\x10\x05:path\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1",
    ),
    8: ("dynamic table size update", b"\x3f\xe1\x1f\x83\x86\x04\x2a" + LIVE.encode() + b"\x41\x09127.0.0.1"),
}
_GRPC_FIELDS = b"\x5f\x10application/grpc\x00\x02te\x08trailers"  # content-type (indexed name), te
for _n, (_title, _block) in _HPACK_GENERIC.items():

    @case(f"generic/5/{_n}", f"Sends a {_title} representation")
    def _(p: Peer, block: bytes = _block) -> None:
        p.send(frame(h2.HEADERS, EH, 1, block + _GRPC_FIELDS) + frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
        response(p)
