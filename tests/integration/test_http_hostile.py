"""perfkit-server's HTTP/1.1 front end against hostile clients, on raw loopback sockets: an endless
head, a trickled head, pipelining into a socket that is never read, a read of thousands of tiny
pipelined requests behind one the server holds, an idle connection, and the
RFC 9112 / 9110 cases (HEAD, absolute-form, Host) on the real routes.

The server runs as its own process (`python -m reference_server`), so that its memory can be
measured on its own (psutil's RSS). Every client here is bounded in bytes and in time and stops by
itself; the memory bounds are wide (the growth measured is a few MiB) so that the allocator's
habits cannot fail them, and narrow beside what the server held before these limits (a 64 MiB
header was kept whole; 4.5 MB of pipelined GETs held ~54 MiB of answers).
"""

from __future__ import annotations

import json
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from reference_server.config import config_from_args
from reference_server.frontends.http.limits import HttpLimits

pytestmark = pytest.mark.integration

#: Short timers, so that the timeout cases take seconds; passed as the flags a user would.
HEAD_TIMEOUT_S = 1.5
IDLE_TIMEOUT_S = 1.5
#: The most the server's RSS may grow while one hostile client is served.
RSS_BOUND = 24 << 20
#: How long the `held` model's batcher keeps a lone request: the requests pipelined behind it wait as long.
HELD_S = 0.5

#: `identity` whose batcher holds a request for `HELD_S`, waiting for others to batch it with.
_HELD_CONFIG = f"""\
name: "held"
backend: "onnxruntime"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {int(HELD_S * 1e6)} }}
instance_group [ {{ count: 1 }} ]
"""


class Server:
    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port

    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def connect(self, timeout_s: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)

    def drops(self, sock: socket.socket, timeout_s: float) -> bool:
        """Whether the server lets go of its end of `sock` within `timeout_s` (read from the
        server's own sockets, so the client need not read what is waiting for it)."""
        client = sock.getsockname()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            held = psutil.Process(self.process.pid).net_connections(kind="tcp")
            if not any(c.raddr and (c.raddr.ip, c.raddr.port) == client for c in held):
                return True
            time.sleep(0.05)
        return False


