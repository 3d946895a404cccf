"""perfkit.wire.grpc.channel: unary gRPC calls over its own HTTP/2 connection, against the reference server's
gRPC front end (grpcio's server) and against a scripted HTTP/2 peer for the misbehaviour a real
server rarely shows (GOAWAY, RST_STREAM, trailers-only, small windows, garbage, stalls). Loopback
only; every scripted peer stops with its test."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hpack
import numpy as np
import pytest
import trustme
import uvloop
from tritonclient.grpc import service_pb2 as pb

from perfkit.errors import PerfkitError
from perfkit.testing import TritonProcess, write_sleeper
from perfkit.wire.client import Outcome, make_client
from perfkit.wire.grpc.channel import MALFORMED, Channel
from reference_server.server import ReferenceServer
from tests.servers import running_triton
from v2kit import codec as v2
from v2kit.grpc_proto import request_to_proto
from v2kit.h2.frames import keeps_table
from v2kit.h2.receive import CONNECTION_WINDOW

INFER = "/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
OK, CANCELLED, NOT_FOUND, DEADLINE_EXCEEDED, UNAVAILABLE = 0, 1, 5, 4, 14


def infer_request(model: str, values: int) -> bytes:
    """A ModelInfer request for `model` with INPUT0, FP32 [1, values], holding 0, 1, 2, ..."""
    data = np.arange(values, dtype=np.float32).reshape(1, values)
    request = v2.InferRequest(model, inputs=[v2.InferTensor("INPUT0", "FP32", [1, values], data)])
    return bytes(request_to_proto(request).SerializeToString())


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream_id.to_bytes(4, "big") + payload


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


# --- a scripted HTTP/2 server ----------------------------------------------------------------------


@dataclass
class Peer:
    """The server's side of one connection, driven by a test's script."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)
    seen: list[tuple[int, int, int, bytes]] = field(default_factory=list)  # every frame the client sent

    async def handshake(self, **settings: int) -> None:
        """Read the client's preface, send our SETTINGS (by RFC 9113 name, lower case)."""
        assert await self.reader.readexactly(len(PREFACE)) == PREFACE
        ids = {"max_concurrent_streams": 3, "initial_window_size": 4, "max_frame_size": 5}
        payload = b"".join(struct.pack(">HL", ids[k], v) for k, v in settings.items())
        self.send(frame(SETTINGS, 0, 0, payload))

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        length, ftype, flags, stream_id = (
            int.from_bytes(head[:3], "big"),
            head[3],
            head[4],
            int.from_bytes(head[5:], "big"),
        )
        got = (ftype, flags, stream_id, await self.reader.readexactly(length))
        self.seen.append(got)
        return got

    async def request(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole request: (stream id, headers, body)."""
        headers: dict[int, dict[str, str]] = {}
        bodies: dict[int, bytearray] = {}
        while True:
            ftype, flags, stream_id, payload = await self.frame()
            if ftype == HEADERS:
                headers[stream_id] = dict(self.decoder.decode(payload))
                bodies[stream_id] = bytearray()
            elif ftype == DATA:
                bodies[stream_id] += payload
            if ftype in (HEADERS, DATA) and flags & END_STREAM:
                return stream_id, headers[stream_id], bytes(bodies[stream_id])

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def block(self, fields: list[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(fields))

    def respond(self, stream_id: int, message: bytes, status: int = 0, details: str = "") -> None:
        trailers = [("grpc-status", str(status))] + ([("grpc-message", details)] if details else [])
        self.send(
            frame(
                HEADERS, END_HEADERS, stream_id, self.block([(":status", "200"), ("content-type", "application/grpc")])
            )
            + frame(DATA, 0, stream_id, grpc_message(message))
            + frame(HEADERS, END_HEADERS | END_STREAM, stream_id, self.block(trailers))
        )


Script = Callable[[Peer], Awaitable[None]]


@dataclass
class ScriptedServer:
    port: int
    connections: int = 0


@contextlib.asynccontextmanager
async def scripted_server(script: Script, tls: ssl.SSLContext | None = None) -> AsyncIterator[ScriptedServer]:
    """Runs `script` for each connection; its failures fail the test."""
    failures: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await script(Peer(reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away: the test says whether that was right
        except BaseException as exc:
            failures.append(exc)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    state = ScriptedServer(server.sockets[0].getsockname()[1])
    try:
        yield state
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
    if failures:
        raise failures[0]


@contextlib.asynccontextmanager
async def channel_to(server: ScriptedServer, context: ssl.SSLContext | None = None) -> AsyncIterator[Channel]:
    channel = Channel("127.0.0.1", server.port, context)
    try:
        yield channel
    finally:
        await channel.close()


async def answer_each(peer: Peer, **settings: int) -> None:
    """A well-behaved server: echo every request's body as the reply's message."""
    await peer.handshake(**settings)
    while True:
        stream_id, _, body = await peer.request()
        peer.respond(stream_id, body[5:])


# --- against the reference server's gRPC front end ---------------------------------------------------


async def roundtrip(port: int, values: int, calls: int) -> list[np.ndarray]:
    channel = Channel("127.0.0.1", port)
    try:
        encoded = channel.encode(INFER, infer_request("identity", values), timeout_s=10)
        results = await asyncio.gather(*(channel.call(encoded) for _ in range(calls)))
    finally:
        await channel.close()
    outputs = []
    for call in results:
        assert call.status == OK, call.details
        reply = pb.ModelInferResponse.FromString(call.message)
        outputs.append(np.frombuffer(reply.raw_output_contents[0], np.float32))
    return outputs


@pytest.mark.integration
async def test_concurrent_calls_to_the_reference_server(demo_server: ReferenceServer) -> None:
    assert demo_server.grpc_port is not None
    outputs = await roundtrip(demo_server.grpc_port, 256, 64)
    assert all(np.array_equal(out, np.arange(256, dtype=np.float32)) for out in outputs)


@pytest.mark.integration
async def test_messages_larger_than_every_window_go_both_ways(demo_server: ReferenceServer) -> None:
    # 8 MiB each way: far over grpcio's 64 KiB initial windows and 16 KiB frames.
    assert demo_server.grpc_port is not None
    (out,) = await roundtrip(demo_server.grpc_port, 2 << 20, 1)
    assert np.array_equal(out, np.arange(2 << 20, dtype=np.float32))


@pytest.mark.integration
def test_it_runs_on_uvloop(demo_server: ReferenceServer) -> None:
    assert demo_server.grpc_port is not None
    outputs = uvloop.run(roundtrip(demo_server.grpc_port, 16, 8))
    assert len(outputs) == 8


@pytest.mark.integration
async def test_a_server_error_carries_its_status_and_message(demo_server: ReferenceServer) -> None:
    channel = Channel("127.0.0.1", demo_server.grpc_port or 0)
    try:
        tensor = v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))
        message = request_to_proto(v2.InferRequest("nöpe", inputs=[tensor])).SerializeToString()
        call = await channel.call(channel.encode(INFER, message))
    finally:
        await channel.close()
    assert call.status == NOT_FOUND and "nöpe" in call.details  # grpc-message is percent-decoded UTF-8


# --- what the client sends ---------------------------------------------------------------------------


async def test_the_request_is_a_grpc_call_with_its_metadata_and_deadline() -> None:
    peers: list[Peer] = []
    seen: list[tuple[dict[str, str], bytes]] = []

    async def script(peer: Peer) -> None:
        peers.append(peer)
        await peer.handshake()
        for _ in range(2):
            stream_id, headers, body = await peer.request()
            seen.append((headers, body))
            peer.respond(stream_id, b"reply")

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode("/p.S/M", b"hello", [("authorization", "Bearer x")], timeout_s=2.5)
        calls = [await channel.call(encoded) for _ in range(2)]
    assert [(c.status, c.message) for c in calls] == [(OK, b"reply")] * 2
    assert all(c.sent_ns > 0 for c in calls)
    (headers, body), again = seen
    assert headers == {
        ":method": "POST", ":scheme": "http", ":path": "/p.S/M", ":authority": f"127.0.0.1:{server.port}",
        "te": "trailers", "grpc-timeout": "2500000u", "content-type": "application/grpc",
        "user-agent": "perfkit-grpc", "authorization": "Bearer x",
    }  # fmt: skip
    assert body == grpc_message(b"hello") and again == seen[0]
    frames = peers[0].seen
    # SETTINGS first, then one WINDOW_UPDATE that opens the connection window to its 16 MiB.
    assert frames[0][0] == SETTINGS and frames[1][:3] == (WINDOW_UPDATE, 0, 0)
    assert int.from_bytes(frames[1][3], "big") == CONNECTION_WINDOW - 65_535
    assert [stream_id for ftype, _, stream_id, _ in frames if ftype == HEADERS] == [1, 3]
    assert (SETTINGS, ACK, 0, b"") in frames  # our SETTINGS acknowledged


# --- replies ----------------------------------------------------------------------------------------


def ok_headers(peer: Peer, stream_id: int) -> bytes:
    return frame(
        HEADERS, END_HEADERS, stream_id, peer.block([(":status", "200"), ("content-type", "application/grpc")])
    )


def ok_trailers(peer: Peer, stream_id: int) -> bytes:
    return frame(HEADERS, END_HEADERS | END_STREAM, stream_id, peer.block([("grpc-status", "0")]))


async def test_every_kind_of_reply_settles_its_call() -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake()
        sid, _, _ = await peer.request()  # trailers-only, with a percent-encoded message
        fields = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "14")]
        peer.send(
            frame(HEADERS, END_HEADERS | END_STREAM, sid, peer.block([*fields, ("grpc-message", "busy%20%E2%9C%93")]))
        )
        sid, _, _ = await peer.request()  # an HTTP error without grpc-status
        peer.send(frame(HEADERS, END_HEADERS | END_STREAM, sid, peer.block([(":status", "503")])))
        sid, _, _ = await peer.request()
        peer.send(frame(RST_STREAM, 0, sid, (7).to_bytes(4, "big")))  # REFUSED_STREAM
        sid, _, _ = await peer.request()
        peer.send(frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big")))  # CANCEL
        sid, _, _ = await peer.request()  # the prefix says 10 bytes, 3 follow
        peer.send(ok_headers(peer, sid) + frame(DATA, 0, sid, b"\x00\x00\x00\x00\x0aabc") + ok_trailers(peer, sid))
        sid, _, _ = await peer.request()  # no grpc-status at all
        peer.send(ok_headers(peer, sid) + frame(DATA, END_STREAM, sid, grpc_message(b"x")))
        sid, _, _ = await peer.request()  # headers in three frames, a padded DATA frame, the message in two
        block = peer.block([(":status", "200"), ("content-type", "application/grpc"), ("x-long", "v" * 100)])
        message = grpc_message(b"fine")
        peer.send(
            frame(HEADERS, 0, sid, block[:5]) + frame(CONTINUATION, 0, sid, block[5:10])
            + frame(CONTINUATION, END_HEADERS, sid, block[10:])
            + frame(DATA, 0x8, sid, bytes([4]) + message[:3] + bytes(4)) + frame(DATA, 0, sid, message[3:])
            + ok_trailers(peer, sid)
        )  # fmt: skip
        await peer.request()

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        calls = [await channel.call(encoded) for _ in range(7)]
    assert server.connections == 1
    statuses = [(c.status, c.details) for c in calls]
    assert statuses[0] == (UNAVAILABLE, "busy \u2713")
    assert statuses[1] == (UNAVAILABLE, "the server answered HTTP status 503")
    assert statuses[2] == (UNAVAILABLE, "the server reset the stream (REFUSED_STREAM)")
    assert statuses[3] == (CANCELLED, "the server reset the stream (CANCEL)")
    assert statuses[4] == (MALFORMED, "the reply's message prefix says 10 bytes, 3 came")
    assert statuses[5] == (2, "the server ended the call without a grpc-status")  # UNKNOWN
    assert (calls[6].status, calls[6].message) == (OK, b"fine")


async def test_header_blocks_follow_the_servers_dynamic_table() -> None:
    """The server indexes every field: repeated blocks come as one-byte indexes (decoded from the
    cache), and each error's new grpc-message changes the table under them."""

    async def script(peer: Peer) -> None:
        await peer.handshake()
        for n in range(8):
            sid, _, _ = await peer.request()
            peer.respond(sid, b"r%d" % n, *((OK, "") if n % 3 else (NOT_FOUND, f"no model {n}")))

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        calls = [await channel.call(encoded) for _ in range(8)]
    expected = [(OK, "", b"r%d" % n) if n % 3 else (NOT_FOUND, f"no model {n}", b"") for n in range(8)]
    assert [(c.status, c.details, c.message) for c in calls] == expected


# --- flow control and limits ----------------------------------------------------------------------------


async def test_a_body_waits_for_the_servers_small_windows() -> None:
    body = bytes(range(256)) * 800  # 200 KiB: over the connection's 64 KiB too
    frames: list[int] = []

    async def script(peer: Peer) -> None:
        await peer.handshake(initial_window_size=1000)
        received = bytearray()
        stream_window, connection_window = 1000, 65_535
        while True:
            ftype, flags, sid, payload = await peer.frame()
            if ftype != DATA:
                continue
            assert len(payload) <= min(stream_window, connection_window, 16_384)
            frames.append(len(payload))
            stream_window -= len(payload)
            connection_window -= len(payload)
            received += payload
            if flags & END_STREAM:
                break
            if stream_window == 0:  # give it back in odd steps, the connection's only now and then
                peer.send(frame(WINDOW_UPDATE, 0, sid, (700).to_bytes(4, "big")))
                stream_window += 700
            if connection_window < 5000:
                peer.send(frame(WINDOW_UPDATE, 0, 0, (60_000).to_bytes(4, "big")))
                connection_window += 60_000
        assert bytes(received) == grpc_message(body)
        peer.respond(sid, b"done")
        await peer.reader.read()

    async with scripted_server(script) as server, channel_to(server) as channel:
        call = await channel.call(channel.encode(INFER, body, timeout_s=10))
    assert (call.status, call.message) == (OK, b"done"), call.details
    assert max(frames) == 1000 and len(frames) > len(body) // 1000


async def test_calls_wait_for_a_free_stream_and_pings_are_answered() -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(max_concurrent_streams=1)
        sid, _, _ = await peer.request()
        peer.respond(sid, b"warm")
        for n in range(3):
            sid, _, _ = await peer.request()
            # Whatever the client would send at once is in before its answer to this PING.
            peer.send(frame(PING, 0, 0, b"ping%04d" % n))
            while (ftype := (got := await peer.frame())[0]) != PING:
                assert ftype != HEADERS, "a second stream opened past MAX_CONCURRENT_STREAMS = 1"
            assert got[1] == ACK and got[3] == b"ping%04d" % n
            peer.respond(sid, b"%d" % n)
        await peer.reader.read()

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        assert (await channel.call(encoded)).message == b"warm"
        calls = await asyncio.gather(*(channel.call(encoded) for _ in range(3)))
    assert sorted(c.message for c in calls) == [b"0", b"1", b"2"]


# --- a connection's end ---------------------------------------------------------------------------------


async def test_goaway_fails_the_calls_it_left_out_and_the_next_call_reconnects() -> None:
    async def script(peer: Peer) -> None:
        if server.connections > 1:
            await answer_each(peer)
            return
        await peer.handshake()
        first, _, _ = await peer.request()
        await peer.request()
        peer.send(frame(GOAWAY, 0, 0, struct.pack(">LL", first, 0) + b"draining"))
        peer.respond(first, b"kept")
        assert await peer.reader.read() == b""  # the client closes it once its last call is done

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        kept, dropped = await asyncio.gather(channel.call(encoded), channel.call(encoded))
        again = await channel.call(encoded)
    assert (kept.status, kept.message) == (OK, b"kept")
    assert dropped.status == UNAVAILABLE and "(GOAWAY NO_ERROR: draining)" in dropped.details
    assert (again.status, again.message, server.connections) == (OK, b"m", 2)


async def test_a_connection_out_of_stream_ids_is_replaced() -> None:
    ids: list[list[int]] = []

    async def script(peer: Peer) -> None:
        ids.append([])
        await peer.handshake()
        while True:
            sid, _, body = await peer.request()
            ids[-1].append(sid)
            peer.respond(sid, body[5:])

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        assert (await channel.call(encoded)).status == OK
        assert channel._connection is not None
        channel._connection.h2.next_stream_id = 2**31 - 1  # the last odd id
        assert [(await channel.call(encoded)).status for _ in range(2)] == [OK, OK]
    assert ids == [[1, 2**31 - 1], [1]]


async def stall(peer: Peer) -> None:
    await peer.handshake()
    await peer.request()
    while True:
        await peer.frame()


async def test_a_stalled_call_times_out_and_is_reset() -> None:
    resets: list[bytes] = []

    async def script(peer: Peer) -> None:
        await peer.handshake()
        sid, _, _ = await peer.request()
        while (got := await peer.frame())[0] != RST_STREAM:
            pass
        resets.append(got[3])
        sid, _, body = await peer.request()  # the connection still serves
        peer.respond(sid, b"after")
        await peer.reader.read()

    async with scripted_server(script) as server, channel_to(server) as channel:
        loop = asyncio.get_running_loop()
        start = loop.time()
        late = await channel.call(channel.encode(INFER, b"m", timeout_s=0.2))
        elapsed = loop.time() - start
        after = await channel.call(channel.encode(INFER, b"m", timeout_s=5))
    assert (late.status, late.details) == (DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert 0.19 <= elapsed < 3
    assert resets == [(8).to_bytes(4, "big")]  # CANCEL
    assert (after.message, server.connections) == (b"after", 1)


async def test_a_cancelled_caller_resets_its_stream() -> None:
    requested, reset = asyncio.Event(), asyncio.Event()
    frames: list[tuple[int, int, int, bytes]] = []

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.request()
        requested.set()
        frames.append(await peer.frame())
        reset.set()

    async with scripted_server(script) as server, channel_to(server) as channel:
        task = asyncio.ensure_future(channel.call(channel.encode(INFER, b"m", timeout_s=5)))
        await asyncio.wait_for(requested.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(reset.wait(), 5)
    assert frames[0][0] == RST_STREAM and frames[0][3] == (8).to_bytes(4, "big")


async def test_a_closed_connection_fails_its_calls_and_the_next_call_reconnects() -> None:
    async def script(peer: Peer) -> None:
        if server.connections > 1:
            await answer_each(peer)
            return
        await peer.handshake()
        await peer.request()  # and hang up

    async with scripted_server(script) as server, channel_to(server) as channel:
        encoded = channel.encode(INFER, b"m", timeout_s=5)
        lost = await channel.call(encoded)
        again = await channel.call(encoded)
    assert (lost.status, lost.details) == (UNAVAILABLE, "the server closed the connection")
    assert (again.status, server.connections) == (OK, 2)


async def test_closing_does_not_wait_for_a_server_that_stopped_reading() -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(initial_window_size=2**31 - 1)
        peer.send(frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65_535).to_bytes(4, "big")))
        await asyncio.Event().wait()  # and never reads again

    async with scripted_server(script) as server:
        channel = Channel("127.0.0.1", server.port)
        task = asyncio.ensure_future(channel.call(channel.encode(INFER, bytes(32 << 20), timeout_s=30)))
        for _ in range(500):  # until the body is stuck in the client's write buffer
            await asyncio.sleep(0.01)
            connection = channel._connection
            if connection is not None and connection._transport and connection._transport.get_write_buffer_size():
                break
        loop = asyncio.get_running_loop()
        start = loop.time()
        await channel.close()
        assert loop.time() - start < 2
        assert (await task).status == UNAVAILABLE


@pytest.mark.parametrize("reply", [b"\x00\xff\xfe not a protocol reply \x00\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n"])
async def test_a_server_that_is_not_http2_fails_calls_at_once(reply: bytes) -> None:
    async def script(peer: Peer) -> None:
        peer.send(reply)
        await peer.reader.read()

    async with scripted_server(script) as server, channel_to(server) as channel:
        call = await channel.call(channel.encode(INFER, b"m", timeout_s=5))
    assert call.status == UNAVAILABLE and "it is not HTTP/2" in call.details


async def test_a_refused_connection_is_unavailable() -> None:
    async with scripted_server(stall) as server:
        port = server.port
    channel = Channel("127.0.0.1", port)
    call = await channel.call(channel.encode(INFER, b"m"))
    await channel.close()
    assert call.status == UNAVAILABLE and call.details.endswith("connection refused")


# --- TLS ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpn", [["h2"], None])
async def test_tls_needs_http2_by_alpn(alpn: list[str] | None) -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    if alpn:
        server_context.set_alpn_protocols(alpn)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)

    async def script(peer: Peer) -> None:
        await answer_each(peer)

    async with scripted_server(script, server_context) as server, channel_to(server, client_context) as channel:
        call = await channel.call(channel.encode(INFER, b"secret", timeout_s=5))
    if alpn:
        assert (call.status, call.message) == (OK, b"secret"), call.details
    else:
        assert call.status == UNAVAILABLE and "did not agree on HTTP/2 over TLS (ALPN gave None)" in call.details


