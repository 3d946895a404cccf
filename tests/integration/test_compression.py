"""Compression end to end: NVIDIA's clients (tritonclient HTTP's request and response compression,
tritonclient gRPC's `compression_algorithm`, perf_analyzer's `--grpc-compression-algorithm`)
against perfkit-server, and the hostile cases: a 1 GB gzip bomb (413, and the server's RSS grows by
about its body limit at its peak, not a gigabyte), a body that is not gzip (400), an unknown coding (415),
and a gRPC message that inflates past the limit (RESOURCE_EXHAUSTED).

The server runs as its own process so that its memory can be measured on its own."""

from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_http_hostile import read_answer
from tests.unit.test_content_codings import gzip_bomb

pytestmark = pytest.mark.integration

LIMIT = 16 << 20  # --http-max-input-size: bounds the compressed and the inflated body alike
#: The most the server's peak RSS may grow while it refuses a bomb: the compressed body, the
#: limit, a chunk, the allocator's slack.
RSS_BOUND = LIMIT + (32 << 20)


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int

    def rss(self) -> int:
        return int(psutil.Process(self.process.pid).memory_info().rss)

    def reset_peak(self) -> None:
        """Start the kernel's peak-RSS count (VmHWM) over from the current RSS: the inflated data
        is freed by the time the answer comes, so only the peak shows what it cost."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def peak_rss(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) << 10  # type: ignore[union-attr]

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=30) as sock:
            sock.sendall(request)
            return read_answer(sock)


@pytest.fixture(scope="module")
def server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("compression") / "server.log"
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(demo_repository),
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--allow-metrics", "false",
        "--model-control-mode", "explicit", "--load-model", "identity", "--http-max-input-size", str(LIMIT),
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            text = log.read_bytes()
            http = re.search(rb"Started HTTPService at [^:]+:(\d+)", text)
            grpc_ = re.search(rb"Started GRPCInferenceService at [^:]+:(\d+)", text)
            if http and grpc_:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield Server(process, int(http.group(1)), int(grpc_.group(1)))
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _identity_input(module: object, values: np.ndarray) -> object:
    inp = module.InferInput("INPUT0", list(values.shape), "FP32")  # type: ignore[attr-defined]
    inp.set_data_from_numpy(values)
    return inp


@pytest.mark.parametrize("request_coding", ["gzip", "deflate", None])
@pytest.mark.parametrize("response_coding", ["gzip", "deflate", None])
def test_tritonclient_http_compression(server: Server, request_coding: str | None, response_coding: str | None) -> None:
    values = np.arange(4096, dtype=np.float32).reshape(1, -1)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        for binary in (True, False):
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            result = client.infer(
                "identity", [_identity_input(httpclient, values)], outputs=[output],
                request_compression_algorithm=request_coding, response_compression_algorithm=response_coding,
            )  # fmt: skip
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    finally:
        client.close()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_the_answer_is_compressed_as_accept_encoding_asks(server: Server, coding: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 512], "datatype": "FP32", "data": [1.5] * 512}]})
    status, headers, answer = server.post(
        "/v2/models/identity/infer", body.encode(), {"Accept-Encoding": f"br;q=1, {coding};q=0.8, identity;q=0.1"}
    )
    assert status == 200 and headers["content-encoding"] == coding
    payload = json.loads(zlib.decompress(answer, zlib.MAX_WBITS | 32))
    assert payload["outputs"][0]["data"] == [1.5] * 512


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_grpc_compression(server: Server, coding: str) -> None:
    values = np.linspace(0, 1, 4096, dtype=np.float32).reshape(1, -1)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        result = client.infer("identity", [_identity_input(grpcclient, values)], compression_algorithm=coding)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_grpc_message_inflating_past_the_limit_is_resource_exhausted(server: Server) -> None:
    values = np.zeros((1, (LIMIT // 4) + 1024), dtype=np.float32)  # compresses to ~16 KB, inflates past LIMIT
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity", [_identity_input(grpcclient, values)], compression_algorithm="gzip")
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED", caught.value
        assert "larger than max" in str(caught.value.message())
        assert client.is_server_ready()


def test_a_gigabyte_gzip_bomb_is_413_and_costs_no_gigabyte(server: Server) -> None:
    bomb = gzip_bomb(1024)
    assert len(bomb) < LIMIT  # it passes the transport's limit on the compressed body
    server.reset_peak()
    before = server.rss()
    status, _, answer = server.post("/v2/models/identity/infer", bomb, {"Content-Encoding": "gzip"})
    grown = server.peak_rss() - before
    assert status == 413, answer
    assert json.loads(answer)["error"].startswith("Decompressed data size exceeds the maximum allowed value")
    assert grown < RSS_BOUND, f"RSS grew by {grown >> 20} MiB for a 1 GiB bomb"
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    after = server.post("/v2/models/identity/infer", gzip.compress(body.encode()), {"Content-Encoding": "gzip"})
    assert after[0] == 200  # and the server serves on


def test_a_body_that_is_not_gzip_is_400(server: Server) -> None:
    status, _, answer = server.post("/v2/models/identity/infer", b"{not gzip}", {"Content-Encoding": "gzip"})
    assert status == 400 and "decompress" in json.loads(answer)["error"]


def test_an_unknown_coding_is_415_naming_what_is_accepted(server: Server) -> None:
    status, headers, answer = server.post("/v2/models/identity/infer", b"{}", {"Content-Encoding": "br"})
    assert status == 415 and headers["accept-encoding"] == "gzip, deflate"
    assert json.loads(answer)["error"].startswith("Unsupported compression type")


def test_perf_analyzer_grpc_compression(peers: Path, server: Server) -> None:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        before = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]["inference_stats"]
        result = subprocess.run(
            [
                str(peers / "bin" / "perf_analyzer"), "-m", "identity", "-u", f"127.0.0.1:{server.grpc_port}",
                "-i", "grpc", "--grpc-compression-algorithm", "gzip", "--shape", "INPUT0:64",
                "--concurrency-range", "2", "-p", "150", "-s", "100", "-r", "6",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        after = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]["inference_stats"]
    # This checks the protocol, not the measurement: exit 2 (no stable measurement on a busy
    # machine) still means every window's requests were answered.
    assert result.returncode in (0, 2), result.stdout + result.stderr
    assert "Request concurrency: 2" in result.stdout, result.stdout
    served = int(after["success"]["count"]) - int(before.get("success", {}).get("count", 0))
    assert served > 100 and int(after.get("fail", {}).get("count", 0)) == 0, (before, after)