@pytest.fixture(scope="module")
def server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("hostile")
    log = folder / "server.log"
    repository = folder / "models"
    shutil.copytree(demo_repository, repository)
    (repository / "held" / "1").mkdir(parents=True)
    shutil.copy(repository / "identity" / "1" / "model.onnx", repository / "held" / "1" / "model.onnx")
    (repository / "held" / "config.pbtxt").write_text(_HELD_CONFIG, encoding="utf-8")
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(repository),
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
        "--allow-grpc", "false", "--allow-metrics", "false",
        "--model-control-mode", "explicit", "--load-model", "identity", "--load-model", "held",
        "--http-head-timeout-secs", str(HEAD_TIMEOUT_S), "--http-idle-timeout-secs", str(IDLE_TIMEOUT_S),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None:
            found = re.search(rb"Started HTTPService at [^:]+:(\d+)", log.read_bytes())
            if found:
                port = int(found.group(1))
            elif process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start: {log.read_text(errors='replace')}")
            else:
                time.sleep(0.05)
        yield Server(process, port)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def read_answer(sock: socket.socket, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """One answer from `sock`: its status, headers and body (none for a HEAD request's answer)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = 0 if head_only else int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-body"
        rest += chunk
    assert len(rest) == length, f"bytes after the answer: {rest[length:]!r}"
    return int(lines[0].split()[1]), headers, rest


def closed(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """Whether the server ends the connection (EOF or reset) within `timeout_s`, sending nothing more."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def ready(server: Server) -> int:
    with server.connect() as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        return read_answer(sock)[0]


def test_an_endless_header_is_431_and_memory_does_not_follow_it(server: Server) -> None:
    assert ready(server) == 200
    before = server.rss()
    piece = b"v" * (1 << 20)
    sent = 0
    answer = b""
    with server.connect() as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sock.settimeout(5)
        try:
            while sent < 256 << 20 and b"\r\n\r\n" not in answer:  # stops by itself at 256 MiB
                sock.sendall(piece)
                sent += len(piece)
                if select.select([sock], [], [], 0)[0]:
                    answer += sock.recv(65536)
        except (TimeoutError, ConnectionError):
            pass  # the server stopped reading (the kernel's buffers are full) or closed
        grown = server.rss() - before
        sock.settimeout(10)
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, "no answer"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in answer
    assert b"--http-max-header-line" in answer
    assert sent < 256 << 20 and grown < RSS_BOUND, (sent, grown)
    assert ready(server) == 200


def test_pipelining_into_a_socket_that_is_never_read_holds_bounded_memory(server: Server) -> None:
    assert ready(server) == 200
    before = server.rss()
    request = b"GET /v2/models/identity/config HTTP/1.1\r\nHost: x\r\n\r\n"
    batch = request * (65536 // len(request))
    sent = 0
    peak = before
    with server.connect() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # keep the kernel's share small
        sock.settimeout(1)
        try:
            while sent < 64 << 20:  # 64 MiB of requests at most; the answers would be ~10x that
                sock.sendall(batch)
                sent += len(batch)
                peak = max(peak, server.rss())
        except (TimeoutError, ConnectionError):
            pass  # the server stopped reading (the sockets' buffers are full), or gave up on us
        peak = max(peak, server.rss())
        # A client that takes none of its answers for the idle timeout is cut off.
        assert server.drops(sock, 10 * IDLE_TIMEOUT_S)
    assert sent < 64 << 20, "the server read every request a client that never reads sent"
    assert peak - before < RSS_BOUND, (sent, peak - before)
    assert ready(server) == 200


def infer(model: str, request_id: str) -> bytes:
    """A small inference request on `model` (the identity's input), whose answer carries `request_id`."""
    inputs = [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]
    body = json.dumps({"id": request_id, "inputs": inputs}).encode()
    return b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        model.encode(), len(body), body,
    )  # fmt: skip


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """`count` pipelined answers from `sock`: each one's status and body."""
    answers: list[tuple[int, bytes]] = []
    data = b""
    while len(answers) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end]
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            end = head_end + 4 + length
            if len(data) >= end:
                answers.append((int(head.split()[1]), data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = sock.recv(1 << 20)
        assert chunk, f"the connection closed after {len(answers)} of {count} answers"
        data += chunk
    assert data == b"", "bytes after the last answer"
    return answers


def test_a_read_of_tiny_pipelined_requests_behind_a_held_one_is_parsed_only_as_far_as_the_queue_allows(
    server: Server,
) -> None:
    """Each client sends, in one go, an inference the `held` model keeps for `HELD_S` and 256 KiB
    of tiny requests behind it (health probes, and small inferences numbered in order), and
    reads nothing until that inference is answered: the server parses a slice past its pipelining
    limit and keeps the rest of the read unparsed, so it holds a few hundred requests per
    connection, not the thousands of a read: RSS grows under 8 MiB for the 8 clients (measured
    1.2 MiB; 15.8 MiB when every read was parsed whole). Then every request is answered, in order."""
    assert ready(server) == 200
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    clients: list[tuple[socket.socket, threading.Thread, list[str], int]] = []
    before = server.rss()
    for client in range(8):  # one batch of the held model: it keeps them all for HELD_S
        parts, ids, size = [infer("held", "held")], ["held"], 0
        while size < 256 << 10:
            if len(parts) % 50:
                parts.append(live)
            else:
                ids.append(f"{client}-{len(parts)}")
                parts.append(infer("identity", ids[-1]))
            size += len(parts[-1])
        sock = server.connect()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        sender = threading.Thread(target=sock.sendall, args=(b"".join(parts),), daemon=True)
        sender.start()
        clients.append((sock, sender, ids, len(parts)))
    # Until the held inference is answered on every connection (10 s: a bound, far past HELD_S).
    peak = before
    deadline = time.monotonic() + 10 * HELD_S
    waiting = [sock for sock, *_ in clients]
    while waiting and time.monotonic() < deadline:
        peak = max(peak, server.rss())
        waiting = [sock for sock in waiting if not select.select([sock], [], [], 0.02)[0]]
    assert not waiting, "the held inferences were not answered"
    # Every client reads at once: one left unread while the others are read would be cut off as a
    # client that takes no answers for the idle timeout (1.5 s), which a busy machine can reach.
    read: dict[int, list[tuple[int, bytes]]] = {}

    def read_all(index: int, sock: socket.socket, count: int) -> None:
        sock.settimeout(20)
        read[index] = read_answers(sock, count)

    readers = [
        threading.Thread(target=read_all, args=(i, sock, count), daemon=True)
        for i, (sock, _, _, count) in enumerate(clients)
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(30)
    for index, (sock, sender, ids, count) in enumerate(clients):
        sender.join(20)
        sock.close()
        assert index in read, f"client {index} did not read its {count} answers"
        answers = read[index]
        assert all(status == 200 for status, _ in answers)
        assert [json.loads(body)["id"] for _, body in answers if body] == ids
    assert peak - before < 8 << 20, f"RSS grew {(peak - before) / (1 << 20):.1f} MiB"


def test_a_trickled_head_is_408_after_the_head_timeout(server: Server) -> None:
    with server.connect() as sock:
        start = time.monotonic()
        answer = b""
        for byte in b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 1000:
            if time.monotonic() - start > 10 * HEAD_TIMEOUT_S:  # bounded: long past the timeout
                break
            try:
                sock.sendall(bytes([byte]))
            except ConnectionError:
                break
            if select.select([sock], [], [], 0.1)[0]:
                answer = sock.recv(65536)
                break
        elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 ") and b"--http-head-timeout-secs" in answer
    assert HEAD_TIMEOUT_S * 0.9 <= elapsed < 10 * HEAD_TIMEOUT_S  # 0.9: the two clocks differ


def test_an_idle_keep_alive_connection_is_closed(server: Server) -> None:
    with server.connect() as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock)[0] == 200
        start = time.monotonic()
        assert closed(sock, 10 * IDLE_TIMEOUT_S)
        assert time.monotonic() - start >= IDLE_TIMEOUT_S * 0.9


def test_head_is_answered_as_get_without_a_body(server: Server) -> None:
    with server.connect() as sock:
        sock.sendall(b"GET /v2/models/identity/config HTTP/1.1\r\nHost: x\r\n\r\n")
        _, _, config = read_answer(sock)
        for path, status in (
            ("/v2/models/identity/config", 200),
            ("/v2/health/ready", 200),
            ("/v2/models/nope/config", 404),
            ("/v2/models/identity/infer", 405),
            ("/nowhere", 404),
        ):
            sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            got, headers, body = read_answer(sock, head_only=True)
            assert (got, body) == (status, b""), path
            if path.endswith("/config") and status == 200:
                assert int(headers["content-length"]) == len(config)
            if status == 405:
                assert headers["allow"] == "POST"
        # Nothing was left behind a HEAD answer: the next answer on the connection is whole.
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock)[0] == 200


def test_rfc_9112_targets_and_host(server: Server) -> None:
    with server.connect() as sock:
        sock.sendall(f"GET http://127.0.0.1:{server.port}/v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_answer(sock)[0] == 200
    for raw in (
        b"GET /v2/health/ready HTTP/1.1\r\n\r\n",
        b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"POST /v2/repository/index HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ):
        with server.connect() as sock:
            sock.sendall(raw)
            status, headers, _ = read_answer(sock)
            assert (status, headers.get("connection")) == (400, "close"), raw
            assert closed(sock)


def test_the_head_flags_have_their_defaults_and_refuse_nonsense(
    demo_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_args(["--model-repository", str(demo_repository)])
    assert config.http_limits == HttpLimits()
    assert (HttpLimits().max_request_line, HttpLimits().max_header_line) == (8192, 16384)
    assert (HttpLimits().max_head_bytes, HttpLimits().max_headers) == (65536, 100)
    chosen = config_from_args(
        ["--model-repository", str(demo_repository), "--http-max-headers", "7", "--http-idle-timeout-secs", "5"]
    )
    assert (chosen.http_limits.max_headers, chosen.http_limits.idle_timeout_s) == (7, 5.0)
    for flag in (
        "--http-max-request-line",
        "--http-max-header-line",
        "--http-max-head-size",
        "--http-max-headers",
        "--http-head-timeout-secs",
        "--http-idle-timeout-secs",
    ):
        with pytest.raises(SystemExit) as exited:
            config_from_args(["--model-repository", str(demo_repository), flag, "0"])
        assert exited.value.code == 2
        assert flag in capsys.readouterr().err
