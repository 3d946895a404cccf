"""What h2spec verifies after each case (a connection error, a stream error, the frame expected),
the registry of cases (`case`, `CASES`) and the small encoders the cases share."""

from __future__ import annotations

import struct
from collections.abc import Callable

from tests.h2peer import Frame, Peer, request_fields
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

A, EH, ES, PAD, PRI = h2.ACK, h2.END_HEADERS, h2.END_STREAM, h2.PADDED, h2.PRIORITY
Case = Callable[[Peer], None]
#: Every case by h2spec's key ("http2/6.5/1"): its title and how to run it on a connection after
#: h2spec's handshake.
CASES: dict[str, tuple[str, Case]] = {}


def case(key: str, title: str) -> Callable[[Case], Case]:
    def register(run: Case) -> Case:
        CASES[key] = (title, run)
        return run

    return register


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


def half_closed(p: Peer) -> None:
    """Stream 1 half-closed (remote): a request that ends with its headers."""
    p.send(frame(h2.HEADERS, EH | ES, 1, raw_block(p)))
