"""perfkit.wire.http_pool and HttpClient's infer path against tiny scripted HTTP servers on loopback, on
asyncio's loop and on uvloop's (the one perfkit's commands run on)."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import trustme

from perfkit.errors import PerfkitError
from perfkit.target import TlsSpec
from perfkit.wire.client import HttpClient, make_client
from perfkit.wire.http_pool import BadResponse, ConnectFailed, ConnectionPool, Disconnected, Reply, encode_request
from perfkit.wire.replies import http_failure_kind
from v2kit import codec as v2

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]

OK_BODY = b'{"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1],"data":[1.0]}]}'


# --- a scripted server -------------------------------------------------------------------------------

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
#: Answers one request (its head and body); returns False to stop serving the connection.
Answer = Callable[[Reader, Writer, bytes, bytes], Awaitable[bool]]


class Stub:
    """An HTTP/1.1 server on 127.0.0.1 that answers every request with `answer`, and counts."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.open_now = self.open_most = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Stub:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 24)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: Reader, writer: Writer) -> None:
        self.connections += 1
        self.open_now += 1
        self.open_most = max(self.open_most, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                self.heads.append(head)
                self.bodies.append(body)
                if not await self.answer(reader, writer, head, body):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


def reply(body: bytes, status: str = "200 OK", *headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answering(data: bytes, *, keep: bool = True, delay_s: float = 0.0) -> Answer:
    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        if delay_s:
            await asyncio.sleep(delay_s)
        writer.write(data)
        await writer.drain()
        return keep

    return answer


def pool_for(stub: Stub, *, limit: int = 0, timeout_s: float = 5.0) -> ConnectionPool:
    return ConnectionPool("127.0.0.1", stub.port, ssl_context=None, limit=limit, timeout_s=timeout_s)


def request_bytes(body: bytes = b"{}") -> bytes:
    return encode_request("POST", "/v2/models/m/infer", {"Host": "127.0.0.1"}, body)


def ok(result: Reply) -> tuple[int, bytes]:
    status, _, body, sent_ns, first_ns, failure = result
    assert failure is None, failure
    assert 0 < sent_ns <= first_ns
    return status, body


# --- encoding ----------------------------------------------------------------------------------------


def test_a_request_is_encoded_once_with_its_framing() -> None:
    wire = encode_request("POST", "/v2/models/m/infer", {"Host": "h:1", "X-A": "b", "content-length": "99"}, b"xyz")
    assert wire == b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h:1\r\nX-A: b\r\nContent-Length: 3\r\n\r\nxyz"
    with pytest.raises(ValueError, match="line break"):
        encode_request("POST", "/", {"X-A": "b\r\nEvil: 1"}, b"")
    with pytest.raises(ValueError, match="not an HTTP token"):
        encode_request("POST", "/", {"Bad Name": "b"}, b"")


def test_the_client_puts_host_and_h_headers_on_every_request() -> None:
    client = HttpClient("127.0.0.1:8123", 5, {"Authorization": "Bearer t", "content-type": "x/y"}, (True, True), 0)
    tensor = v2.InferTensor("INPUT0", "FP32", [1, 2], np.zeros((1, 2), np.float32))
    prepared = client.prepare(v2.InferRequest("m", inputs=[tensor]))
    head, _, body = prepared.wire.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v2/models/m/infer HTTP/1.1"
    assert b"Host: 127.0.0.1:8123" in lines and b"Authorization: Bearer t" in lines
    assert b"content-type: x/y" in lines  # -H replaces ours, whatever its case
    assert body == prepared.payload and prepared.bytes_out == len(body)
    assert f"Content-Length: {len(body)}".encode() in lines
    bad = HttpClient("127.0.0.1:8123", 5, {"X-A": "1\n2"}, (True, True), 0)
    with pytest.raises(PerfkitError, match="-H: header X-A"):
        bad.prepare(v2.InferRequest("m", inputs=[tensor]))


# --- exchanges -----------------------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(reply(OK_BODY, "200 OK", "Inference-Header-Content-Length: 7"))) as stub:
            pool = pool_for(stub)
            for _ in range(5):
                status, header_length, body, *_ = await pool.exchange(request_bytes())
                assert (status, header_length, body) == (200, b"7", OK_BODY)
            await pool.close()
        assert stub.connections == 1 and len(stub.heads) == 5

    run(scenario())


def test_chunked_replies_are_reassembled(run: Runner[None]) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"

    async def scenario() -> None:
        async with Stub(answering(chunked)) as stub:
            pool = pool_for(stub)
            assert ok(await pool.exchange(request_bytes())) == (200, b"hello world")
            assert ok(await pool.exchange(request_bytes())) == (200, b"hello world")
            await pool.close()
        assert stub.connections == 1

    run(scenario())


def test_connection_close_is_honoured(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(reply(b"{}", "200 OK", "Connection: close"), keep=False)) as stub:
            pool = pool_for(stub)
            for _ in range(3):
                assert ok(await pool.exchange(request_bytes())) == (200, b"{}")
            await pool.close()
        assert stub.connections == 3

    run(scenario())


def test_a_body_that_ends_at_eof_is_read_whole(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", keep=False)) as stub:
            pool = pool_for(stub)
            assert ok(await pool.exchange(request_bytes())) == (200, b"until the end")
            await pool.close()

    run(scenario())


def test_four_mib_each_way(run: Runner[None]) -> None:
    big = bytes(range(256)) * (4 << 12)

    async def echo(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        writer.write(reply(body))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Stub(echo) as stub:
            pool = pool_for(stub)
            for _ in range(2):
                assert ok(await pool.exchange(request_bytes(big))) == (200, big)
            await pool.close()
        assert stub.bodies == [big, big]

    run(scenario())


def test_concurrent_exchanges_open_one_connection_each_up_to_the_limit(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(reply(b"{}"), delay_s=0.01)) as stub:
            pool = pool_for(stub)
            results = await asyncio.gather(*(pool.exchange(request_bytes()) for _ in range(6)))
            assert [ok(r) for r in results] == [(200, b"{}")] * 6
            await pool.close()
        assert stub.connections == 6
        async with Stub(answering(reply(b"{}"), delay_s=0.01)) as stub:
            capped = pool_for(stub, limit=2)
            results = await asyncio.gather(*(capped.exchange(request_bytes()) for _ in range(12)))
            assert [ok(r) for r in results] == [(200, b"{}")] * 12
            await capped.close()
        assert stub.connections == 2 and stub.open_most == 2


def test_waiting_for_a_capped_connection_counts_against_the_timeout(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(reply(b"{}"), delay_s=0.6)) as stub:
            pool = pool_for(stub, limit=1, timeout_s=0.3)
            first, second = await asyncio.gather(pool.exchange(request_bytes()), pool.exchange(request_bytes()))
            assert isinstance(failure_of(first), TimeoutError)
            assert isinstance(failure_of(second), TimeoutError) and second[3] == 0  # never sent
            await pool.close()
        # Only the first request reached the server. The second may still open the room the first's
        # closed connection left when its own deadline is a few ms later, and the stub may see that
        # connection before it sees the first one's close: its count of open connections proves
        # nothing here (the cap itself is tested above).
        assert len(stub.heads) == 1

    run(scenario())


# --- failures ----------------------------------------------------------------------------------------


def failure_of(result: Reply) -> BaseException:
    failure = result[5]
    assert failure is not None, result
    return failure


def test_garbage_is_a_bad_response_and_the_connection_is_dropped(run: Runner[None]) -> None:
    answers = iter([b"\x00\xffnot http at all\r\n\r\n", reply(b"{}")])

    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        writer.write(next(answers))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Stub(answer) as stub:
            pool = pool_for(stub)
            assert isinstance(failure_of(await pool.exchange(request_bytes())), BadResponse)
            assert ok(await pool.exchange(request_bytes())) == (200, b"{}")
            await pool.close()
        assert stub.connections == 2

    run(scenario())


def test_a_timeout_is_enforced_and_the_connection_not_reused(run: Runner[None]) -> None:
    delays = iter([5.0, 0.0])

    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        await asyncio.sleep(next(delays))
        writer.write(reply(b"{}"))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Stub(answer) as stub:
            pool = pool_for(stub, timeout_s=0.2)
            started = time.monotonic()
            assert isinstance(failure_of(await pool.exchange(request_bytes())), TimeoutError)
            assert 0.15 < time.monotonic() - started < 2.0
            assert ok(await pool.exchange(request_bytes())) == (200, b"{}")
            await pool.close()
        assert stub.connections == 2

    run(scenario())


def test_a_reset_mid_body_is_a_connection_reset(run: Runner[None]) -> None:
    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        writer.transport.abort()
        return False

    async def scenario() -> None:
        async with Stub(answer) as stub:
            pool = pool_for(stub)
            assert isinstance(failure_of(await pool.exchange(request_bytes())), ConnectionResetError)
            await pool.close()

    run(scenario())


def test_a_hang_up_before_or_during_the_reply(run: Runner[None]) -> None:
    answers = iter([b"", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"])

    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        writer.write(next(answers))
        await writer.drain()
        return False  # then close cleanly

    async def scenario() -> None:
        async with Stub(answer) as stub:
            pool = pool_for(stub)
            assert isinstance(failure_of(await pool.exchange(request_bytes())), Disconnected)
            assert isinstance(failure_of(await pool.exchange(request_bytes())), BadResponse)  # truncated body
            await pool.close()

    run(scenario())


def test_a_cancelled_exchange_drops_its_half_read_connection(run: Runner[None]) -> None:
    async def scenario() -> None:
        async with Stub(answering(reply(b"{}"), delay_s=0.2)) as stub:
            pool = pool_for(stub)
            task = asyncio.ensure_future(pool.exchange(request_bytes()))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ok(await pool.exchange(request_bytes())) == (200, b"{}")
            await pool.close()
        assert stub.connections == 2

    run(scenario())


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (TimeoutError(), "timeout"),
        (Disconnected(), "disconnected"),
        (BadResponse(), "bad response"),
        (ConnectFailed(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), "connection refused"),
        (ConnectFailed(socket.gaierror(socket.EAI_NONAME, "unknown")), "name resolution failed"),
        (ConnectFailed(ssl.SSLCertVerificationError("bad certificate")), "tls error"),
        (ConnectFailed(OSError(errno.EHOSTUNREACH, "unreachable")), "connection failed"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "connection reset"),
        (BrokenPipeError(errno.EPIPE, "pipe"), "connection reset"),
        (ssl.SSLError("bad record"), "tls error"),
        (OSError(errno.ENETDOWN, "down"), "connection error"),
        (RuntimeError("?"), "client error"),
    ],
)
def test_failures_map_to_the_kinds_reports_count(failure: BaseException, kind: str) -> None:
    assert http_failure_kind(failure) == kind


# --- through HttpClient: the error kinds reports count ------------------------------------------------


def infer_request() -> v2.InferRequest:
    return v2.InferRequest("m", inputs=[v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))])


def test_client_outcomes_and_their_kinds(run: Runner[None]) -> None:
    header = b'{"outputs":[{"name":"O","parameters":{"binary_data_size":4}}]}'
    answers = iter(
        [
            reply(header + b"abcd", "200 OK", f"Inference-Header-Content-Length: {len(header)}"),
            reply(header + b"ab", "200 OK", f"Inference-Header-Content-Length: {len(header)}"),  # short
            reply(v2.error_body("busy"), "503 Service Unavailable"),
            b"\x13\x37 garbage\r\n\r\n",
        ]
    )

    async def answer(reader: Reader, writer: Writer, head: bytes, body: bytes) -> bool:
        writer.write(next(answers, b""))
        await writer.drain()
        return True

    async def scenario() -> None:
        async with Stub(answer) as stub:
            client = make_client(f"127.0.0.1:{stub.port}", "http", headers={"X-Perfkit": "1"})
            prepared = client.prepare(infer_request())
            outcomes = [await client.send(prepared) for _ in range(4)]
            await client.close()
        assert [o.error for o in outcomes] == ["", "bad response", "HTTP 503", "bad response"]
        assert outcomes[2].message == "busy"
        good = outcomes[0]
        assert good.bytes_in == len(header) + 4 and good.send_ns > 0 and good.recv_ns > 0
        assert all(b"X-Perfkit: 1" in head for head in stub.heads)

    run(scenario())


def test_client_kinds_for_a_closed_port_and_a_timeout(run: Runner[None]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]

    async def scenario() -> None:
        refused = make_client(f"127.0.0.1:{closed_port}", "http")
        outcome = await refused.send(refused.prepare(infer_request()))
        assert (outcome.error, outcome.bytes_in, outcome.send_ns) == ("connection refused", 0, 0)
        await refused.close()
        async with Stub(answering(reply(b"{}"), delay_s=5)) as stub:
            slow = make_client(f"127.0.0.1:{stub.port}", "http", request_timeout_s=0.2)
            outcome = await slow.send(slow.prepare(infer_request()))
            assert outcome.error == "timeout" and outcome.send_ns > 0
            await slow.close()

    run(scenario())


# --- HTTPS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    folder = tmp_path_factory.mktemp("ca")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    other.cert_pem.write_to_path(str(folder / "other.pem"))
    return ca, folder / "ca.pem", folder / "other.pem"


def test_https_verified_unverified_and_untrusted(run: Runner[None], ca_files: tuple[trustme.CA, Path, Path]) -> None:
    ca, ca_pem, other_pem = ca_files
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)

    async def scenario() -> None:
        stub = Stub(answering(reply(OK_BODY)))
        stub.server = await asyncio.start_server(stub._serve, "127.0.0.1", 0, ssl=server_context)
        try:
            url = f"https://127.0.0.1:{stub.port}"
            kinds = []
            for tls in (
                TlsSpec(https_ca_certs=ca_pem),
                TlsSpec(https_verify_peer=False),
                TlsSpec(https_ca_certs=other_pem),
            ):
                client = make_client(url, "http", tls=tls)
                kinds.append((await client.send(client.prepare(infer_request()))).error)
                await client.close()
        finally:
            await stub.__aexit__()
        assert kinds == ["", "", "tls error"]
        assert len(stub.bodies) == 2 and stub.bodies[0].startswith(b'{"inputs":[{"name":"INPUT0"')

    run(scenario())