# --- through perfkit's GrpcClient: the error kinds reports count ----------------------------------------------


async def reset_stream(peer: Peer) -> None:
    await peer.handshake()
    sid, _, _ = await peer.request()
    peer.send(frame(RST_STREAM, 0, sid, (7).to_bytes(4, "big")))
    await peer.reader.read()


async def bad_framing(peer: Peer) -> None:
    await peer.handshake()
    sid, _, _ = await peer.request()
    peer.send(ok_headers(peer, sid) + frame(DATA, 0, sid, b"\x01\x00\x00\x00\x00") + ok_trailers(peer, sid))
    await peer.reader.read()


async def not_a_message(peer: Peer) -> None:
    await peer.handshake()
    sid, _, _ = await peer.request()
    peer.respond(sid, b"\xff\xff\xff")
    await peer.reader.read()


async def hang_up_hard(peer: Peer) -> None:
    await peer.handshake()
    await peer.request()
    peer.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.writer.transport.abort()


async def garbage(peer: Peer) -> None:
    peer.send(b"\x00\xff\xfe this is not a protocol reply")
    await peer.reader.read()


KINDS: list[tuple[Script, str]] = [
    (reset_stream, "grpc UNAVAILABLE"),
    (bad_framing, "bad response"),
    (not_a_message, "bad response"),
    (stall, "timeout"),
    (hang_up_hard, "connection reset"),
    (garbage, "grpc UNAVAILABLE"),
]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(("script", "kind"), KINDS, ids=[script.__name__ for script, _ in KINDS])
def test_grpc_client_counts_failures_by_kind(script: Script, kind: str, loop: str) -> None:
    async def send_one() -> Outcome:
        async with scripted_server(script) as server:
            client = make_client(f"127.0.0.1:{server.port}", "grpc", request_timeout_s=0.3)
            try:
                tensor = v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))
                return await client.send(client.prepare(v2.InferRequest("m", inputs=[tensor])))
            finally:
                await client.close()

    outcome = uvloop.run(send_one()) if loop == "uvloop" else asyncio.run(send_one())
    assert outcome.error == kind, outcome
    assert outcome.message


