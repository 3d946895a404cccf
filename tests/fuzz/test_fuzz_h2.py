"""HTTP/2 fuzzing at the frame layer: arbitrary frame sequences, some well-formed and most not, fed
to the connection engine in both roles (in memory) and to the server's gRPC port (loopback). The
engine never raises: whatever comes, it answers with frames that parse, ends the connection only
with GOAWAY and one of RFC 9113's codes, and the server keeps serving with nothing logged as a
crash. PERFKIT_FUZZ_EXAMPLES scales the runs."""

from __future__ import annotations

import logging
import struct

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_server.server import ReferenceServer
from tests.fuzz.wire import fuzz_settings
from tests.h2peer import EMPTY_MESSAGE, MemorySink, Peer, request_fields
from v2kit.h2 import frames as h2
from v2kit.h2.connection import Connection, Events, Stream
from v2kit.h2.frames import FrameReader, frame

pytestmark = [pytest.mark.fuzz]

CODES = set(range(14))  # RFC 9113 §7
_encoder = hpack.Encoder()
_BLOCKS = [
    _encoder.encode(request_fields()),
    _encoder.encode([(":status", "200"), ("content-type", "application/grpc")]),
    _encoder.encode([("grpc-status", "0")]),
    _encoder.encode([*request_fields(), ("content-length", "5")]),
    b"\x82\x86\x84",
    b"\xff\xff\xff",
]
stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1])
payloads = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(_BLOCKS),
    st.sampled_from([EMPTY_MESSAGE, b"\x00\x00\x00\x00\x0a", bytes(8), bytes(4), bytes(5), bytes(6)]),
    st.builds(
        lambda k, v: struct.pack(">HL", k, v), st.integers(0, 8), st.sampled_from([0, 1, 2, 2**14, 2**24, 2**31])
    ),
    st.builds(lambda n: n.to_bytes(4, "big"), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1])),
)
frames = st.builds(
    lambda t, f, s, p: frame(t, f, s, p),
    st.one_of(st.integers(0, 9), st.integers(10, 255)),
    st.sampled_from([0, h2.END_STREAM, h2.END_HEADERS, h2.END_STREAM | h2.END_HEADERS, h2.PADDED, h2.PRIORITY, 0xFF]),
    stream_ids,
    payloads,
)
sequences = st.lists(frames, max_size=24)


class Taker(Events[Stream]):
    """Takes every stream; answers each request once its side ends (the server's role)."""

    def __init__(self) -> None:
        self.connection: Connection[Stream] | None = None

    def stream_opened(self, stream_id: int, headers: dict[str, str], end_stream: bool) -> Stream | None:
        return Stream()

    def stream_ended(self, stream: Stream) -> None:
        assert self.connection is not None
        self.connection.send_headers(stream.id, _BLOCKS[1])
        self.connection.send_data(stream, b"answer")
        self.connection.send_trailers(stream, _BLOCKS[2])


def run_engine(client: bool, data: list[bytes]) -> None:
    events = Taker()
    connection = Connection(
        events, client=client, peer="the peer", now=lambda: 0.0, call_at=lambda when, callback: _Never(),
        max_peer_streams=4,
    )  # fmt: skip
    events.connection = connection
    sink = MemorySink(reads=True)
    connection.start(sink)
    if client:
        stream = Stream()
        connection.open_stream(stream)
        connection.send_headers(stream.id, _BLOCKS[0])
        connection.send_data(stream, EMPTY_MESSAGE, end_stream=True)
    connection.receive((b"" if client else h2.PREFACE) + frame(h2.SETTINGS, 0, 0))
    for chunk in data:
        connection.receive(chunk)
    written = bytes(sink.data)[len(h2.PREFACE) if client else 0 :]
    out = list(FrameReader().feed(written))  # what it wrote parses as frames
    for ftype, _, _, payload in out:
        if ftype == h2.GOAWAY:
            assert int.from_bytes(payload[4:8], "big") in CODES
        if ftype == h2.RST_STREAM:
            assert int.from_bytes(payload, "big") in CODES
    connection.lost()


class _Never:
    def cancel(self) -> None:
        pass


@fuzz_settings(2000)
@given(sequences, st.booleans())
def test_the_engine_takes_any_frames(sequence: list[bytes], client: bool) -> None:
    run_engine(client, sequence)


@fuzz_settings(300)
@given(st.binary(max_size=512), st.booleans())
def test_the_engine_takes_any_bytes(data: bytes, client: bool) -> None:
    run_engine(client, [data[:7], data[7:]])


@pytest.mark.integration
@fuzz_settings(200)
@given(sequences)
def test_the_server_takes_any_frames(
    fuzz_server: ReferenceServer, crashes: list[logging.LogRecord], sequence: list[bytes]
) -> None:
    assert fuzz_server.grpc_port is not None
    with Peer(fuzz_server.grpc_port, timeout_s=10) as p:
        p.handshake()
        p.send(b"".join(sequence))
        p.ping(b"fuzzdone")
        try:
            while (f := p.next()) is not None:
                if f.type == h2.GOAWAY:
                    assert f.code() in CODES
                    break
                if f.type == h2.PING and f.flags & h2.ACK and f.payload == b"fuzzdone":
                    break
        except (TimeoutError, ConnectionError):
            pass
    assert [r.getMessage() for r in crashes] == []


@pytest.mark.integration
def test_the_server_still_serves(fuzz_server: ReferenceServer, crashes: list[logging.LogRecord]) -> None:
    assert fuzz_server.grpc_port is not None
    with Peer(fuzz_server.grpc_port) as p:
        p.handshake()
        p.call(1)
        while (f := p.next()) is not None and not (f.stream_id == 1 and f.flags & h2.END_STREAM):
            pass
        assert f is not None
    assert [r.getMessage() for r in crashes] == []
