"""reference_server.frontends.http.server with a scripted handler on loopback, on asyncio's loop and on uvloop's
(the one the server runs on): framing, pipelining, limits, admission and shutdown, byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, TypeVar

import pytest

from reference_server.errors import Unavailable
from reference_server.frontends.http.limits import HttpLimits
from reference_server.frontends.http.pipelined_reads import PARSE_SLICE
from reference_server.frontends.http.server import MAX_PIPELINED, HttpRequest, HttpResponse, HttpServer
from tests.waiting import eventually

T = TypeVar("T")


async def echo(request: HttpRequest) -> HttpResponse:
    """Answers what it was asked, as JSON."""
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    payload = {
        "method": request.method,
        "path": request.path,
        "body": request.body.decode(),
        "headers": request.headers,
    }
    return HttpResponse(200, json.dumps(payload).encode(), "application/json")


class Slots:
    """An admission with `limit` slots that counts what is held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.taken = 0

    def acquire(self) -> None:
        if self.held >= self.limit:
            raise Unavailable("full")
        self.held += 1
        self.taken += 1

    def release(self) -> None:
        self.held -= 1


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def serve(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = await server.listen("127.0.0.1", 0)
    return await asyncio.open_connection("127.0.0.1", port)


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_pipelined_requests_are_answered_in_order(run: Any) -> None:
    async def main() -> list[str]:
        server = HttpServer(echo, max_body_bytes=1000)
        reader, writer = await serve(server)
        # The first is slow: the others, already read, must wait their turn.
        writer.write(post("/slow", b"a") + post("/b", b"bb") + post("/c", b"ccc"))
        paths = [json.loads((await read_response(reader))[2])["path"] for _ in range(3)]
        writer.close()
        await server.stop(1)
        return paths

    assert run(main()) == ["/slow", "/b", "/c"]


def test_headers_and_a_split_chunked_body_reach_the_handler(run: Any) -> None:
    async def main() -> dict[str, Any]:
        server = HttpServer(echo, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(
            b"POST /x?q=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nx-a: 2\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"2\r\nde\r\n0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == 200
        writer.close()
        await server.stop(1)
        return dict(json.loads(body))

    answer = run(main())
    assert answer["path"] == "/x" and answer["body"] == "abcde"
    assert answer["headers"]["x-a"] == "1, 2"


def test_expect_100_continue_gets_its_go_ahead(run: Any) -> None:
    async def main() -> bytes:
        server = HttpServer(echo, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"ok")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "ok"
        writer.close()
        await server.stop(1)
        return interim

    assert run(main()) == b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        post("/big", b"x" * 101),  # declared too large: refused before the body is read
        b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n" + b"x" * 64 + b"\r\n"
        b"40\r\n" + b"x" * 64 + b"\r\n0\r\n\r\n",  # grows past the limit
    ],
    ids=["content-length", "chunked"],
)
def test_a_body_over_the_limit_is_413_and_the_connection_closes(run: Any, request_bytes: bytes) -> None:
    async def main() -> tuple[int, dict[str, str], bytes, bytes]:
        server = HttpServer(echo, max_body_bytes=100)
        reader, writer = await serve(server)
        writer.write(request_bytes + post("/after", b""))
        status, headers, body = await read_response(reader)
        rest = await reader.read()  # the request after it is never read: the connection ends
        writer.close()
        await server.stop(1)
        return status, headers, body, rest

    status, headers, body, rest = run(main())
    assert status == 413 and headers["connection"] == "close" and rest == b""
    assert "--http-max-input-size" in json.loads(body)["error"]


def test_bytes_that_are_not_http_get_a_kserve_400_and_a_close(run: Any) -> None:
    async def main() -> tuple[int, dict[str, str], bytes]:
        server = HttpServer(echo, max_body_bytes=100)
        reader, writer = await serve(server)
        writer.write(b"\x16\x03\x01 this is no request line\r\n\r\n")
        answer = await read_response(reader)
        assert await reader.read() == b""
        writer.close()
        await server.stop(1)
        return answer

    status, headers, body = run(main())
    assert status == 400 and headers["connection"] == "close"
    assert headers["content-type"] == "application/json" and json.loads(body)["error"]


def test_http_1_0_and_connection_close_end_the_connection(run: Any) -> None:
    async def main() -> list[tuple[str, bytes]]:
        server = HttpServer(echo, max_body_bytes=100)
        port = await server.listen("127.0.0.1", 0)
        seen = []
        for raw in (b"GET /a HTTP/1.0\r\n\r\n", b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            _, headers, _ = await read_response(reader)
            seen.append((headers["connection"], await reader.read()))
            writer.close()
        await server.stop(1)
        return seen

    assert run(main()) == [("close", b""), ("close", b"")]


def test_admission_refuses_at_the_door_and_the_connection_goes_on(run: Any) -> None:
    slots = Slots(limit=1)

    async def main() -> list[int]:
        server = HttpServer(
            echo, max_body_bytes=1000, admission=slots, needs_slot=lambda method, url: url.startswith(b"/slow")
        )
        port = await server.listen("127.0.0.1", 0)
        first_reader, first_writer = await asyncio.open_connection("127.0.0.1", port)
        first_writer.write(post("/slow", b"1"))
        await eventually(lambda: slots.held == 1)  # the first holds the only slot
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/slow", b"2") + post("/free", b"3"))
        statuses = [(await read_response(reader))[0], (await read_response(reader))[0]]
        statuses.append((await read_response(first_reader))[0])
        for w in (writer, first_writer):
            w.close()
        await server.stop(1)
        return statuses

    assert run(main()) == [503, 200, 200]
    assert slots.held == 0 and slots.taken == 1


def test_a_slot_taken_for_a_body_that_never_comes_goes_back(run: Any) -> None:
    slots = Slots(limit=4)

    async def main() -> int:
        server = HttpServer(echo, max_body_bytes=1000, admission=slots, needs_slot=lambda method, url: True)
        reader, writer = await serve(server)
        writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await eventually(lambda: slots.held == 1)  # taken at the headers, with the body still to come
        writer.close()
        await eventually(lambda: slots.held == 0)
        await server.stop(1)
        return slots.taken

    assert run(main()) == 1


def test_a_body_that_stops_coming_is_408(run: Any) -> None:
    async def main() -> tuple[int, dict[str, str]]:
        server = HttpServer(echo, max_body_bytes=1000, body_timeout_s=0.2)
        reader, writer = await serve(server)
        writer.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        status, headers, _ = await read_response(reader)
        writer.close()
        await server.stop(1)
        return status, headers

    status, headers = run(main())
    assert status == 408 and headers["connection"] == "close"


def test_a_pipelining_flood_stops_being_read(run: Any) -> None:
    async def main() -> tuple[int, bool]:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, b"{}", "application/json")

        server = HttpServer(held, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(post("/x", b"") * (MAX_PIPELINED * 4))
        await writer.drain()
        await eventually(lambda: any(len(c._queue) > MAX_PIPELINED for c in server.connections))
        (connection,) = server.connections
        queued, paused = len(connection._queue), connection._paused
        gate.set()
        for _ in range(MAX_PIPELINED * 4):
            assert (await read_response(reader))[0] == 200
        writer.close()
        await server.stop(1)
        return queued, paused

    queued, paused = run(main())
    assert queued > MAX_PIPELINED and paused


def test_stop_lets_a_request_being_served_finish(run: Any) -> None:
    async def main() -> int:
        server = HttpServer(echo, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(post("/slow", b""))
        await eventually(lambda: server._serving == 1)
        await server.stop(5)
        status, _, _ = await read_response(reader)
        writer.close()
        return status

    assert run(main()) == 200


# -- hostile clients: the head's limits, its timer, the idle timer, write back-pressure, RFC 9112


def small_limits(**overrides: Any) -> HttpLimits:
    values: dict[str, Any] = {
        "max_request_line": 256,
        "max_header_line": 512,
        "max_head_bytes": 2048,
        "max_headers": 10,
        **overrides,
    }
    return HttpLimits(**values)


async def answer_to(server: HttpServer, raw: bytes) -> tuple[int, dict[str, str], bytes, bytes]:
    """The answer to `raw`, and what follows it before the connection ends."""
    reader, writer = await serve(server)
    writer.write(raw)
    status, headers, body = await read_response(reader)
    rest = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await server.stop(1)
    return status, headers, body, rest


@pytest.mark.parametrize(
    ("raw", "status", "flag"),
    [
        (b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "--http-max-request-line"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 600 + b"\r\n\r\n", 431, "--http-max-header-line"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-N: 1\r\n" * 10 + b"\r\n", 431, "--http-max-headers"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n"
            + b"X-Big: "
            + b"v" * 500
            + b"\r\n" * 1
            + (b"X-Big: " + b"v" * 500 + b"\r\n") * 4
            + b"\r\n",
            431,
            "--http-max-head-size",
        ),
    ],
    ids=["request-line", "header-line", "header-count", "head-size"],
)
def test_a_head_over_a_limit_is_refused_and_the_connection_closes(run: Any, raw: bytes, status: int, flag: str) -> None:
    server = HttpServer(echo, max_body_bytes=1000, limits=small_limits())
    # The request after it is never read: the connection ends with the refusal.
    got, headers, body, rest = run(answer_to(server, raw + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert (got, headers["connection"], rest) == (status, "close", b"")
    assert headers["content-type"] == "application/json" and flag in json.loads(body)["error"]


def test_limits_at_their_bounds_are_served(run: Any) -> None:
    limits = small_limits()
    target = b"/" + b"a" * (limits.max_request_line - 1)
    fields = b"".join(
        b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(limits.max_headers - 2)
    )  # with Host and Connection
    raw = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + fields + b"Connection: close\r\n\r\n"
    status, _, body, _ = run(answer_to(HttpServer(echo, max_body_bytes=1000, limits=limits), raw))
    assert status == 200 and json.loads(body)["path"] == target.decode()


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-limits", "one-byte-over"])
def test_a_head_split_into_one_byte_reads_is_held_to_the_same_limits(run: Any, over: int) -> None:
    """However llhttp is fed, a head at its limits is served and one byte more is refused."""
    limits = small_limits(max_head_bytes=100_000)
    line = b"X-Long: " + b"v" * (limits.max_header_line - len("X-Long") + over) + b"\r\n"
    raw = b"GET /a HTTP/1.1\r\n" + line + b"Host: x\r\nConnection: close\r\n\r\n"

    async def main() -> int:
        server = HttpServer(echo, max_body_bytes=1000, limits=limits)
        reader, writer = await serve(server)
        for byte in raw:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)  # let the server read it alone
        status, _, _ = await asyncio.wait_for(read_response(reader), 20)
        writer.close()
        await server.stop(1)
        return status

    assert run(main()) == (431 if over else 200)


@pytest.mark.parametrize("endless", [b"X-Endless: ", b"GET /"], ids=["header-value", "request-target"])
def test_an_endless_head_is_cut_off_while_it_streams(run: Any, endless: bytes) -> None:
    """The head never ends: the refusal comes while it streams, counted before llhttp has a line."""

    async def main() -> tuple[int, int, int]:
        server = HttpServer(echo, max_body_bytes=1000, limits=small_limits())
        reader, writer = await serve(server)
        start = b"GET / HTTP/1.1\r\nHost: x\r\n" if endless.startswith(b"X") else b""
        writer.write(start + endless)
        sent = 0

        async def stream() -> None:
            nonlocal sent
            piece = b"v" * 4096
            with contextlib.suppress(ConnectionError):
                while sent < 64 << 20:  # bounded: the server must have answered long before
                    writer.write(piece)
                    sent += len(piece)
                    await writer.drain()

        streamer = asyncio.get_running_loop().create_task(stream())
        status, _, _ = await asyncio.wait_for(read_response(reader), 20)
        streamer.cancel()
        held = max((c._meter.pending + len(c._url) for c in server.connections), default=0)
        writer.close()
        await server.stop(1)
        return status, sent, held

    status, sent, held = run(main())
    assert status == (414 if endless == b"GET /" else 431)
    # What the parser held when it was cut off: the limit, and at most one read past it (256 KiB on
    # both loops); the client's bytes beyond are in the kernel's buffers or never sent.
    assert sent < 64 << 20 and held <= 2048 + (256 << 10)


def test_a_trickled_head_is_408_after_the_head_timeout(run: Any) -> None:
    async def main() -> tuple[int, dict[str, str], float]:
        server = HttpServer(echo, max_body_bytes=1000, limits=HttpLimits(head_timeout_s=0.3))
        reader, writer = await serve(server)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 10_000:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.02)

        trickler = loop.create_task(trickle())
        status, headers, _ = await asyncio.wait_for(read_response(reader), 20)
        elapsed = loop.time() - started
        trickler.cancel()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        await server.stop(1)
        return status, headers, elapsed

    status, headers, elapsed = run(main())
    assert status == 408 and headers["connection"] == "close" and elapsed >= 0.3 * 0.9  # the loop clock is in ms


def test_an_idle_keep_alive_connection_closes_quietly(run: Any) -> None:
    async def main() -> tuple[int, bytes, bytes]:
        server = HttpServer(echo, max_body_bytes=1000, limits=HttpLimits(idle_timeout_s=0.3))
        port = await server.listen("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/slow", b""))  # served for longer than the idle timeout: not idle
        status, _, _ = await read_response(reader)
        after_answer = await asyncio.wait_for(reader.read(), 10)
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", port)
        never_asked = await asyncio.wait_for(silent_reader.read(), 10)
        for w in (writer, silent_writer):
            w.close()
        await server.stop(1)
        return status, after_answer, never_asked

    assert run(main()) == (200, b"", b"")


def test_one_read_of_many_pipelined_requests_is_parsed_only_as_far_as_the_queue_allows(run: Any) -> None:
    """2000 tiny requests arrive in one read while the handler holds the first, then EOF: the
    server parses a slice past `MAX_PIPELINED`, keeps the rest of the read, and once released
    answers every request in order and then closes."""
    count = 2000

    async def main() -> tuple[int, list[str], bytes]:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, request.path.encode(), "text/plain")

        server = HttpServer(held, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(count)))
        writer.write_eof()
        await eventually(lambda: any(len(c._queue) > MAX_PIPELINED for c in server.connections))
        await asyncio.sleep(0.05)  # time to parse the read further, had it not stopped
        (connection,) = server.connections
        queued = len(connection._queue)
        gate.set()
        paths = [(await read_response(reader))[2].decode() for _ in range(count)]
        after = await reader.read()
        writer.close()
        await server.stop(1)
        return queued, paths, after

    queued, paths, after = run(main())
    smallest = len(b"GET /0 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert MAX_PIPELINED < queued <= MAX_PIPELINED + PARSE_SLICE // smallest + 1, queued
    assert paths == [f"/{i}" for i in range(count)] and after == b""


def test_pipelined_bodies_kept_unparsed_arrive_whole(run: Any) -> None:
    """Pipelined requests with bodies of several slices, one of them chunked, behind a held one:
    the rest of the read is kept and parsed later, and every body comes to the handler whole."""
    bodies = [bytes([65 + i % 26]) * (3 * PARSE_SLICE + i) for i in range(40)]

    async def main() -> tuple[int, list[bytes]]:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, request.body, "application/octet-stream")

        server = HttpServer(held, max_body_bytes=1 << 20)
        reader, writer = await serve(server)
        chunked = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(bodies[0]), bodies[0])
        writer.write(b"".join(post("/x", body) for body in bodies) + chunked)
        await eventually(lambda: any(len(c._queue) > MAX_PIPELINED for c in server.connections))
        await asyncio.sleep(0.05)
        (connection,) = server.connections
        queued = len(connection._queue)
        gate.set()
        answered = [(await read_response(reader))[2] for _ in range(len(bodies) + 1)]
        writer.close()
        await server.stop(1)
        return queued, answered

    queued, answered = run(main())
    assert queued <= MAX_PIPELINED + 2, queued
    assert answered == [*bodies, bodies[0]]