@pytest.mark.parametrize(
    ("block", "keeps"),
    [
        ("be 00 0c 677270632d6d657373616765 00", True),  # indexed, then a literal without indexing
        ("88 c0 bf", True),
        ("10 01 61 01 62", True),  # never indexed
        ("88 40 01 61 01 62", False),  # a literal with incremental indexing
        ("20 88", False),  # a dynamic table size update
        ("00 05 61 62", False),  # cut short
    ],
)
def test_keeps_table_spots_blocks_that_change_the_dynamic_table(block: str, keeps: bool) -> None:
    assert keeps_table(bytes.fromhex(block)) is keeps


def test_encoded_calls_never_touch_the_dynamic_table() -> None:
    channel = Channel("example.com", 443, ssl.create_default_context())
    encoded = channel.encode(INFER, b"x" * 70_000, [("k", "v" * 200)], timeout_s=1e10)
    decoder = hpack.Decoder()
    fields = dict(decoder.decode(encoded.block))
    assert fields[":scheme"] == "https" and fields["k"] == "v" * 200
    assert fields["grpc-timeout"] == "2777778H"  # 8 digits at most: the unit grows
    assert len(decoder.header_table.dynamic_entries) == 0
    assert encoded.body[:5] == b"\x00" + (70_000).to_bytes(4, "big")
    assert encoded.largest_frame == len(encoded.body)


