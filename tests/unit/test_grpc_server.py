"""reference_server.frontends.grpc.server at the frame level, with a scripted servicer on loopback: what real
gRPC clients rarely do (small windows, CONTINUATION, compression, resets, bad prefaces) and what
they always need (SETTINGS, PING, trailers), on asyncio's loop and on uvloop's."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import hpack
import pytest
from tritonclient.grpc import service_pb2 as pb

from reference_server.config import config_from_args
from reference_server.frontends.auth import Token
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.workers.frontends import build_grpc
from tests.waiting import eventually
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

T = TypeVar("T")

SERVICE = "/inference.GRPCInferenceService/"
FRAME = struct.Struct(">HBBBL")


class Servicer:
    """Answers ServerMetadata with a name as long as asked; holds ModelInfer until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.cancelled = 0

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="x" * 100_000, version="1")

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return pb.ModelInferResponse(model_name=request.model_name)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        async for request in requests:
            await context.write(pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id)))

    def __getattr__(self, name: str) -> Any:
        async def unimplemented(request: Any, context: Any) -> Any:
            raise AssertionError(f"{name} is not scripted")

        return unimplemented


class Peer:
    """A raw HTTP/2 client: sends frames, reads them back one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int, settings: bytes = b"") -> Peer:
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        peer.writer.write(h2.PREFACE + frame(h2.SETTINGS, 0, 0, settings))
        return peer

    def headers_block(self, method: str, **extra: str) -> bytes:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "x")]
        fields += [("content-type", "application/grpc"), ("te", "trailers"), *extra.items()]
        return bytes(self.encoder.encode(fields))

    def call(self, stream_id: int, method: str, message: bytes, *, end: bool = True, flag: int = 0) -> None:
        body = bytes((flag,)) + len(message).to_bytes(4, "big") + message
        self.writer.write(
            frame(h2.HEADERS, h2.END_HEADERS, stream_id, self.headers_block(method))
            + frame(h2.DATA, h2.END_STREAM if end else 0, stream_id, body)
        )

    async def read_frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        high, low, ftype, flags, stream_id = FRAME.unpack(head)
        return ftype, flags, stream_id, await self.reader.readexactly(high << 8 | low)

    async def until(self, stream_id: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """Headers, DATA and trailers of `stream_id`, skipping the connection's own frames."""
        headers: dict[str, str] = {}
        data = b""
        while True:
            ftype, flags, sid, payload = await self.read_frame()
            if sid != stream_id:
                continue
            if ftype == h2.DATA:
                data += payload
            elif ftype == h2.HEADERS:
                fields = {str(k): str(v) for k, v in self.decoder.decode(payload)}
                if flags & h2.END_STREAM:
                    return headers, data, fields
                headers = fields
            elif ftype == h2.RST_STREAM:
                return headers, data, {"reset": str(int.from_bytes(payload, "big"))}

    def close(self) -> None:
        self.writer.close()


async def start(servicer: Any, **options: Any) -> tuple[GrpcServer, int]:
    server = GrpcServer(servicer, max_message_bytes=options.pop("max_message_bytes", 1 << 20), **options)
    return server, await server.listen("127.0.0.1", 0)


def test_settings_ping_and_a_unary_call(run: Any) -> None:
    async def main() -> tuple[list[int], bytes, dict[str, str], bytes]:
        server, port = await start(Servicer())
        peer = await Peer.connect(port)
        peer.writer.write(frame(h2.PING, 0, 0, b"8 bytes!"))
        first = [(await peer.read_frame())[0] for _ in range(4)]  # SETTINGS, WINDOW_UPDATE, ACK, PING ACK
        peer.call(1, "ServerLive", b"")
        headers, data, trailers = await peer.until(1)
        peer.close()
        await server.stop(1)
        return sorted(first), headers[":status"].encode(), trailers, data

    kinds, status, trailers, data = run(main())
    assert kinds == sorted([h2.SETTINGS, h2.WINDOW_UPDATE, h2.SETTINGS, h2.PING])
    assert status == b"200" and trailers["grpc-status"] == "0"
    assert pb.ServerLiveResponse.FromString(data[5:]).live


