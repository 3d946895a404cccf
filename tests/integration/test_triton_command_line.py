"""tritonserver's command line on a running perfkit-server: model_analyzer's local launch starts it,
a flag without effect is logged once, request headers reach a python model's `request.parameters()`
over HTTP and gRPC as on tritonserver 2.51 (the peers test), and the address, port-sharing, metrics,
compression and start-up flags do what they say."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from perfkit.target import TlsSpec
from perfkit.testing.triton import free_ports
from perfkit.wire.client import make_client
from reference_server.config import config_from_args
from reference_server.server import running_server
from reference_server.startup import ModelsFailed
from tests.servers import loopback_config, running_triton

pytestmark = pytest.mark.integration

REQUEST_PARAMETERS = """\
import json
import queue

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = json.dumps(json.loads(request.parameters()), sort_keys=True).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMETERS", np.array([text], np.object_))]))
        return responses
"""

CONFIG = """\
name: "parameters"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

#: model_analyzer's local launch (model_analyzer/triton/server/server_config.py's defaults and
#: its `triton_launch_mode: local` command line), the ports chosen by the test.
MODEL_ANALYZER_FLAGS = "--model-control-mode explicit --metrics-interval-ms 1000 --strict-model-config false".split()

#: Forwards x-* headers, and triton_* ones, which are reserved: those fail the request.
PATTERN = "^x-|^triton_"
FORWARD = ["--http-header-forward-pattern", PATTERN, "--grpc-header-forward-pattern", PATTERN]
HEADERS = {"x-user": "ada", "x-trace": "t-1", "other": "kept out"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("command_line") / "models"
    folder = root / "parameters"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(REQUEST_PARAMETERS)
    (folder / "config.pbtxt").write_text(CONFIG)
    return root


def _ready(url: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if time.monotonic() > end:
                raise
        time.sleep(0.1)


def test_model_analyzers_command_line_starts_the_server(repository: Path, tmp_path: Path) -> None:
    http, grpc, metrics = free_ports(3)
    argv = [
        sys.executable, "-m", "reference_server", "--model-repository", str(repository), "--http-port", str(http),
        "--grpc-port", str(grpc), "--metrics-port", str(metrics), *MODEL_ANALYZER_FLAGS,
        "--pinned-memory-pool-byte-size", "0", "--backend-directory=/opt/tritonserver/backends",
    ]  # fmt: skip
    log = tmp_path / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
        try:
            _ready(f"http://127.0.0.1:{http}/v2/health/ready")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
                assert b"nv_cpu_utilization" in answer.read()
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
            try:
                client.load_model("parameters")  # model_analyzer loads each variant over the API
                assert client.is_model_ready("parameters")
            finally:
                client.close()
        finally:
            server.terminate()
            code = server.wait(60)
    text = log.read_text()
    assert code == 0, text
    assert text.count("--pinned-memory-pool-byte-size has no effect on this server") == 1, text
    assert text.count("--backend-directory has no effect on this server: the backends are built in") == 1, text


def test_exit_on_error_stops_the_start(repository: Path, tmp_path: Path) -> None:
    broken = tmp_path / "models"
    (broken / "broken" / "1").mkdir(parents=True)
    (broken / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "onnxruntime"\n')
    with pytest.raises(ModelsFailed, match=r"failed to load all models: broken \(--exit-on-error true\)"):
        with running_server(loopback_config(broken, exit_on_error=True)):
            pass
    with running_server(loopback_config(broken)) as server:  # the default: log it and serve the rest
        assert server.repository is not None and not server.repository.serving("broken")
    http, grpc, metrics = (str(port) for port in free_ports(3))
    argv = ["--model-repository", str(broken), "--exit-on-error=true", "--http-port", http, "--grpc-port", grpc]
    run = subprocess.run(
        [sys.executable, "-m", "reference_server", *argv, "--metrics-port", metrics],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr  # as tritonserver's "error: creating server: ..."
    assert "error: creating server: failed to load all models: broken (--exit-on-error true)" in run.stderr


def _infer_http(url: str, headers: dict[str, str]) -> dict[str, str]:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        result = client.infer("parameters", [tensor], headers=dict(headers))  # the HTTP client adds to it
        return dict(json.loads(result.as_numpy("PARAMETERS")[0]))
    finally:
        client.close()


def _infer_grpc(url: str, headers: dict[str, str]) -> dict[str, str]:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        result = client.infer("parameters", [tensor], headers=dict(headers))  # the HTTP client adds to it
        return dict(json.loads(result.as_numpy("PARAMETERS")[0]))
    finally:
        client.close()


@pytest.fixture(scope="module")
def forwarding_server(repository: Path) -> Iterator[tuple[str, str]]:
    config = loopback_config(repository, http_header_forward_pattern=PATTERN, grpc_header_forward_pattern=PATTERN)
    with running_server(config) as ours:
        yield f"127.0.0.1:{ours.http_port}", f"127.0.0.1:{ours.grpc_port}"


def test_forwarded_headers_reach_the_model_as_string_parameters(forwarding_server: tuple[str, str]) -> None:
    http_url, grpc_url = forwarding_server
    for infer, url in ((_infer_http, http_url), (_infer_grpc, grpc_url)):
        assert infer(url, HEADERS) == {"x-user": "ada", "x-trace": "t-1"}
        assert infer(url, {}) == {}
    assert _stream_grpc(grpc_url, HEADERS) == {"x-user": "ada", "x-trace": "t-1"}  # ModelStreamInfer too
    # Matched case-insensitively; an HTTP header's name reaches the model as sent.
    assert _infer_http(http_url, {"X-Case": "any"}) == {"X-Case": "any"}


def _stream_grpc(url: str, headers: dict[str, str]) -> dict[str, str]:
    client = grpcclient.InferenceServerClient(url)
    answers: queue.Queue[object] = queue.Queue()
    try:
        client.start_stream(lambda result, error: answers.put(error or result), headers=headers)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        client.async_stream_infer("parameters", [tensor])
        answer = answers.get(timeout=30)
        assert isinstance(answer, grpcclient.InferResult), answer
        return dict(json.loads(answer.as_numpy("PARAMETERS")[0]))
    finally:
        client.stop_stream()
        client.close()


def _refusal(infer: Callable[[str, dict[str, str]], dict[str, str]], url: str) -> str:
    with pytest.raises(InferenceServerException) as refused:
        infer(url, {"x-user": "ada", "triton_x": "1"})
    return str(refused.value.message())


def test_a_reserved_header_name_fails_the_request_as_after_triton_2_51(forwarding_server: tuple[str, str]) -> None:
    for infer, url in zip((_infer_http, _infer_grpc), forwarding_server):
        assert "Header 'triton_x' is reserved for Triton usage and cannot be forwarded." in _refusal(infer, url)


@pytest.mark.peers
def test_forwarding_as_tritonserver_does(peers: Path, repository: Path, forwarding_server: tuple[str, str]) -> None:
    with running_triton(peers, repository, extra_args=FORWARD, auto_complete=False) as triton:
        for infer, theirs, ours in zip(
            (_infer_http, _infer_grpc), (triton.http_url, triton.grpc_url), forwarding_server
        ):
            assert infer(ours, HEADERS) == infer(theirs, HEADERS) == {"x-user": "ada", "x-trace": "t-1"}
        # HTTP header names reach the model as sent; gRPC's are lower case on the wire.
        assert _infer_http(forwarding_server[0], {"X-Up": "a"}) == _infer_http(triton.http_url, {"X-Up": "a"})


def test_addresses_bind_where_asked(repository: Path) -> None:
    config = loopback_config(repository, grpc_address="127.0.0.2", metrics_address="127.0.0.3")
    with running_server(config) as ours:
        client = grpcclient.InferenceServerClient(f"127.0.0.2:{ours.grpc_port}")
        try:
            assert client.is_server_live()
        finally:
            client.close()
        _ready(f"http://127.0.0.3:{ours.metrics_port}/metrics")
        _ready(f"http://127.0.0.1:{ours.http_port}/v2/health/live")
        for port in (ours.grpc_port, ours.metrics_port):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_reuse_ports_let_two_servers_share_them(repository: Path) -> None:
    config = loopback_config(repository, load=(), reuse_http_port=True, reuse_grpc_port=True)
    with running_server(config) as first:
        shared = replace(config, http_port=first.http_port or 0, grpc_port=first.grpc_port or 0)
        with running_server(shared) as second:
            assert (second.http_port, second.grpc_port) == (first.http_port, first.grpc_port)


def test_metrics_flags(repository: Path) -> None:
    config = loopback_config(
        repository, allow_cpu_metrics=False, metrics_counter_latencies=False, grpc_response_compression="high"
    )
    with running_server(config) as ours:
        assert _infer_grpc(f"127.0.0.1:{ours.grpc_port}", {}) == {}  # answered compressed, read alike
        with urllib.request.urlopen(f"http://127.0.0.1:{ours.metrics_port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    assert 'nv_inference_request_success{model="parameters",version="1"} 1' in text
    assert "nv_cpu_" not in text and "_duration_us" not in text


def test_grpc_tls_of_its_own_with_client_certificates(repository: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    server_cert, client_cert = ca.issue_cert("127.0.0.1"), ca.issue_cert("client")
    paths = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server_cert.private_key_pem.write_to_path(str(paths["key"]))
    paths["cert"].write_bytes(b"".join(blob.bytes() for blob in server_cert.cert_chain_pems))
    config = loopback_config(
        repository, load=(), grpc_use_ssl_mutual=True, grpc_server_cert=paths["cert"], grpc_server_key=paths["key"],
        grpc_root_cert=paths["ca"],
    )  # fmt: skip
    with running_server(config) as ours:
        _ready(f"http://127.0.0.1:{ours.http_port}/v2/health/live")  # HTTP stays plain, as on tritonserver
        target = f"127.0.0.1:{ours.grpc_port}"
        mutual = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(),
            private_key=client_cert.private_key_pem.bytes(),
            certificate_chain=b"".join(blob.bytes() for blob in client_cert.cert_chain_pems),
        )
        with grpc.secure_channel(target, mutual) as channel:
            assert (
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=10).live
            )
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        with grpc.secure_channel(target, anonymous) as channel, pytest.raises(grpc.RpcError) as refused:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # perfkit's client offers one from perf_analyzer's flags, on grpcio's channel and on its own
        key, chain = tmp_path / "client-key.pem", tmp_path / "client-chain.pem"
        client_cert.private_key_pem.write_to_path(str(key))
        chain.write_bytes(b"".join(blob.bytes() for blob in client_cert.cert_chain_pems))
        tls = TlsSpec(grpc_use_ssl=True, grpc_root_certs=paths["ca"], grpc_client_key=key, grpc_client_chain=chain)
        assert asyncio.run(_perfkit_live(target, tls)) == (True, 0)


async def _perfkit_live(target: str, tls: TlsSpec) -> tuple[bool, int]:
    """Whether perfkit's gRPC client finds the server live, and the status of ServerLive on its lean channel."""
    client = make_client(target, "grpc", tls=tls)
    try:
        wire = client._wire  # type: ignore[union-attr]
        call = await wire.call(wire.encode("/inference.GRPCInferenceService/ServerLive", b""))
        return await client.live(), call.status
    finally:
        await client.close()


@pytest.mark.peers
def test_id_names_the_server_as_on_tritonserver(peers: Path, tmp_path: Path) -> None:
    args = ["--id", "edge-7", "--model-control-mode", "explicit"]
    ours = replace(
        config_from_args(["--model-repository", str(tmp_path), *args]), http_port=0, grpc_port=0, metrics_port=0
    )
    with running_triton(peers, tmp_path, extra_args=args) as triton, running_server(ours) as server:
        names = []
        for url in (triton.http_url, f"127.0.0.1:{server.http_port}"):
            with urllib.request.urlopen(f"http://{url}/v2", timeout=10) as answer:
                names.append(json.load(answer)["name"])
    assert names == ["edge-7", "edge-7"]