# --- against NVIDIA's tritonserver ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    repo = tmp_path_factory.mktemp("triton") / "models"
    write_sleeper(repo, "echo", service_ms=0)
    write_sleeper(repo, "slow", service_ms=500)
    # The sleepers' configs are complete: without auto-completion Triton starts no stub per model
    # just to ask it (about a second each, tests/servers.py).
    with running_triton(peers, repo, auto_complete=False) as server:
        yield server


@pytest.mark.integration
@pytest.mark.peers
async def test_tritonserver_answers_the_lean_client(triton: TritonProcess) -> None:
    channel = Channel("127.0.0.1", triton.grpc_port)
    try:
        small = channel.encode(INFER, infer_request("echo", 256), timeout_s=30)
        calls = await asyncio.gather(*(channel.call(small) for _ in range(64)))
        # 1 MiB each way: over Triton's 64 KiB stream window and 16 KiB frames.
        big = await channel.call(channel.encode(INFER, infer_request("echo", 1 << 18), timeout_s=30))
        missing = await channel.call(channel.encode(INFER, infer_request("nope", 4), timeout_s=30))
        late = await channel.call(channel.encode(INFER, infer_request("slow", 4), timeout_s=0.1))
        after = await channel.call(small)
    finally:
        await channel.close()
    for call, values in [*((c, 256) for c in calls), (big, 1 << 18), (after, 256)]:
        assert call.status == OK, call.details
        reply = pb.ModelInferResponse.FromString(call.message)
        assert np.array_equal(
            np.frombuffer(reply.raw_output_contents[0], np.float32), np.arange(values, dtype=np.float32)
        )
    assert missing.status == NOT_FOUND and "nope" in missing.details, (missing.status, missing.details)
    assert late.status == DEADLINE_EXCEEDED


def test_grpc_urls_need_a_host_and_a_port() -> None:
    for url in ("localhost", "localhost:http", ":8001", "127.0.0.1:70000"):
        with pytest.raises(PerfkitError, match=f"-u {re.escape(url)}: expected HOST:PORT for -i grpc"):
            make_client(url, "grpc")
    assert make_client("[::1]:8001", "grpc").url == "[::1]:8001"
