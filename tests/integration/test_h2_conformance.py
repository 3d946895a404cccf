"""h2spec's server cases (github.com/summerwind/h2spec: generic, http2 §3.5-§8.2, hpack), ported:
each is a raw-socket exchange on loopback with a server's gRPC port asserting what h2spec asserts
(a connection error: GOAWAY with its code; a stream error: RST_STREAM with its code, or GOAWAY with
it; or the frame expected). h2spec's requests are GETs of "/"; ours are gRPC calls (ServerLive), as
a gRPC server answers those with DATA. Bounded: every read times out, a connection reads at most
`tests.h2peer.MAX_READ` bytes.

The same cases run against our server and, for reference, real tritonserver (PERFKIT_PEERS, marked
`triton`). Our server must pass every one, and strictly: a connection error is a GOAWAY with the
code, where h2spec also takes a closed connection. Where Triton (grpc core) fails a case, the case
is xfail for Triton only, with the reason (`TRITON_FAILS`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reference_server.server import running_server
from tests.h2peer import EMPTY_MESSAGE, LIVE, Frame, Peer, request_fields
from tests.servers import loopback_config
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

pytestmark = pytest.mark.integration

A, EH, ES, PAD, PRI = h2.ACK, h2.END_HEADERS, h2.END_STREAM, h2.PADDED, h2.PRIORITY
Case = Callable[[Peer], None]
CASES: dict[str, tuple[str, Case]] = {}

_SILENT = "grpc core neither sends the error RFC 9113 names nor closes the connection within the case's 5 s"
_MALFORMED = (
    "grpc core does not answer this malformed request with PROTOCOL_ERROR (it ignores it or resets INTERNAL_ERROR)"
)
#: Cases real Triton (grpc core) fails, and how; xfail for Triton only.
TRITON_FAILS: dict[str, str] = {
    "generic/3.1/3": "grpc core resets a stream whose DATA is padded (RST_STREAM PROTOCOL_ERROR)",
    "generic/4/2": "grpc core resets a HEAD request (RST_STREAM INTERNAL_ERROR) rather than answering it",
    "http2/4.1/2": "grpc core closes the connection on a PING with undefined flags, which must be ignored",
    "http2/4.2/2": _SILENT,
    "http2/4.2/3": _SILENT,
    "http2/5.1/1": _SILENT,
    "http2/5.1/2": _SILENT,
    "http2/5.1/3": _SILENT,
    "http2/5.1/5": _SILENT,
    "http2/5.1/6": _SILENT,
    "http2/5.1/8": _SILENT,
    "http2/5.1/9": _SILENT,
    "http2/5.1/11": _SILENT,
    "http2/5.1/12": _SILENT,
    "http2/5.1.1/1": _SILENT,
    "http2/5.1.1/2": _SILENT,
    "http2/5.3.1/1": _SILENT,
    "http2/5.3.1/2": _SILENT,
    "http2/5.4.1/1": _SILENT,
    "http2/5.4.1/2": _SILENT,
    "http2/6.1/1": _SILENT,
    "http2/6.1/2": _SILENT,
    "http2/6.1/3": _SILENT,
    "http2/6.2/3": _SILENT,
    "http2/6.3/1": _SILENT,
    "http2/6.3/2": _SILENT,
    "http2/6.4/1": _SILENT,
    "http2/6.4/2": _SILENT,
    "http2/6.7/3": _SILENT,
    "http2/6.8/1": _SILENT,
    "http2/6.9.1/2": _SILENT,
    "http2/6.9.1/3": _SILENT,
    "http2/8.1.2/1": _MALFORMED,
    "http2/8.1.2.1/1": _MALFORMED,
    "http2/8.1.2.1/2": _MALFORMED,
    "http2/8.1.2.1/3": _MALFORMED,
    "http2/8.1.2.1/4": _MALFORMED,
    "http2/8.1.2.2/1": _MALFORMED,
    "http2/8.1.2.2/2": _MALFORMED,
    "http2/8.1.2.3/1": _MALFORMED,
    "http2/8.1.2.3/2": _MALFORMED,
    "http2/8.1.2.3/3": _MALFORMED,
    "http2/8.1.2.3/4": _MALFORMED,
    "http2/8.1.2.3/5": _MALFORMED,
    "http2/8.1.2.3/6": _MALFORMED,
    "http2/8.1.2.3/7": _MALFORMED,
    "http2/8.1.2.6/1": _MALFORMED,
    "http2/8.1.2.6/2": _MALFORMED,
    "http2/8.2/1": _SILENT,
}


def case(key: str, title: str) -> Callable[[Case], Case]:
    def register(run: Case) -> Case:
        CASES[key] = (title, run)
        return run

    return register


# -- what h2spec verifies ---------------------------------------------------------------------------


def connection_error(p: Peer, *codes: int) -> None:
    """GOAWAY with one of `codes` (h2spec also takes a closed connection, unless strict)."""
    while (f := p.next()) is not None:
        if f.type == h2.GOAWAY:
            assert f.code() in codes, f"GOAWAY {h2.h2_error(f.code())}, expected {[h2.h2_error(c) for c in codes]}"
            return
    assert not p.strict, "the connection closed without GOAWAY"


def stream_error(p: Peer, *codes: int) -> None:
    """RST_STREAM or GOAWAY with one of `codes`."""
    while (f := p.next()) is not None:
        if f.type in (h2.RST_STREAM, h2.GOAWAY) and f.code() in codes:
            return
        assert f.type != h2.GOAWAY, f"GOAWAY {h2.h2_error(f.code())}, expected {[h2.h2_error(c) for c in codes]}"
        assert f.type != h2.RST_STREAM or f.code() == h2.NO_ERROR, f"RST_STREAM {h2.h2_error(f.code())}"
    assert not p.strict, "the connection closed without RST_STREAM or GOAWAY"


def expect(p: Peer, wanted: Callable[[Frame], bool], what: str, *, resets_ok: bool = False) -> Frame:
    """The first frame `wanted`; a GOAWAY before it fails, and so does a RST_STREAM unless `resets_ok`."""
    while (f := p.next()) is not None:
        if wanted(f):
            return f
        assert f.type != h2.GOAWAY, f"GOAWAY {h2.h2_error(f.code())} while waiting for {what}"
        assert resets_ok or f.type != h2.RST_STREAM, f"RST_STREAM {h2.h2_error(f.code())} while waiting for {what}"
    raise AssertionError(f"the connection closed while waiting for {what}")


def ping_answered(p: Peer) -> None:
    """The connection still works: a PING is acknowledged."""
    p.ping(b"still ok")
    # A stream the case opened may be reset meanwhile (a server may end one it will not serve).
    expect(
        p, lambda f: f.type == h2.PING and f.flags & A != 0 and f.payload == b"still ok", "a PING ACK", resets_ok=True
    )


def answered_or_closed(p: Peer) -> None:
    """After the client's GOAWAY: still answering, or closed cleanly (GOAWAY NO_ERROR, or none)."""
    p.ping(b"still ok")
    while (f := p.next()) is not None:
        if f.type == h2.PING and f.flags & A and f.payload == b"still ok":
            return
        assert f.type != h2.GOAWAY or f.code() == h2.NO_ERROR, f"GOAWAY {h2.h2_error(f.code())}"


