"""Compressed gRPC messages at the frame level (grpc/doc/compression.md): gzip and deflate requests
are inflated within the message limit and answered in their coding where the client accepts it;
an unknown coding is UNIMPLEMENTED with what the server accepts, a bomb RESOURCE_EXHAUSTED, a
broken stream INTERNAL, and the connection serves on after each."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.unit.test_content_codings import gzip_bomb
from tests.unit.test_grpc_server import Peer, Servicer, start
from v2kit.h2 import frames as h2
from v2kit.h2.frames import frame

INFER = pb.ModelInferRequest(model_name="m" * 300).SerializeToString()


def _send(peer: Peer, stream_id: int, method: str, body: bytes, flag: int, **headers: str) -> None:
    message = bytes((flag,)) + len(body).to_bytes(4, "big") + body
    parts = [message[i : i + 16_384] for i in range(0, len(message), 16_384)]  # the default SETTINGS_MAX_FRAME_SIZE
    data = b"".join(frame(h2.DATA, h2.END_STREAM if p is parts[-1] else 0, stream_id, p) for p in parts)
    peer.writer.write(frame(h2.HEADERS, h2.END_HEADERS, stream_id, peer.headers_block(method, **headers)) + data)


def _exchange(body: bytes, flag: int, method: str = "ModelInfer", **headers: str) -> tuple[Any, bytes, Any]:
    async def main() -> tuple[Any, bytes, Any]:
        servicer = Servicer()
        servicer.release.set()
        server, port = await start(servicer, max_message_bytes=1 << 20)
        peer = await Peer.connect(port)
        _send(peer, 1, method, body, flag, **headers)
        answer = await peer.until(1)
        peer.call(3, "ServerLive", b"")  # the connection goes on
        assert (await peer.until(3))[2]["grpc-status"] == "0"
        peer.close()
        await server.stop(1)
        return answer

    with asyncio.Runner() as runner:
        return runner.run(asyncio.wait_for(main(), 20))


@pytest.mark.parametrize(("coding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_compressed_request_is_answered_in_its_coding(coding: str, encode: Any) -> None:
    accepted = "identity,deflate,gzip"
    headers, data, trailers = _exchange(encode(INFER), 1, **{"grpc-encoding": coding, "grpc-accept-encoding": accepted})
    assert trailers["grpc-status"] == "0", trailers
    assert headers["grpc-encoding"] == coding and headers["grpc-accept-encoding"] == accepted
    assert data[0] == 1 and int.from_bytes(data[1:5], "big") == len(data) - 5
    answer = pb.ModelInferResponse.FromString(zlib.decompress(data[5:], zlib.MAX_WBITS | 32))
    assert answer.model_name == "m" * 300


def test_a_client_that_does_not_accept_the_coding_is_answered_uncompressed() -> None:
    headers, data, trailers = _exchange(gzip.compress(INFER), 1, **{"grpc-encoding": "gzip"})
    assert trailers["grpc-status"] == "0" and "grpc-encoding" not in headers
    assert data[0] == 0 and pb.ModelInferResponse.FromString(data[5:]).model_name == "m" * 300


def test_an_unknown_coding_is_unimplemented_with_what_is_accepted() -> None:
    _, _, trailers = _exchange(b"xx", 1, **{"grpc-encoding": "br"})
    assert trailers["grpc-status"] == "12"  # UNIMPLEMENTED
    assert "'br'" in trailers["grpc-message"] and "gzip" in trailers["grpc-accept-encoding"]


def test_a_bomb_is_resource_exhausted_at_the_limit() -> None:
    bomb = gzip_bomb(64)  # 64 MiB inflated, ~64 KB on the wire, limit 1 MiB
    assert len(bomb) < 1 << 20
    _, _, trailers = _exchange(bomb, 1, **{"grpc-encoding": "gzip"})
    assert trailers["grpc-status"] == "8" and "larger than max" in trailers["grpc-message"]


def test_a_broken_stream_is_internal() -> None:
    _, _, trailers = _exchange(b"not gzip", 1, **{"grpc-encoding": "gzip"})
    assert trailers["grpc-status"] == "13" and "decompressing" in trailers["grpc-message"]


def test_streamed_requests_are_inflated_too() -> None:
    request = pb.ModelInferRequest(id="abc").SerializeToString()
    _, data, trailers = _exchange(zlib.compress(request), 1, "ModelStreamInfer", **{"grpc-encoding": "deflate"})
    assert trailers["grpc-status"] == "0"
    assert pb.ModelStreamInferResponse.FromString(data[5:]).infer_response.id == "abc"
