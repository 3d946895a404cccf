"""A KServe v2 HTTP server that costs next to nothing: every inference gets one fixed, valid answer.

For measuring the load generator itself: the reference server runs a model and costs more per
request than the client, so it is the bottleneck; this one parses only the request line and
Content-Length and writes precomputed bytes. One model, `canned` (FP32 [1, 4] in, FP32 [1, N] out,
as JSON); enough of the v2 API for `perfkit sweep` to find and describe it. No statistics
extension (the sweep notes that and goes on). A large N makes the client the bottleneck by
design: it parses every answer's JSON (thousands of numbers), while the server only writes bytes.

`python -m perfkit.testing.canned_server [--port N] [--output-elements N]` prints
`listening on HOST:PORT` once bound; `canned_server_process()` runs it as a child process for the
duration of a block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["MODEL", "canned_server_process", "serve"]

MODEL = "canned"
_TENSOR = {"datatype": "FP32", "shape": [1, 4]}


def _documents(output_elements: int) -> dict[bytes, Any]:
    output = {"datatype": "FP32", "shape": [1, output_elements]}
    return {
        b"/v2": {"name": "canned", "version": "0", "extensions": []},
        b"/v2/health/live": None,
        b"/v2/health/ready": None,
        f"/v2/models/{MODEL}".encode(): {
            "name": MODEL,
            "versions": ["1"],
            "platform": "canned",
            "inputs": [{"name": "INPUT0", **_TENSOR}],
            "outputs": [{"name": "OUTPUT0", **output}],
        },
        f"/v2/models/{MODEL}/ready".encode(): None,
        f"/v2/models/{MODEL}/config".encode(): {
            "name": MODEL,
            "max_batch_size": 0,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1, 4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1, output_elements]}],
        },
        b"/v2/repository/index": [{"name": MODEL, "version": "1", "state": "READY"}],
    }


def _answers(output_elements: int) -> dict[bytes, bytes]:
    """Every response, encoded once."""
    answers = {path: _response("200 OK", doc) for path, doc in _documents(output_elements).items()}
    infer = {"model_name": MODEL, "outputs": [{"name": "OUTPUT0", "datatype": "FP32",
                                               "shape": [1, output_elements], "data": [0.0] * output_elements}]}  # fmt: skip
    for path in (f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer"):
        answers[path.encode()] = _response("200 OK", infer)
    return answers


def _response(status: str, document: Any) -> bytes:
    body = b"" if document is None else json.dumps(document).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


_NOT_FOUND = _response("404 Not Found", {"error": "the canned server has only the model 'canned'"})


class _Connection(asyncio.Protocol):
    """HTTP/1.1 keep-alive, requests in order; only the request line and Content-Length are read."""

    def __init__(self, answers: dict[bytes, bytes]) -> None:
        self._answers = answers
        self._pending = bytearray()
        self._transport: Any = None  # asyncio's or uvloop's TCP transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        pending = self._pending
        pending += data
        while (end := pending.find(b"\r\n\r\n")) >= 0:
            head = bytes(pending[:end])
            total = end + 4 + _content_length(head)
            if len(pending) < total:
                return
            del pending[:total]
            path = head.split(b" ", 2)[1].split(b"?", 1)[0]
            self._transport.write(self._answers.get(path, _NOT_FOUND))


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


async def serve(host: str = "127.0.0.1", port: int = 0, output_elements: int = 4) -> None:
    answers = _answers(output_elements)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(answers), host, port)
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def canned_server_process(output_elements: int = 4, stop_timeout_s: float = 30.0) -> Iterator[str]:
    """The canned server as a child process on a free loopback port; yields its HOST:PORT."""
    command = [sys.executable, "-m", "perfkit.testing.canned_server", "--output-elements", str(output_elements)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the child prints its address first, or exits
        if not line.startswith("listening on "):
            raise RuntimeError(f"the canned server did not start (exit code {process.poll()}): {line!r}")
        yield line.removeprefix("listening on ").strip()
    finally:
        process.terminate()
        try:
            process.wait(stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perfkit.testing.canned_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--output-elements", type=int, default=4, metavar="N", help="FP32 values per answer")
    args = parser.parse_args()
    if args.output_elements < 1:
        parser.error("--output-elements must be at least 1")
    serving = serve(args.host, args.port, args.output_elements)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            import uvloop
        except ImportError:
            asyncio.run(serving)
        else:
            uvloop.run(serving)


if __name__ == "__main__":
    main()
