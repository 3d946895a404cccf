"""Hostile HTTP/2 clients against the server's gRPC port, the server in its own process so that its
resident memory can be measured (psutil): floods of frames to answer from a client that never
reads, a unary body that runs far past its announced message, and rapid reset (CVE-2023-44487).
Raw sockets on loopback, bounded in bytes and in time; each asserts RFC 9113's answer and, where
the attack is about memory, that the server's RSS grew by less than a stated limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from perfkit.target import ServerProcess, reference_server_process
from tests.h2peer import Peer, request_fields
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

pytestmark = pytest.mark.integration

INFER = "/inference.GRPCInferenceService/ModelInfer"
#: RSS growth allowed. Unbounded, 1M PING ACKs held ~12 MiB and 64 MiB of DATA ~68 MiB; bounded,
#: the server holds at most 1000 answers and one message, a few hundred KiB.
FLOOD_GROWTH_MB = 6.0
BODY_GROWTH_MB = 16.0
#: 1000 streams holding 1 byte each, every byte alone in a 256 KiB read: held as views, the calls
#: pinned every read whole, 244 MiB (reads as short as 32 KiB would still pin 31 MiB); copied out,
#: they hold their bytes and their state, 0.35 MiB for the 1000.
PINNED_GROWTH_MB = 16.0


@pytest.fixture(scope="module")
def server(demo_repository: Path) -> Iterator[ServerProcess]:
    with reference_server_process(demo_repository) as running:
        yield running


def rss_mb(server: ServerProcess) -> float:
    return float(psutil.Process(server.process.pid).memory_info().rss) / 2**20


def grpc_port(server: ServerProcess) -> int:
    return server.ports["GRPCInferenceService"]


def still_serves(server: ServerProcess) -> None:
    with Peer(grpc_port(server)) as p:
        p.handshake()
        p.call(1)
        while (f := p.next()) is not None:
            if f.type == h2.HEADERS and f.flags & h2.END_STREAM:
                assert p.fields(f)["grpc-status"] == "0"
                return
            if f.type == h2.HEADERS:
                p.fields(f)
        raise AssertionError("the server closed a good connection")


@pytest.mark.parametrize("flood", [frame(h2.PING, 0, 0, bytes(8)), frame(h2.SETTINGS, 0, 0)], ids=["PING", "SETTINGS"])
def test_a_flood_from_a_client_that_never_reads_is_cut_off(server: ServerProcess, flood: bytes) -> None:
    before = rss_mb(server)
    with Peer(grpc_port(server), timeout_s=30, receive_buffer=4096) as p:
        p.handshake()
        burst = flood * 10_000
        # The server gives up on the connection (ENHANCE_YOUR_CALM; its unread answers dropped)
        # once its answers back up: our writes fail once it is gone. What we sent last may still
        # be in the sockets' buffers when we stop, so the flood goes on until then, or 3M frames.
        for _ in range(300):
            p.send(burst)
            if p.closed:
                break
        assert p.closed, "3M frames were taken while their answers went unread"
    assert rss_mb(server) - before < FLOOD_GROWTH_MB
    still_serves(server)


def test_a_unary_body_past_its_announced_message_is_refused_and_not_kept(server: ServerProcess) -> None:
    before = rss_mb(server)
    with Peer(grpc_port(server), timeout_s=30) as p:
        p.handshake()
        p.headers(1, request_fields(INFER))
        p.send(frame(h2.DATA, 0, 1, b"\x00" + (10).to_bytes(4, "big") + bytes(10)))  # 10 bytes, as announced
        chunk = frame(h2.DATA, 0, 1, bytes(16384)) * 64  # 1 MiB
        for _ in range(64):  # then 64 MiB more
            p.send(chunk)
        assert not p.closed  # the connection goes on: only the call failed
        grown = rss_mb(server) - before
        trailers, reset = None, None
        while trailers is None or reset is None:
            f = p.next()
            assert f is not None, "the server closed the connection"
            if f.type == h2.HEADERS and f.stream_id == 1:
                trailers = p.fields(f)
            elif f.type == h2.RST_STREAM and f.stream_id == 1:
                reset = f.code()
        assert trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        assert reset == h2.NO_ERROR  # RST_STREAM after the trailers: "we read no more" (PROTOCOL-HTTP2.md)
        p.call(3)
        while (f := p.next()) is not None and not (f.stream_id == 3 and f.flags & h2.END_STREAM):
            if f.type == h2.HEADERS:
                p.fields(f)
        assert f is not None, "the connection did not go on"
    assert grown < BODY_GROWTH_MB


def test_a_few_bytes_per_stream_in_large_reads_do_not_pin_the_reads(server: ServerProcess) -> None:
    before = rss_mb(server)
    with Peer(grpc_port(server), timeout_s=30) as p:
        p.handshake()
        block = p.block(request_fields(INFER))
        # Each stream's byte rides with 256 KiB of frames of an unknown type, which the server
        # reads and ignores (RFC 9113 §5.5): one counted byte per read.
        filler = frame(0xFA, 0, 0, bytes(16384)) * 16
        for sid in range(1, 2 * 1000, 2):
            p.send(frame(h2.HEADERS, h2.END_HEADERS, sid, block) + frame(h2.DATA, 0, sid, b"\x00") + filler)
        p.ping()  # answered once all before it is read
        while (f := p.next()) is not None and not (f.type == h2.PING and f.flags & h2.ACK):
            assert f.type != h2.GOAWAY and f.type != h2.RST_STREAM, f
        assert f is not None, "the server closed the connection"
        grown = rss_mb(server) - before
    assert grown < PINNED_GROWTH_MB
    still_serves(server)


def test_rapid_reset_ends_the_connection_with_enhance_your_calm(server: ServerProcess) -> None:
    with Peer(grpc_port(server), timeout_s=30) as p:
        p.handshake()
        block = p.block(request_fields(INFER))
        cancel = h2.CANCEL.to_bytes(4, "big")
        p.send(
            b"".join(
                frame(h2.HEADERS, h2.END_HEADERS, sid, block) + frame(h2.RST_STREAM, 0, sid, cancel)
                for sid in range(1, 2 * 2000, 2)
            )
        )
        while (f := p.next()) is not None:
            if f.type == h2.GOAWAY:
                assert f.code() == h2.ENHANCE_YOUR_CALM
                break
        else:
            raise AssertionError("the connection closed without GOAWAY")
    still_serves(server)


def test_streams_reset_at_a_human_pace_are_fine(server: ServerProcess) -> None:
    with Peer(grpc_port(server)) as p:
        p.handshake()
        block = p.block(request_fields(INFER))
        for sid in range(1, 2 * 100, 2):
            p.send(frame(h2.HEADERS, h2.END_HEADERS, sid, block) + frame(h2.RST_STREAM, 0, sid, bytes(4)))
        p.call(1001)
        while (f := p.next()) is not None and not (f.stream_id == 1001 and f.flags & h2.END_STREAM):
            assert f.type != h2.GOAWAY
        assert f is not None
