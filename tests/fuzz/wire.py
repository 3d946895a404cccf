"""What the fuzz tests share: a raw HTTP/1.1 client that sends any bytes, the checks every answer
must pass, the fuzz server's model repository, and the example budget."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from hypothesis import HealthCheck, settings
from onnx import TensorProto, helper

from v2kit import codec as v2

#: PERFKIT_FUZZ_EXAMPLES=N scales every fuzz test (N examples per HTTP/gRPC property, a share
#: of it for the rest) and turns on random exploration; unset, the runs are modest and repeatable.
BUDGET = int(os.environ.get("PERFKIT_FUZZ_EXAMPLES", "0") or 0)


def fuzz_settings(default_examples: int) -> settings:
    return settings(
        max_examples=BUDGET or default_examples,
        deadline=None,
        derandomize=not BUDGET,
        database=None,  # nothing written into the checkout
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
    )


# --- the fuzz repository: the demo models plus a BYTES model --------------------------------------

_STRINGS_CONFIG = """\
name: "strings"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def build_fuzz_repository(demo_repository: Path, target: Path) -> Path:
    """The demo repository plus `strings` at `target`, and a valid model folder `outside` beside
    `target`, which no request may reach."""
    shutil.copytree(demo_repository, target)
    shutil.copytree(demo_repository / "identity", target.parent / "outside")
    strings = target / "strings"
    (strings / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["ECHO"])],
        "strings",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("ECHO", TensorProto.STRING, ["batch", "n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, strings / "1" / "model.onnx")
    (strings / "config.pbtxt").write_text(_STRINGS_CONFIG)
    return target


# --- a raw HTTP/1.1 client ---------------------------------------------------------------------------


class RawHttp:
    """Keep-alive HTTP/1.1 over a plain socket, so that a test can send any path, header or body bytes."""

    def __init__(self, port: int, timeout_s: float = 30.0) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buffer = None, b""

    def request(
        self, method: str, path: bytes, body: bytes = b"", headers: dict[str, bytes] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Content-Length: %d" % len(body)]
        lines += [name.encode() + b": " + value for name, value in (headers or {}).items()]
        data = b"\r\n".join(lines) + b"\r\n\r\n" + body
        for attempt in range(2):
            if self._sock is None:
                self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout_s)
            try:
                self._sock.sendall(data)
                return self._response()
            except (ConnectionError, EOFError):
                # The server closed a keep-alive connection before our request: try once more.
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _read(self, n: int) -> bytes:
        assert self._sock is not None
        while len(self._buffer) < n:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise EOFError("connection closed mid-response")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def _response(self) -> tuple[int, dict[str, str], bytes]:
        assert self._sock is not None
        while b"\r\n\r\n" not in self._buffer:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise EOFError("connection closed before a response")
            self._buffer += chunk
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = self._read(int(headers.get("content-length", "0")))
        if version != "HTTP/1.1" or headers.get("connection", "").lower() == "close":
            self.close()
        return int(status), headers, body


# --- what every answer must be ----------------------------------------------------------------------

#: Statuses a client mistake may get (Triton's): 503 is "not loaded / overloaded / not in this
#: mode", 501 an unsupported extension. 500 and other 5xx would be a server bug.
CLIENT_ERROR_STATUSES = {400, 401, 404, 405, 413, 501, 503}


def check_http_answer(status: int, headers: dict[str, str], body: bytes, *, infer: bool, ready_probe: bool) -> None:
    assert status == 200 or status in CLIENT_ERROR_STATUSES, (status, body[:300])
    if status == 200:
        if infer:
            length = headers.get("inference-header-content-length")
            v2.decode_infer_response(body, int(length) if length is not None else None)
        return
    if ready_probe and status == 400 and not body:
        return  # readiness answers with the status alone, as Triton's
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body[:300])
    doc = json.loads(body)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"], doc


@contextmanager
def crashes_logged() -> Iterator[list[logging.LogRecord]]:
    """Collect what a crash leaves in the log while the block runs: an ERROR with a traceback from
    the server, asyncio, aiohttp or grpc (a refused model config is logged without one)."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info or record.name.startswith("asyncio"):
                records.append(record)

    handler = Collect(level=logging.ERROR)
    names = ("reference_server", "asyncio", "aiohttp", "grpc")
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