def response(p: Peer, stream_id: int = 1) -> Frame:
    return expect(p, lambda f: f.type == h2.HEADERS and f.stream_id == stream_id, "a response")


def data_frame(p: Peer, stream_id: int = 1) -> Frame:
    return expect(p, lambda f: f.type == h2.DATA and f.stream_id == stream_id, "DATA")


def settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">HL", k, v) for k, v in pairs)


def raw_block(
    p: Peer, extra: list[tuple[str, str]] | None = None, fields: list[tuple[str, str]] | None = None
) -> bytes:
    return p.block((fields if fields is not None else request_fields()) + (extra or []))


# -- generic -----------------------------------------------------------------------------------------


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


# -- http2 -------------------------------------------------------------------------------------------


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


def _half_closed(p: Peer) -> None:
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))


@case("http2/5.1/5", "half closed (remote): Sends a DATA frame")
def _(p: Peer) -> None:
    _half_closed(p)
    p.send(frame(h2.DATA, ES, 1, EMPTY_MESSAGE))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/6", "half closed (remote): Sends a HEADERS frame")
def _(p: Peer) -> None:
    _half_closed(p)
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))
    stream_error(p, h2.STREAM_CLOSED)


@case("http2/5.1/7", "half closed (remote): Sends a CONTINUATION frame")
def _(p: Peer) -> None:
    _half_closed(p)
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