def test_an_answer_waits_for_the_clients_window(run: Any) -> None:
    async def main() -> tuple[int, int]:
        server, port = await start(Servicer())
        # A 1000-byte stream window: the 100 KB answer must wait for WINDOW_UPDATEs.
        peer = await Peer.connect(port, struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 1000))
        peer.call(1, "ServerMetadata", b"")
        received = 0
        while True:
            ftype, flags, sid, payload = await peer.read_frame()
            if sid == 1 and ftype == h2.DATA:
                assert len(payload) <= 1000
                received += len(payload)
                increment = len(payload).to_bytes(4, "big")  # the stream's window and the connection's
                peer.writer.write(frame(h2.WINDOW_UPDATE, 0, 1, increment) + frame(h2.WINDOW_UPDATE, 0, 0, increment))
            if sid == 1 and ftype == h2.HEADERS and flags & h2.END_STREAM:
                break
        peer.close()
        await server.stop(1)
        return received, len(pb.ServerMetadataResponse(name="x" * 100_000, version="1").SerializeToString())

    received, size = run(main())
    assert received == size + 5


def test_headers_in_continuation_frames(run: Any) -> None:
    async def main() -> dict[str, str]:
        server, port = await start(Servicer())
        peer = await Peer.connect(port)
        block = peer.headers_block("ServerLive", **{"x-padding": "p" * 40_000})
        parts = [block[i : i + 16_384] for i in range(0, len(block), 16_384)]
        frames = frame(h2.HEADERS, 0, 1, parts[0])
        frames += b"".join(frame(h2.CONTINUATION, h2.END_HEADERS if p is parts[-1] else 0, 1, p) for p in parts[1:])
        peer.writer.write(frames + frame(h2.DATA, h2.END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
        _, _, trailers = await peer.until(1)
        peer.close()
        await server.stop(1)
        return trailers

    assert run(main())["grpc-status"] == "0"


@pytest.mark.parametrize(
    "method,message,flag,code,fragment",
    [
        ("ServerLive", b"", 1, 13, "Compressed-Flag"),  # INTERNAL: flagged, but no grpc-encoding
        ("ServerLive", b"x" * 2000, 0, 8, "larger than max (2000 vs. 1000)"),  # RESOURCE_EXHAUSTED
        ("NoSuchMethod", b"", 0, 12, "Method not found"),
        ("ServerMetadata", b"", 0, 8, "Sent message larger than max"),
    ],
)
def test_calls_that_cannot_be_served_end_with_a_status(
    run: Any, method: str, message: bytes, flag: int, code: int, fragment: str
) -> None:
    async def main() -> dict[str, str]:
        server, port = await start(Servicer(), max_message_bytes=1000)
        peer = await Peer.connect(port)
        peer.call(1, method, message, flag=flag)
        _, _, trailers = await peer.until(1)
        peer.call(3, "ServerLive", b"")  # the connection goes on
        assert (await peer.until(3))[2]["grpc-status"] == "0"
        peer.close()
        await server.stop(1)
        return trailers

    trailers = run(main())
    assert trailers["grpc-status"] == str(code) and fragment in trailers["grpc-message"]


def test_the_token_is_wanted_but_not_by_health(run: Any) -> None:
    async def main() -> tuple[str, str]:
        server, port = await start(Servicer(), token=Token("s3cret"))
        peer = await Peer.connect(port)
        peer.call(1, "ServerMetadata", b"")
        peer.call(3, "ServerLive", b"")
        refused = (await peer.until(1))[2]["grpc-status"]
        health = (await peer.until(3))[2]["grpc-status"]
        peer.close()
        await server.stop(1)
        return refused, health

    assert run(main()) == ("16", "0")  # UNAUTHENTICATED, OK


def test_a_reset_cancels_the_call(run: Any) -> None:
    servicer = Servicer()

    async def main() -> int:
        server, port = await start(servicer)
        peer = await Peer.connect(port)
        peer.call(1, "ModelInfer", pb.ModelInferRequest(model_name="m").SerializeToString())
        await eventually(lambda: servicer.started == 1)
        peer.writer.write(frame(h2.RST_STREAM, 0, 1, h2.CANCEL.to_bytes(4, "big")))
        await eventually(lambda: servicer.cancelled == 1)
        peer.close()
        await server.stop(1)
        return servicer.cancelled

    assert run(main()) == 1


def test_a_stream_answers_each_request_in_turn(run: Any) -> None:
    async def main() -> list[str]:
        server, port = await start(Servicer())
        peer = await Peer.connect(port)
        peer.writer.write(frame(h2.HEADERS, h2.END_HEADERS, 1, peer.headers_block("ModelStreamInfer")))
        ids = []
        for n in range(3):
            message = pb.ModelInferRequest(id=f"r{n}").SerializeToString()
            # Each message split over two DATA frames.
            body = b"\x00" + len(message).to_bytes(4, "big") + message
            peer.writer.write(frame(h2.DATA, 0, 1, body[:3]) + frame(h2.DATA, 0, 1, body[3:]))
            while True:
                ftype, _, sid, payload = await peer.read_frame()
                if sid == 1 and ftype == h2.DATA:
                    ids.append(pb.ModelStreamInferResponse.FromString(payload[5:]).infer_response.id)
                    break
        peer.writer.write(frame(h2.DATA, h2.END_STREAM, 1))
        _, _, trailers = await peer.until(1)
        assert trailers["grpc-status"] == "0"
        peer.close()
        await server.stop(1)
        return ids

    assert run(main()) == ["r0", "r1", "r2"]


def _limited(*flags: str) -> dict[str, Any]:
    """GrpcServer's HTTP/2 options as `build_grpc` gives them, from the server's command line."""
    config = config_from_args(["--model-repository", "unused", *flags])
    server = build_grpc(config, cast(Any, SimpleNamespace(tracing=None)), None)
    return {"max_streams": server.max_streams, "h2_limits": server.h2_limits}


def test_streams_past_the_flags_limit_are_refused(run: Any) -> None:
    async def main() -> tuple[int | None, str, str]:
        server, port = await start(Servicer(), **_limited("--grpc-http2-max-concurrent-streams", "2"))
        peer = await Peer.connect(port)
        _, _, _, settings = await peer.read_frame()
        advertised = dict(struct.iter_unpack(">HL", settings)).get(h2.MAX_CONCURRENT_STREAMS)
        message = pb.ModelInferRequest(model_name="m").SerializeToString()
        for n in range(3):
            peer.call(2 * n + 1, "ModelInfer", message)
        _, _, third = await peer.until(5)
        peer.call(7, "ServerLive", b"")  # still two open: refused too
        _, _, fourth = await peer.until(7)
        peer.close()
        await server.stop(0)
        return advertised, third["reset"], fourth["reset"]

    refused = str(h2.REFUSED_STREAM)
    assert run(main()) == (2, refused, refused)


@pytest.mark.parametrize("flags", [(), ("--grpc-http2-max-header-block-size", "200")], ids=["default", "200"])
def test_a_header_block_over_the_flags_limit_ends_the_connection(run: Any, flags: tuple[str, ...]) -> None:
    async def main() -> tuple[int, int] | str:
        server, port = await start(Servicer(), **_limited(*flags))
        peer = await Peer.connect(port)
        peer.writer.write(
            frame(
                h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, peer.headers_block("ServerLive", **{"x-pad": "p" * 300})
            )
        )
        try:
            while True:
                ftype, _, sid, payload = await peer.read_frame()
                if ftype == h2.GOAWAY:
                    return struct.unpack_from(">LL", payload)
                if ftype == h2.HEADERS and sid == 1 and "grpc-status" in dict(peer.decoder.decode(payload)):
                    return "answered"
        finally:
            peer.close()
            await server.stop(0)

    assert run(main()) == ("answered" if not flags else (0, h2.PROTOCOL_ERROR))


def test_a_client_that_is_not_http2_gets_goaway(run: Any) -> None:
    async def main() -> tuple[int, int]:
        server, port = await start(Servicer())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        peer = Peer(reader, writer)
        kinds = []
        while True:
            try:
                ftype, _, _, payload = await peer.read_frame()
            except asyncio.IncompleteReadError:
                break
            kinds.append(ftype)
            if ftype == h2.GOAWAY:
                code = int.from_bytes(payload[4:8], "big")
        writer.close()
        await server.stop(0)
        return kinds[-1], code

    assert run(main()) == (h2.GOAWAY, h2.PROTOCOL_ERROR)


def test_stop_lets_a_call_in_progress_finish(run: Any) -> None:
    servicer = Servicer()

    async def main() -> dict[str, str]:
        server, port = await start(servicer)
        peer = await Peer.connect(port)
        peer.call(1, "ModelInfer", pb.ModelInferRequest(model_name="m").SerializeToString())
        await eventually(lambda: servicer.started == 1)
        asyncio.get_running_loop().call_later(0.2, servicer.release.set)
        await server.stop(5)
        _, _, trailers = await peer.until(1)
        peer.close()
        return trailers

    assert run(main())["grpc-status"] == "0"


def test_a_call_past_its_deadline_is_cancelled_and_told_so(run: Any) -> None:
    servicer = Servicer()

    async def main() -> tuple[dict[str, str], dict[str, str], int]:
        server, port = await start(servicer)
        peer = await Peer.connect(port)
        message = pb.ModelInferRequest(model_name="m").SerializeToString()
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        for stream_id, timeout in ((1, "200m"), (3, "60S")):
            block = peer.headers_block("ModelInfer", **{"grpc-timeout": timeout})
            peer.writer.write(
                frame(h2.HEADERS, h2.END_HEADERS, stream_id, block) + frame(h2.DATA, h2.END_STREAM, stream_id, body)
            )
        expired = (await peer.until(1))[2]
        cancelled = servicer.cancelled
        servicer.release.set()  # the call with a minute left is answered as usual
        answered = (await peer.until(3))[2]
        peer.close()
        await server.stop(1)
        return expired, answered, cancelled

    expired, answered, cancelled = run(main())
    assert expired["grpc-status"] == "4" and "Deadline" in expired["grpc-message"]  # DEADLINE_EXCEEDED
    assert answered["grpc-status"] == "0" and cancelled == 1


class Deaf(Servicer):
    """A ModelStreamInfer that never reads its requests."""

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        await self.release.wait()


def test_requests_a_stream_servicer_leaves_unread_count_against_the_connection(run: Any) -> None:
    async def main() -> dict[str, str]:
        server, port = await start(Deaf(), max_message_bytes=1000)
        peer = await Peer.connect(port)
        peer.writer.write(frame(h2.HEADERS, h2.END_HEADERS, 1, peer.headers_block("ModelStreamInfer")))
        message = pb.ModelInferRequest(id="x" * 200).SerializeToString()
        for _ in range(10):  # 2 KB queued, unread: over one largest message
            peer.writer.write(frame(h2.DATA, 0, 1, b"\x00" + len(message).to_bytes(4, "big") + message))
        _, _, trailers = await peer.until(1)
        peer.call(3, "ServerLive", b"")  # the connection goes on, its count back to nothing
        assert (await peer.until(3))[2]["grpc-status"] == "0"
        peer.close()
        await server.stop(1)
        return trailers

    trailers = run(main())
    assert trailers["grpc-status"] == "8" and "hold over 1005 bytes" in trailers["grpc-message"]


def test_a_unary_request_past_its_announced_length_is_refused_at_once(run: Any) -> None:
    async def main() -> dict[str, str]:
        server, port = await start(Servicer())
        peer = await Peer.connect(port)
        peer.call(1, "ServerLive", b"", end=False)  # a prefix announcing 0 bytes, the stream left open
        peer.writer.write(frame(h2.DATA, 0, 1, b"more"))
        _, _, trailers = await peer.until(1)
        peer.close()
        await server.stop(1)
        return trailers

    trailers = run(main())
    assert trailers["grpc-status"] == "8" and "announced length" in trailers["grpc-message"]


class Gated(Servicer):
    """A ModelStreamInfer that reads its requests only once released."""

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> None:
        await self.release.wait()
        async for _ in requests:
            pass


def _fill_window(peer: Peer, stream_id: int, window: int) -> None:
    """`window` bytes of DATA on `stream_id`: whole messages, one a frame."""
    message = pb.ModelInferRequest(id="x" * 16376).SerializeToString()
    body = b"\x00" + len(message).to_bytes(4, "big") + message
    assert len(body) == 16384 and window % 16384 == 0
    assert window <= 16 << 20, f"a {window}-byte stream window bounds nothing"  # it was 2 GiB - 1
    peer.writer.write(frame(h2.DATA, 0, stream_id, body) * (window // 16384))


async def _stream_window(peer: Peer) -> int:
    """The stream window the server's SETTINGS advertise."""
    while True:
        ftype, flags, _, payload = await peer.read_frame()
        if ftype == h2.SETTINGS and not flags & h2.ACK:
            settings = dict(struct.iter_unpack(">HL", payload))
            return int(settings[h2.INITIAL_WINDOW_SIZE])


def test_a_stream_is_given_its_window_back_as_its_servicer_reads(run: Any) -> None:
    async def main() -> tuple[int, list[int], list[int]]:
        servicer = Gated()
        server, port = await start(servicer, max_message_bytes=8 << 20)  # held bytes bounded past the window
        peer = await Peer.connect(port)
        try:
            window = await _stream_window(peer)
            peer.writer.write(frame(h2.HEADERS, h2.END_HEADERS, 1, peer.headers_block("ModelStreamInfer")))
            _fill_window(peer, 1, window)
            peer.writer.write(frame(h2.PING, 0, 0, b"8 bytes!"))
            unread: list[int] = []  # stream 1's WINDOW_UPDATEs while the servicer reads nothing
            while (kind := await peer.read_frame())[0] != h2.PING:
                if kind[0] == h2.WINDOW_UPDATE and kind[2] == 1:
                    unread.append(int.from_bytes(kind[3], "big"))
            servicer.release.set()
            while (kind := await peer.read_frame())[:3] != (h2.WINDOW_UPDATE, 0, 1):
                pass
        finally:
            servicer.release.set()
            peer.close()
            await server.stop(1)
        return window, unread, [int.from_bytes(kind[3], "big")]

    window, unread, read = run(main())
    assert unread == []  # all of it waits for the servicer: the client must wait too
    assert read == [window]  # the servicer took it all: all of it given back


def test_data_past_a_streams_window_is_a_flow_control_error(run: Any) -> None:
    async def main() -> tuple[dict[str, str], dict[str, str]]:
        servicer = Gated()
        server, port = await start(servicer, max_message_bytes=8 << 20)
        peer = await Peer.connect(port)
        try:
            window = await _stream_window(peer)
            peer.writer.write(frame(h2.HEADERS, h2.END_HEADERS, 1, peer.headers_block("ModelStreamInfer")))
            _fill_window(peer, 1, window)
            peer.writer.write(frame(h2.DATA, 0, 1, b"\x00"))  # one byte past what the server allowed
            _, _, reset = await peer.until(1)
            peer.call(3, "ServerLive", b"")  # the connection goes on
            _, _, after = await peer.until(3)
        finally:
            servicer.release.set()
            peer.close()
            await server.stop(1)
        return reset, after

    reset, after = run(main())
    assert reset == {"reset": str(h2.FLOW_CONTROL_ERROR)}
    assert after["grpc-status"] == "0"
