"""perfkit.wire.http_pool against hostile or broken HTTP/1.1 servers on loopback: a reply head without
end, an unbounded body, a 100 Continue loop, a reply trickled forever. Each must fail its request with
a clear, counted error, drop the connection, and hold no more than `perfkit.wire.limits` allows,
while the next request carries on. Every server here is bounded: it stops after BUDGET bytes or when
the client hangs up, and a hang fails the test (the `run` fixture's 20 s)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

from perfkit.errors import TargetError
from perfkit.wire.client import make_client
from perfkit.wire.http_pool import ConnectionPool, Reply, ReplyTooLarge, encode_request
from perfkit.wire.limits import MAX_CONTROL_REPLY, MAX_REPLY_BODY, MAX_REPLY_HEAD
from v2kit import codec as v2

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]

#: The most a hostile server here sends on one connection: far past every bound, so a client that
#: kept reading to the end would be the one that failed to stop.
BUDGET = 64 << 20
OK_BODY = b'{"model_name":"m","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1],"data":[1.0]}]}'
OK_REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_BODY), OK_BODY)

#: What the hostile server sends after a request's head: a first part, then `endless` over and over.
Script = tuple[bytes, Callable[[], Iterator[bytes]]]


def repeat(chunk: bytes) -> Callable[[], Iterator[bytes]]:
    return lambda: itertools.repeat(chunk)


class Hostile:
    """An HTTP/1.1 server on 127.0.0.1 whose first connection gets `script` after the first request's
    head; later connections get a good reply to every request. Counts what it sent."""

    def __init__(self, script: Script, *, pause_s: float = 0.0, budget: int = BUDGET) -> None:
        self.script = script
        self.budget = budget
        self.pause_s = pause_s  # between chunks: a trickle
        self.connections = 0
        self.sent = 0  # by the hostile connection
        self.stopped_by_client = False
        self.done = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Hostile:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        hostile = self.connections == 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                framing = head.lower().split(b"content-length: ")
                length = int(framing[1].split(b"\r\n")[0]) if len(framing) > 1 else 0
                await reader.readexactly(length)
                if not hostile:
                    writer.write(OK_REPLY)
                    await writer.drain()
                    continue
                first, endless = self.script
                writer.write(first)
                self.sent += len(first)
                for chunk in endless():
                    if self.sent >= self.budget:
                        return
                    if reader.at_eof() or writer.is_closing():
                        self.stopped_by_client = True
                        return
                    writer.write(chunk)
                    self.sent += len(chunk)
                    await writer.drain()
                    if self.pause_s:
                        await asyncio.sleep(self.pause_s)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.stopped_by_client = hostile or self.stopped_by_client
        finally:
            if hostile:
                self.done.set()
            writer.close()


def request() -> bytes:
    return encode_request("POST", "/v2/models/m/infer", {"Host": "127.0.0.1"}, b"{}")


def failure_of(result: Reply) -> BaseException:
    assert result[5] is not None, result
    return result[5]


async def refused(hostile: Hostile, pool: ConnectionPool) -> tuple[BaseException, float]:
    """The hostile exchange's failure and how long it took; then the pool carries on, on a new
    connection, and the hostile server saw the client hang up well before its budget."""
    started = time.monotonic()
    failure = failure_of(await pool.exchange(request()))
    took = time.monotonic() - started
    status, _, body, _, _, problem = await pool.exchange(request())
    assert (status, body, problem) == (200, OK_BODY, None)
    await asyncio.wait_for(hostile.done.wait(), 10)
    assert hostile.connections == 2
    assert hostile.stopped_by_client and hostile.sent < hostile.budget, hostile.sent
    return failure, took


def pool_to(hostile: Hostile, **limits: int) -> ConnectionPool:
    return ConnectionPool("127.0.0.1", hostile.port, ssl_context=None, limit=0, timeout_s=15.0, **limits)


HEADS: dict[str, Script] = {
    "endless header line": (b"HTTP/1.1 200 OK\r\nX-Endless: ", repeat(b"a" * 4096)),
    "endless headers": (b"HTTP/1.1 200 OK\r\n", lambda: (b"X-%d: value\r\n" % i for i in itertools.count())),
    "endless reason phrase": (b"HTTP/1.1 200 ", repeat(b"O" * 4096)),
    "100 Continue loop": (b"", repeat(b"HTTP/1.1 100 Continue\r\n\r\n" * 64)),
}


@pytest.mark.parametrize("case", list(HEADS))
def test_a_head_without_end_is_refused_past_the_head_limit(run: Runner[None], case: str) -> None:
    async def scenario() -> None:
        async with Hostile(HEADS[case]) as hostile:
            pool = pool_to(hostile)
            failure, took = await refused(hostile, pool)
            await pool.close()
        assert isinstance(failure, ReplyTooLarge) and f"head is over {MAX_REPLY_HEAD} bytes" in str(failure)
        assert ("interim" in str(failure)) == (case == "100 Continue loop")
        assert took < 10  # long before the request's deadline

    run(scenario())


def test_a_content_length_past_the_body_limit_is_refused_before_the_body(run: Runner[None]) -> None:
    ten_gb = 10 * 10**9
    script: Script = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % ten_gb, repeat(b"\0" * 65536))

    async def scenario() -> None:
        async with Hostile(script) as hostile:
            pool = pool_to(hostile)
            failure, _ = await refused(hostile, pool)
            await pool.close()
        assert isinstance(failure, ReplyTooLarge)
        assert f"announces {ten_gb} body bytes, over the {MAX_REPLY_BODY}" in str(failure)

    run(scenario())


BODIES: dict[str, Script] = {
    "chunked without end": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        repeat(b"10000\r\n" + b"\0" * 65536 + b"\r\n"),
    ),
    "until the server closes": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", repeat(b"\0" * 65536)),
}


@pytest.mark.parametrize("case", list(BODIES))
def test_a_body_without_end_is_refused_past_the_body_limit(run: Runner[None], case: str) -> None:
    cap = 1 << 20  # the default (1 GiB) would take a second or two of loopback per run

    async def scenario() -> None:
        async with Hostile(BODIES[case]) as hostile:
            pool = pool_to(hostile, max_body=cap)
            failure, _ = await refused(hostile, pool)
            await pool.close()
        assert isinstance(failure, ReplyTooLarge) and f"body is over the {cap} bytes" in str(failure)

    run(scenario())


def test_a_body_at_the_limit_is_taken_whole(run: Runner[None]) -> None:
    cap = 1 << 20
    body = bytes(range(256)) * (cap // 256)

    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for offset in range(0, cap, 65536):
                writer.write(b"10000\r\n" + body[offset : offset + 65536] + b"\r\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        pool = ConnectionPool(
            "127.0.0.1", server.sockets[0].getsockname()[1], ssl_context=None, limit=0, timeout_s=10, max_body=cap
        )
        status, _, got, _, _, failure = await pool.exchange(request())
        await pool.close()
        server.close()
        await server.wait_closed()
        assert (status, failure, got == body) == (200, None, True)

    run(scenario())


TRICKLES: dict[str, Script] = {
    "the head": (b"HTTP/1.1 200 OK\r\n", repeat(b"X")),
    "the body": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n", repeat(b"x")),
}


@pytest.mark.parametrize("case", list(TRICKLES))
def test_a_reply_trickled_forever_times_out(run: Runner[None], case: str) -> None:
    async def scenario() -> None:
        async with Hostile(TRICKLES[case], pause_s=0.01) as hostile:
            pool = ConnectionPool("127.0.0.1", hostile.port, ssl_context=None, limit=0, timeout_s=0.3)
            started = time.monotonic()
            failure = failure_of(await pool.exchange(request()))
            assert isinstance(failure, TimeoutError)
            assert 0.25 < time.monotonic() - started < 5
            await asyncio.wait_for(hostile.done.wait(), 10)
            assert hostile.stopped_by_client
            await pool.close()

    run(scenario())


def test_the_client_counts_an_oversized_reply_as_a_bad_response(run: Runner[None]) -> None:
    script: Script = (b"HTTP/1.1 200 OK\r\nX-Endless: ", repeat(b"a" * 4096))

    async def scenario() -> None:
        async with Hostile(script) as hostile:
            client = make_client(f"127.0.0.1:{hostile.port}", "http", request_timeout_s=15.0)
            try:
                tensor = v2.InferTensor("INPUT0", "FP32", [1], np.zeros(1, np.float32))
                prepared = client.prepare(v2.InferRequest("m", inputs=[tensor]))
                outcome = await client.send(prepared)
                assert outcome.error == "bad response" and "head is over" in outcome.message, outcome
                assert (await client.send(prepared)).error == ""  # carries on, on a new connection
            finally:
                await client.close()

    run(scenario())


CONTROL: dict[str, Script] = {
    "a 10 GB Content-Length": (b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n", repeat(bytes(65536))),
    "chunked without end": BODIES["chunked without end"],
}


@pytest.mark.parametrize("case", list(CONTROL))
def test_a_control_plane_answer_without_end_is_refused(run: Runner[None], case: str) -> None:
    """Metadata, config, statistics and the like go through aiohttp: bounded too (MAX_CONTROL_REPLY)."""

    async def scenario() -> None:
        async with Hostile(CONTROL[case], budget=2 * MAX_CONTROL_REPLY) as hostile:
            client = make_client(f"127.0.0.1:{hostile.port}", "http", request_timeout_s=15.0)
            try:
                with pytest.raises(TargetError, match=f"the answer is over {MAX_CONTROL_REPLY} bytes"):
                    await client.server_metadata()
            finally:
                await client.close()
            await asyncio.wait_for(hostile.done.wait(), 10)
        assert hostile.stopped_by_client and hostile.sent < hostile.budget

    run(scenario())
