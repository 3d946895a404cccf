"""--http-restricted-api and --grpc-restricted-protocol on a running server: the same answers from
perfkit-server (in one process and with front-end workers) as from tritonserver 2.51 (the peers test)
to tritonclient and to plain HTTP requests, with and without the header each category wants."""

from __future__ import annotations

import json
import os
import queue
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.config import config_from_args
from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = pytest.mark.integration

MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
CONFIG = """\
name: "echo"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
#: HTTP health stays open: the test harness waits on /v2/health/ready.
FLAGS = (
    "--http-restricted-api=metadata:A-Key=V",
    "--http-restricted-api=inference,model-config:k2=v2",
    "--grpc-restricted-protocol=health,inference:gk=gv",
    "--grpc-restricted-protocol=metadata:m=n",
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("restricted") / "models"
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(MODEL)
    (root / "echo" / "config.pbtxt").write_text(CONFIG)
    return root


def _http(url: str, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, Any]:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(f"http://{url}{path}", headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        call()
        return "ok"
    except InferenceServerException as exc:
        return exc.status(), exc.message()


def _observe(http_url: str, grpc_url: str) -> list[Any]:
    """What each kind of request gets, with and without each category's header."""
    seen: list[Any] = [
        _http(http_url, "/v2"),
        _http(http_url, "/v2", {"a-key": "V"}),
        _http(http_url, "/v2", {"A-KEY": "v"}),  # the value is compared exactly
        _http(http_url, "/v2/models/echo/config", method="DELETE"),  # refused before the method is looked at
        _http(http_url, "/v2/models/nosuch/infer", method="POST"),  # and before the model
        _http(http_url, "/v2/models/echo/generate", method="POST"),
        _http(http_url, "/v2/models/echo/config", {"k2": "v2"}),
        _http(http_url, "/v2/models/echo/ready"),
        _http(http_url, "/v2/models/echo/stats"),
    ]
    data = np.ones((1,), np.float32)
    http = httpclient.InferenceServerClient(http_url)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        http_input = httpclient.InferInput("INPUT0", [1], "FP32")
        http_input.set_data_from_numpy(data)
        grpc_input = grpcclient.InferInput("INPUT0", [1], "FP32")
        grpc_input.set_data_from_numpy(data)
        seen += [
            _outcome(lambda: http.infer("echo", [http_input])),
            _outcome(lambda: http.infer("echo", [http_input], headers={"k2": "v2"})),
            _outcome(lambda: grpc.is_server_live()),
            _outcome(lambda: grpc.is_server_live(headers={"gk": "gv"})),
            _outcome(lambda: grpc.is_server_live(headers={"triton-grpc-protocol-gk": "gv"})),
            _outcome(lambda: grpc.is_model_ready("echo")),
            _outcome(lambda: grpc.get_server_metadata()),
            _outcome(lambda: grpc.get_server_metadata(headers={"triton-grpc-protocol-m": "n"})),
            _outcome(lambda: grpc.get_model_config("echo")),
            _outcome(lambda: grpc.infer("echo", [grpc_input])),
            _outcome(lambda: grpc.infer("echo", [grpc_input], headers={"triton-grpc-protocol-gk": "gv"})),
        ]
        errors: queue.Queue[Any] = queue.Queue()
        grpc.start_stream(callback=lambda result, error: errors.put(error))
        try:
            grpc.async_stream_infer("echo", [grpc_input])
        except InferenceServerException:
            pass  # the stream may already be closed by the refusal
        error = errors.get(timeout=30)
        seen.append((error.status(), error.message()))
        grpc.stop_stream()
    finally:
        http.close()
        grpc.close()
    return seen


EXPECTED = [
    (403, {"error": "This API is restricted, expecting header 'A-Key'"}),
    (200, None),
    (403, {"error": "This API is restricted, expecting header 'A-Key'"}),
    (403, {"error": "This API is restricted, expecting header 'k2'"}),
    (403, {"error": "This API is restricted, expecting header 'k2'"}),
    (403, {"error": "This API is restricted, expecting header 'k2'"}),
    (200, None),
    (200, None),
    (200, None),
    ("403", "This API is restricted, expecting header 'k2'"),
    "ok",
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-gk'"),
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-gk'"),
    "ok",
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-gk'"),
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-m'"),
    "ok",
    "ok",
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-gk'"),
    "ok",
    ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-gk'"),
]


@pytest.mark.parametrize("workers", [1, 2])
def test_restricted_endpoints_want_their_header(repository: Path, workers: int) -> None:
    parsed = config_from_args(["--model-repository", str(repository), *FLAGS])
    config = loopback_config(
        repository,
        http_restricted_api=parsed.http_restricted_api,
        grpc_restricted_protocol=parsed.grpc_restricted_protocol,
        frontend_workers=workers,
    )
    with running_server(config) as ours:
        assert _observe(f"127.0.0.1:{ours.http_port}", f"127.0.0.1:{ours.grpc_port}") == EXPECTED


def test_no_restriction_leaves_every_endpoint_open(repository: Path) -> None:
    with running_server(loopback_config(repository)) as ours:
        url = f"127.0.0.1:{ours.http_port}"
        assert [_http(url, p)[0] for p in ("/v2", "/v2/models/echo/config", "/v2/health/ready")] == [200, 200, 200]


@pytest.mark.peers
def test_restricted_endpoints_answer_as_tritonserver(repository: Path) -> None:
    peers = os.environ.get("PERFKIT_PEERS")
    if not peers:
        pytest.skip("PERFKIT_PEERS is not set: no tritonserver 2.51 to compare with")
    with running_triton(Path(peers), repository, extra_args=FLAGS, auto_complete=False) as triton:
        assert _observe(triton.http_url, triton.grpc_url) == EXPECTED
