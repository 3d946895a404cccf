"""perfkit.wire.grpc.channel against hostile or broken HTTP/2 servers on loopback: an endless header
block, a reply message past the size a call takes, DATA past the message its prefix announced, and
PING or SETTINGS floods from a server that reads none of the answers. Each must fail its call with a
clear, counted status and hold no more than `perfkit.wire.limits` allows; a call that fails alone
leaves its connection serving. Each runs on asyncio's loop and on uvloop's. Every server here is
bounded: it stops after BUDGET bytes or when the client hangs up, and never outlives its test."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import hpack
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from perfkit.errors import TargetError
from perfkit.wire.client import make_client
from perfkit.wire.grpc.channel import MALFORMED, Channel
from perfkit.wire.limits import MAX_CONTROL_REPLY, MAX_REPLY_BODY
from v2kit import codec as v2

INFER = "/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
OK, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE = 0, 4, 8, 14
CANCEL, ENHANCE_YOUR_CALM = 8, 11
T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]  # tests/unit/conftest.py's `run`: asyncio's loop, then uvloop's
BUDGET = 64 << 20  # the most a hostile server here sends on one connection


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream_id.to_bytes(4, "big") + payload


@dataclass
class Peer:
    """The server's side of one connection, driven by a test's script; counts what it sent."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    sent: int = 0
    resets: list[tuple[int, int]] = field(default_factory=list)  # (stream, code) of the client's RST_STREAMs

    async def handshake(self, **settings: int) -> None:
        assert await self.reader.readexactly(len(PREFACE)) == PREFACE
        ids = {"initial_window_size": 4}
        await self.send(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HL", ids[k], v) for k, v in settings.items())))

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        length, ftype, flags, sid = int.from_bytes(head[:3], "big"), head[3], head[4], int.from_bytes(head[5:], "big")
        payload = await self.reader.readexactly(length)
        if ftype == RST_STREAM:
            self.resets.append((sid & 0x7FFFFFFF, int.from_bytes(payload, "big")))
        return ftype, flags, sid & 0x7FFFFFFF, payload

    async def request(self) -> int:
        """The next whole request's stream id."""
        while True:
            ftype, flags, sid, _ = await self.frame()
            if ftype in (HEADERS, DATA) and flags & END_STREAM:
                return sid

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        self.sent += len(data)
        await self.writer.drain()

    def headers(self, sid: int, flags: int = END_HEADERS) -> bytes:
        block = self.encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        return frame(HEADERS, flags, sid, block)

    def trailers(self, sid: int) -> bytes:
        return frame(HEADERS, END_HEADERS | END_STREAM, sid, self.encoder.encode([("grpc-status", "0")]))

    async def respond(self, sid: int, message: bytes) -> None:
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        data = b"".join(frame(DATA, 0, sid, body[i : i + 16384]) for i in range(0, len(body), 16384))
        await self.send(self.headers(sid) + data + self.trailers(sid))

    async def until_reset(self) -> None:
        while not self.resets:
            await self.frame()

    async def flood(self, chunk: bytes) -> None:
        """Send `chunk` over and over until the client hangs up (or BUDGET: the test then fails)."""
        while self.sent < BUDGET:
            await self.send(chunk)


Script = Callable[[Peer], Awaitable[None]]


@dataclass
class Server:
    port: int
    peers: list[Peer] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[Server]:
    """Runs `script` for each connection; its failures (but the client hanging up) fail the test."""
    failures: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        peer = Peer(reader, writer)
        state.peers.append(peer)
        try:
            await script(peer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except BaseException as exc:
            failures.append(exc)
        finally:
            writer.close()
            state.done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state = Server(server.sockets[0].getsockname()[1])
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
async def channel_to(server: Server, **limits: int) -> AsyncIterator[Channel]:
    channel = Channel("127.0.0.1", server.port, **limits)
    try:
        yield channel
    finally:
        await channel.close()


async def serve_then_answer(peer: Peer, hostile: Callable[[Peer, int], Awaitable[None]]) -> None:
    """The first call gets `hostile`; later ones on the same connection a good reply."""
    await peer.handshake()
    await hostile(peer, await peer.request())
    while True:
        await peer.respond(await peer.request(), b"after")


# --- a reply's message --------------------------------------------------------------------------------


def test_a_message_announced_past_the_limit_is_refused_at_its_prefix(run: Runner[None]) -> None:
    async def scenario() -> None:
        huge = 0xFFFFFFFF

        async def hostile(peer: Peer, sid: int) -> None:
            await peer.send(peer.headers(sid) + frame(DATA, 0, sid, b"\x00" + huge.to_bytes(4, "big")))
            while not peer.resets:  # the client gives up on the stream at once: more would be dropped
                await peer.frame()

        async with scripted(lambda peer: serve_then_answer(peer, hostile)) as server, channel_to(server) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
            after = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
        assert (call.status, call.details) == (
            RESOURCE_EXHAUSTED,
            f"received message larger than max ({huge} vs. {MAX_REPLY_BODY})",
        )
        assert server.peers[0].resets == [(1, CANCEL)]
        assert (after.status, after.message, len(server.peers)) == (OK, b"after", 1)  # the connection serves on

    run(scenario())


@pytest.mark.parametrize("announced", [2 << 20, 10])
def test_data_past_the_limit_or_past_its_message_fails_the_call_as_it_comes(run: Runner[None], announced: int) -> None:
    async def scenario() -> None:
        cap = 1 << 20
        chunk = b"\0" * 16384

        async def hostile(peer: Peer, sid: int) -> None:
            await peer.send(peer.headers(sid) + frame(DATA, 0, sid, b"\x00" + announced.to_bytes(4, "big")))
            reset = asyncio.ensure_future(peer.until_reset())
            while not reset.done() and peer.sent < BUDGET:  # DATA without end, until the client resets the stream
                await peer.send(frame(DATA, 0, sid, chunk))
                await asyncio.sleep(0)
            await reset

        script = lambda peer: serve_then_answer(peer, hostile)  # noqa: E731
        async with scripted(script) as server, channel_to(server, max_message=cap) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
            after = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
        if announced > cap:
            assert (call.status, call.details) == (
                RESOURCE_EXHAUSTED,
                f"received message larger than max ({announced} vs. {cap})",
            )
        else:
            assert call.status == MALFORMED
            assert call.details == "the reply's DATA runs past the 10-byte message its prefix announced"
        assert (after.status, after.message) == (OK, b"after")
        assert server.peers[0].sent < 8 << 20  # refused within a few frames, not after the budget

    run(scenario())


def test_a_message_at_the_limit_is_taken_whole(run: Runner[None]) -> None:
    async def scenario() -> None:
        cap = 1 << 20
        message = bytes(range(256)) * (cap // 256)

        async def script(peer: Peer) -> None:
            await peer.handshake()
            await peer.respond(await peer.request(), message)
            await peer.reader.read()

        async with scripted(script) as server, channel_to(server, max_message=cap) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
        assert (call.status, call.message == message) == (OK, True), call.details

    run(scenario())


def test_a_byte_of_a_reply_in_a_large_read_does_not_pin_the_read(run: Runner[None]) -> None:
    async def scenario() -> None:
        held: list[object] = []

        async def script(peer: Peer) -> None:
            await peer.handshake()
            sid = await peer.request()
            # One byte of the reply, then 256 KiB of frames of an unknown type (ignored, RFC 9113
            # §5.5): the byte is all the client keeps of the read, and must not keep the read.
            filler = frame(0xFA, 0, 0, bytes(16384)) * 16
            await peer.send(peer.headers(sid) + frame(DATA, 0, sid, b"\x00") + filler + frame(PING, 0, 0, bytes(8)))
            while (await peer.frame())[:2] != (PING, ACK):  # the client has handled all of it
                pass
            (call,) = channel._connection.h2.streams.values()  # type: ignore[union-attr]
            held.extend(call.chunks)
            await peer.send(frame(DATA, 0, sid, (2).to_bytes(4, "big") + b"ok") + peer.trailers(sid))
            await peer.reader.read()

        async with scripted(script) as server, channel_to(server) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
        assert (call.status, call.message) == (OK, b"ok"), call.details
        assert held == [b"\x00"]
        assert all(type(chunk) is bytes for chunk in held), "a byte of the reply kept a 256 KiB read in memory"

    run(scenario())


# --- header blocks and floods ---------------------------------------------------------------------------


def test_an_endless_header_block_fails_the_connection(run: Runner[None]) -> None:
    async def scenario() -> None:
        async def script(peer: Peer) -> None:
            await peer.handshake()
            sid = await peer.request()
            await peer.send(peer.headers(sid, flags=0))  # no END_HEADERS: CONTINUATIONs follow, without end
            await peer.flood(frame(CONTINUATION, 0, sid, b"\x00\x01a\x01b" * 3000))

        async with scripted(script) as server, channel_to(server) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=10))
            await asyncio.wait_for(server.done.wait(), 10)
        assert call.status == UNAVAILABLE and "header block over" in call.details, call.details
        assert server.peers[0].sent < 16 << 20

    run(scenario())


def test_empty_continuations_without_end_cost_the_call_its_deadline_not_memory(run: Runner[None]) -> None:
    """Empty CONTINUATIONs grow no header block; the call's deadline ends the wait (or the engine,
    should it bound the frames of one block, the connection)."""

    async def scenario() -> None:
        async def script(peer: Peer) -> None:
            await peer.handshake()
            sid = await peer.request()
            await peer.send(peer.headers(sid, flags=0))
            await peer.flood(frame(CONTINUATION, 0, sid) * 4096)

        async with scripted(script) as server:
            loop = asyncio.get_running_loop()
            async with channel_to(server) as channel:
                started = loop.time()
                call = await channel.call(channel.encode(INFER, b"m", timeout_s=0.3))
                took = loop.time() - started
            await asyncio.wait_for(server.done.wait(), 10)
        assert call.status in (DEADLINE_EXCEEDED, UNAVAILABLE), call.details
        assert took < 5
        assert server.peers[0].sent < BUDGET  # the client hung up when closed: it did not read on forever

    run(scenario())


FLOODS = {
    "PING": frame(PING, 0, 0, b"12345678") * 2048,
    "SETTINGS": frame(SETTINGS, 0, 0) * 4096,
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_a_flood_of_frames_to_answer_from_a_server_that_reads_none_is_cut_off(run: Runner[None], kind: str) -> None:
    async def scenario() -> None:
        async def script(peer: Peer) -> None:
            await peer.handshake()
            await peer.request()
            await peer.flood(FLOODS[kind])  # and never reads again

        async with scripted(script) as server, channel_to(server) as channel:
            call = await channel.call(channel.encode(INFER, b"m", timeout_s=15))
            await asyncio.wait_for(server.done.wait(), 15)
        assert call.status == UNAVAILABLE and "floods us with frames to answer" in call.details, call.details
        assert server.peers[0].sent < BUDGET  # the client hung up: it did not read on forever

    run(scenario())


def test_a_large_request_to_a_slow_reader_is_no_flood(run: Runner[None]) -> None:
    """Our own request data backed up in the transport, and the data the server's windows let out
    while it reads slowly, with pings on the way, are not answers queued for a server that never
    reads: the call goes through."""

    async def scenario() -> None:
        request = b"\1" * (48 << 20)

        async def script(peer: Peer) -> None:
            await peer.handshake(initial_window_size=65535)
            await asyncio.sleep(0.2)  # let the client's buffer back up
            await peer.send(
                frame(WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big"))
                + frame(WINDOW_UPDATE, 0, 1, (1 << 30).to_bytes(4, "big"))
            )
            received = 0
            while True:
                ftype, flags, sid, payload = await peer.frame()
                if ftype == DATA:
                    received += len(payload)
                    if received % (4 << 20) < 16384:
                        await peer.send(frame(PING, 0, 0, b"slowslow"))
                        await asyncio.sleep(0.01)
                    if flags & END_STREAM:
                        break
            await peer.respond(sid, b"%d" % received)
            await peer.reader.read()

        async with scripted(script) as server, channel_to(server) as channel:
            call = await channel.call(channel.encode(INFER, request, timeout_s=15))
        assert (call.status, call.message) == (OK, b"%d" % (len(request) + 5)), call.details

    run(scenario())


# --- through perfkit's GrpcClient: the kinds reports count ----------------------------------------------


def test_the_client_counts_refused_replies_by_kind(run: Runner[None]) -> None:
    async def scenario() -> None:
        replies = iter([(0xFFFFFFFF, "grpc RESOURCE_EXHAUSTED"), (3, "bad response")])

        async def script(peer: Peer) -> None:
            await peer.handshake()
            while True:
                sid = await peer.request()
                announced, _ = next(replies)
                await peer.send(
                    peer.headers(sid) + frame(DATA, 0, sid, b"\x00" + announced.to_bytes(4, "big") + b"12345")
                )

        async with scripted(script) as server:
            client = make_client(f"127.0.0.1:{server.port}", "grpc", request_timeout_s=10.0)
            try:
                tensor = v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))
                prepared = client.prepare(v2.InferRequest("m", inputs=[tensor]))
                kinds = [(await client.send(prepared)).error for _ in range(2)]
            finally:
                await client.close()
        assert kinds == ["grpc RESOURCE_EXHAUSTED", "bad response"]

    run(scenario())


def test_a_control_plane_answer_past_its_limit_is_refused(run: Runner[None]) -> None:
    """Metadata, config, statistics and the like go through grpc.aio: its receive limit is MAX_CONTROL_REPLY."""

    async def scenario() -> None:
        huge = pb.ServerMetadataResponse(name="a" * (MAX_CONTROL_REPLY + 1)).SerializeToString()

        async def metadata(request: bytes, context: object) -> bytes:
            return huge

        handler = grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService", {"ServerMetadata": grpc.unary_unary_rpc_method_handler(metadata)}
        )
        server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = make_client(f"127.0.0.1:{port}", "grpc", request_timeout_s=10.0)
        try:
            with pytest.raises(TargetError, match="RESOURCE_EXHAUSTED"):
                await client.server_metadata()
        finally:
            await client.close()
            await server.stop(None)

    run(scenario())
