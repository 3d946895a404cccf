"""The bytes an HTTP/1.1 connection keeps unparsed while its pipelined requests wait
(`pipelined_reads.ReadFeeder`, `--http-max-unparsed-bytes`): the read gate may resume reading a
connection whose earlier read's rest is kept, and each resume lets one more read in behind it; past
the cap the client is answered 429 after the requests already read, and the connection closes."""

from __future__ import annotations

import asyncio
from typing import Any

from reference_server.config import config_from_args
from reference_server.frontends.http.limits import HttpLimits
from reference_server.frontends.http.messages import HttpRequest, HttpResponse
from reference_server.frontends.http.server import HttpServer
from tests.unit.test_http_server import read_response, serve
from tests.waiting import eventually

CAP = 64 << 10


def requests(numbers: range) -> bytes:
    return b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in numbers)


def test_reads_let_in_behind_a_kept_rest_are_held_to_the_cap_then_refused(run: Any) -> None:
    async def main() -> tuple[list[int], list[str], int, bytes]:
        gate = asyncio.Event()

        async def held(request: HttpRequest) -> HttpResponse:
            await gate.wait()
            return HttpResponse(200, request.path.encode(), "text/plain")

        server = HttpServer(held, max_body_bytes=1000, limits=HttpLimits(max_unparsed=CAP))
        reader, writer = await serve(server)
        writer.write(requests(range(1000)))  # ~30 KB: the queue fills, the rest is kept
        await eventually(lambda: any(c._reads.unparsed is not None for c in server.connections))
        (connection,) = server.connections
        kept = []
        sent = 1000
        for _ in range(6):  # the read gate resumes the connection again and again
            unparsed = connection._reads.unparsed
            if unparsed is None or connection._transport is None:
                break
            kept.append(len(unparsed))
            connection._transport.resume_reading()
            writer.write(requests(range(sent, sent + 1000)))  # ~32 KB more each time
            sent += 1000
            await eventually(lambda: connection._gave_up or len(connection._reads.unparsed or b"") > kept[-1])
        assert max(kept) <= CAP, kept  # here, not after: without the cap no refusal would end the answers
        gate.set()
        paths, status = [], 0
        while True:
            status, _, body = await read_response(reader)
            if status != 200:
                break
            paths.append(body.decode())
        after = await reader.read()
        writer.close()
        await server.stop(1)
        return kept, paths, status, after

    kept, paths, status, after = run(main())
    assert 1 < len(kept) < 6 and max(kept) <= CAP, kept  # it grew by a read a resume, up to the cap
    assert paths == [f"/{i}" for i in range(len(paths))] and len(paths) > 16  # those read, in order
    assert (status, after) == (429, b"")  # then the refusal, and the connection closed


def test_the_cap_is_a_flag() -> None:
    assert config_from_args(["--model-repository", "r"]).http_limits.max_unparsed == 1 << 20
    chosen = config_from_args(["--model-repository", "r", "--http-max-unparsed-bytes", "65536"])
    assert chosen.http_limits.max_unparsed == 65536