def test_a_read_let_in_while_a_reads_rest_is_kept_goes_after_it(run: Any) -> None:
    """The read gate resumes reading a connection (as it does when a request is admitted) while the
    rest of an earlier read is kept: what is read then waits behind that rest, reading stops
    again, and every request is answered in the order sent."""
    first, more = 1000, 20

    async def main() -> tuple[bool, list[str]]:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, request.path.encode(), "text/plain")

        def requests(numbers: range) -> bytes:
            return b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in numbers)

        server = HttpServer(held, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(requests(range(first)))
        await eventually(lambda: any(c._reads.unparsed is not None for c in server.connections))
        (connection,) = server.connections
        assert connection._transport is not None and connection._reads.unparsed is not None
        kept = len(connection._reads.unparsed)
        connection._transport.resume_reading()  # what the read gate does
        writer.write(requests(range(first, first + more)))
        await eventually(lambda: connection._reads.unparsed is not None and len(connection._reads.unparsed) > kept)
        reading = connection._transport.is_reading()
        gate.set()
        paths = [(await read_response(reader))[2].decode() for _ in range(first + more)]
        writer.close()
        await server.stop(1)
        return reading, paths

    reading, paths = run(main())
    assert not reading and paths == [f"/{i}" for i in range(first + more)]


def test_a_client_that_never_reads_stops_being_read(run: Any) -> None:
    """Pipelined GETs into a socket that is never read: the server's buffer stops at its high-water mark."""
    answer = b"x" * (64 << 10)
    count = 400  # 25 MiB of answers, more than loopback's socket buffers take

    async def big(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, answer, "application/octet-stream")

    async def main() -> tuple[int, int, int]:
        limits = HttpLimits()
        server = HttpServer(big, max_body_bytes=1000, limits=limits)
        reader, writer = await serve(server)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        await eventually(lambda: any(c._write_paused for c in server.connections))
        (connection,) = server.connections
        assert connection._transport is not None
        buffered = connection._transport.get_write_buffer_size()
        waiting = len(connection._queue)
        answered = 0
        for _ in range(count):  # reading again, every answer comes
            status, _, body = await asyncio.wait_for(read_response(reader), 20)
            answered += status == 200 and body == answer
        writer.close()
        await server.stop(1)
        return buffered, waiting, answered

    buffered, waiting, answered = run(main())
    assert buffered <= HttpLimits().write_high_water + len(answer) + 1024
    assert waiting < count and answered == count


def test_head_is_get_without_the_body(run: Any) -> None:
    async def main() -> list[tuple[int, dict[str, str], bytes]]:
        server = HttpServer(echo, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        after = await read_response(reader)  # the next answer starts right after the head
        writer.close()
        await server.stop(1)
        return [(int(lines[0].split()[1]), headers, b""), after]

    (status, headers, _), (next_status, _, next_body) = run(main())
    assert status == 200 and int(headers["content-length"]) > 0
    assert next_status == 200 and json.loads(next_body)["path"] == "/g"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "no Host"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "more than one Host"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "more than one Host"),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n0\r\n\r\n", "HTTP/1.0"),
    ],
    ids=["no-host", "two-hosts", "host-twice", "te-on-1.0"],
)
def test_rfc_9112_framing_faults_are_400_and_close(run: Any, raw: bytes, fragment: str) -> None:
    server = HttpServer(echo, max_body_bytes=1000)
    status, headers, body, rest = run(answer_to(server, raw + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert (status, headers["connection"], rest) == (400, "close", b"")
    assert fragment in json.loads(body)["error"]


@pytest.mark.parametrize(
    ("target", "path"),
    [(b"http://example.com:8000/v2/health/ready?x=1", "/v2/health/ready"), (b"HTTPS://h", "/"), (b"http://h?q", "/")],
)
def test_an_absolute_form_target_is_served_as_its_path(run: Any, target: bytes, path: str) -> None:
    raw = b"GET " + target + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    status, _, body, _ = run(answer_to(HttpServer(echo, max_body_bytes=1000), raw))
    assert status == 200 and json.loads(body)["path"] == path


def test_http_1_0_gets_no_100_continue_and_needs_no_host(run: Any) -> None:
    raw = b"POST /e HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nok"
    status, headers, body, rest = run(answer_to(HttpServer(echo, max_body_bytes=1000), raw))
    assert status == 200 and json.loads(body)["body"] == "ok" and headers["connection"] == "close"


@pytest.mark.parametrize("flags", [(), ("--http-max-pipelined-requests", "2")], ids=["default", "2"])
def test_the_pipelined_requests_flag_bounds_the_queue(run: Any, flags: tuple[str, ...]) -> None:
    """Twelve pipelined requests in one read: under the default (16) the connection is read on; under
    --http-max-pipelined-requests 2 it stops being read, and serves them all once they are answered."""
    from reference_server.config import config_from_args

    limits = config_from_args(["--model-repository", "unused", *flags]).http_limits

    async def main() -> bool:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, b"{}", "application/json")

        server = HttpServer(held, max_body_bytes=1000, limits=limits)
        reader, writer = await serve(server)
        writer.write(post("/x", b"") * 12)
        await writer.drain()
        await eventually(lambda: any(c._paused or len(c._queue) == 11 for c in server.connections))  # one is served
        (connection,) = server.connections
        paused = connection._paused
        gate.set()
        for _ in range(12):
            assert (await read_response(reader))[0] == 200
        writer.close()
        await server.stop(1)
        return paused

    assert run(main()) == bool(flags)