@case("http2/6.1/1", "Sends a DATA frame with 0x0 stream identifier")
def _(p: Peer) -> None:
    p.send(frame(h2.DATA, ES, 0, b"test"))
    connection_error(p, h2.PROTOCOL_ERROR)


@case("http2/6.1/2", "Sends a DATA frame on the stream that is not in open or half-closed (local) state")
def _(p: Peer) -> None:
    _half_closed(p)
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


# -- hpack -------------------------------------------------------------------------------------------


def _bad_block(key: str, title: str, block: bytes) -> None:
    @case(key, title)
    def _(p: Peer) -> None:
        p.send(frame(h2.HEADERS, EH | ES, 1, block))
        connection_error(p, h2.COMPRESSION_ERROR)


_bad_block("hpack/2.3.3/1", "Sends a indexed header field representation with invalid index", b"\x82\x86\x84\xfe\x01")
_bad_block(
    "hpack/2.3.3/2", "Sends a literal header field representation with invalid index", b"\x82\x86\x84\x7f\x3f\x01a"
)
_bad_block(
    "hpack/4.2/1",
    "Sends a dynamic table size update larger than the value of SETTINGS_HEADER_TABLE_SIZE",
    b"\x3f\xe2\x1f\x82\x86\x84",
)  # 4097
_bad_block(
    "hpack/5.2/1",
    "Sends a Huffman-encoded string literal representation with padding longer than 7 bits",
    b"\x82\x86\x84\x41\x8a\x08\x9d\x5c\x0b\x81\x70\xdc\x79\xa6\x99\xff",
)
_bad_block(
    "hpack/5.2/2",
    "Sends a Huffman-encoded string literal representation padded by zero",
    b"\x82\x86\x84\x41\x89\x08\x9d\x5c\x0b\x81\x70\xdc\x79\xa6\x90",
)
_bad_block(
    "hpack/5.2/3",
    "Sends a Huffman-encoded string literal representation containing the EOS symbol",
    b"\x82\x86\x84\x41\x8a\x08\x9d\x5c\x0b\x81\x70\xdc\xff\xff\xff\xff",
)
_bad_block("hpack/6.1/1", "Sends a indexed header field representation with index 0", b"\x82\x86\x84\x80")
_bad_block(
    "hpack/6.3/1",
    "Sends a dynamic table size update at the end of header block",
    b"\x82\x86\x84\x41\x09127.0.0.1\x3f\xe1\x1f",
)


# -- running them ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def our_port(demo_repository: Path) -> Iterator[int]:
    with running_server(loopback_config(demo_repository)) as server:
        assert server.grpc_port is not None
        yield server.grpc_port


@pytest.fixture(scope="module")
def triton_port(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from perfkit.testing.triton import triton_server

    repository = tmp_path_factory.mktemp("h2spec-triton") / "models"
    repository.mkdir()
    with triton_server(peers, repository, start_timeout_s=90) as server:
        yield server.grpc_port


def run_case(port: int, key: str, strict: bool) -> None:
    _, run = CASES[key]
    with Peer(port) as p:
        p.strict = strict
        p.handshake()
        run(p)


@pytest.mark.parametrize("key", [k for k in CASES if k != "http2/3.5/2"])
def test_our_server_passes(our_port: int, key: str) -> None:
    run_case(our_port, key, strict=True)


@pytest.mark.peers
@pytest.mark.parametrize(
    "key",
    [pytest.param(k, marks=pytest.mark.xfail(reason=TRITON_FAILS[k], strict=True)) if k in TRITON_FAILS else k
     for k in CASES if k != "http2/3.5/2"],
)  # fmt: skip
def test_triton_for_reference(triton_port: int, key: str) -> None:
    run_case(triton_port, key, strict=False)


def _invalid_preface(port: int, strict: bool) -> None:
    with Peer(port) as p:
        p.strict = strict
        p.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
        connection_error(p, h2.PROTOCOL_ERROR)


def test_our_server_refuses_an_invalid_preface(our_port: int) -> None:
    _invalid_preface(our_port, strict=True)


@pytest.mark.peers
def test_triton_refuses_an_invalid_preface(triton_port: int) -> None:
    _invalid_preface(triton_port, strict=False)
