"""A client pointed at the wrong port of a Triton-like server says which port it found, against
real sockets on loopback: an HTTP client at a gRPC port (HTTP/2), a gRPC client at an HTTP/1.1
port, and either at the metrics port (HTTP/1.1 without the KServe v2 API). Each tiny server here
answers one way, whatever it is sent, and closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from perfkit.errors import TargetError
from perfkit.genai.endpoints import GenerativeClient
from perfkit.genai.tokenizer import ByteTokenizer
from perfkit.genai.workload import GenerativeSpec
from perfkit.wire.client import make_client
from perfkit.wire.sniff import HTTP1, HTTP2, Spoken, read_spoken, wrong_port_hint

SETTINGS_FRAME = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"  # an HTTP/2 server preface


@contextlib.asynccontextmanager
async def answering(answer: bytes, first: bool = False) -> AsyncIterator[str]:
    """A loopback server that writes `answer` (at once if `first`, else once the client has sent
    something), then closes; yields its HOST:PORT."""

    tasks: set[asyncio.Task[None]] = set()

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not first:
                await asyncio.wait_for(reader.read(1024), 5)
            writer.write(answer)
            await writer.drain()
            await asyncio.sleep(0.05)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.get_running_loop().create_task(answer_once(reader, writer)))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_the_first_bytes_say_which_protocol() -> None:
    assert read_spoken(SETTINGS_FRAME) == Spoken(HTTP2)
    assert read_spoken(b"HTTP/1.1 404 Not Found\r\n") == Spoken(HTTP1, 404)
    assert read_spoken(b"HTTP/1.0 200 OK\r\n") == Spoken(HTTP1, 200)
    assert read_spoken(b"SSH-2.0-OpenSSH\r\n") is None and read_spoken(b"") is None
    assert wrong_port_hint(Spoken(HTTP1, 200), "http") is None  # the right protocol: some other failure
    assert wrong_port_hint(None, "grpc") is None


async def test_an_http_client_at_a_grpc_port_says_use_grpc() -> None:
    async with answering(SETTINGS_FRAME, first=True) as url:
        client = make_client(url, "http")
        try:
            with pytest.raises(TargetError) as caught:
                await client.live()
        finally:
            await client.close()
    assert str(caught.value) == (
        f"-u {url}: this port speaks HTTP/2 (gRPC?): use -i grpc, or the server's HTTP port (usually 8000)"
    )
    assert "\\x00" not in str(caught.value)


async def test_an_http_client_at_the_metrics_port_says_it_is_not_kserve() -> None:
    async with answering(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n") as url:
        client = make_client(url, "http")
        try:
            with pytest.raises(TargetError, match="answers HTTP but not the KServe v2 API .404 on /v2/health/live.: "
                               "is it the metrics port. the server's HTTP port is usually 8000"):  # fmt: skip
                await client.live()
        finally:
            await client.close()


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (200, "this port speaks HTTP/1.1: use -i http, or the server's gRPC port (usually 8001)"),
        (404, "this port speaks HTTP/1.1 but not the KServe v2 API: is it the metrics port?"),
    ],
)
async def test_a_grpc_client_at_an_http_port_says_use_http(status: int, words: str) -> None:
    async with answering(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode()) as url:
        client = make_client(url, "grpc", request_timeout_s=10)
        try:
            with pytest.raises(TargetError) as caught:
                await client.live()
        finally:
            await client.close()
    assert str(caught.value).startswith(f"-u {url}: {words}"), caught.value


async def test_a_generative_client_at_a_grpc_port_says_use_grpc() -> None:
    async with answering(SETTINGS_FRAME, first=True) as url:
        client = GenerativeClient(url, GenerativeSpec(endpoint_type="chat"), ByteTokenizer())
        try:
            with pytest.raises(TargetError, match=r"this port speaks HTTP/2 \(gRPC\?\): use -i grpc"):
                await client.live()
        finally:
            await client.close()
