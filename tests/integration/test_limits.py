"""Overload limits: in-flight requests, tensor elements and queue length are bounded, with safe
defaults, and what goes past a limit is answered at once (HTTP 503 / UNAVAILABLE, or 400 /
INVALID_ARGUMENT for a request too large to take) rather than queued without bound.

The request body limit (--http-max-input-size, 413 / RESOURCE_EXHAUSTED) is tested in
test_http_errors.py and test_grpc_errors.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from reference_server.config import (
    DEFAULT_MAX_INFLIGHT_REQUESTS,
    DEFAULT_MAX_TENSOR_ELEMENTS,
    ServerConfig,
    build_parser,
    config_from_args,
)
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config
from tests.waiting import eventually

pytestmark = pytest.mark.integration

#: MatMuls of 256×256 in the slow model: about 0.5 ms each on one core.
SLOW_MATMULS = 60
BURST = 48


def write_slow_model(folder: Path, matmuls: int, config: str) -> None:
    """A model that takes time whatever its input: INPUT0 [1] → OUTPUT0 [1], through `matmuls`
    256×256 MatMuls on one thread."""
    n = 256
    nodes = [helper.make_node("Expand", ["INPUT0", "S"], ["x0"])]
    nodes += [helper.make_node("MatMul", [f"x{i}", "W"], [f"x{i + 1}"]) for i in range(matmuls)]
    nodes += [
        helper.make_node("ReduceMean", [f"x{matmuls}"], ["m"], keepdims=1),
        helper.make_node("Reshape", ["m", "R"], ["OUTPUT0"]),
    ]
    initializers = [
        numpy_helper.from_array(np.full((n, n), 1.0 / n, np.float32), "W"),
        numpy_helper.from_array(np.array([n, n], np.int64), "S"),
        numpy_helper.from_array(np.array([1], np.int64), "R"),
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(config)


SLOW = """\
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""
# Triton accepts dynamic_batching with max_batch_size 0: requests queue (under the queue policy)
# and run one at a time.
QUEUED = SLOW + "dynamic_batching { default_queue_policy { max_queue_size: 2 } }\n"
SLOW_REQUEST = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]})


@pytest.fixture(scope="module")
def limits_repository(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("limits") / "models"
    repository.mkdir()
    write_slow_model(repository / "slow", SLOW_MATMULS, SLOW)
    write_slow_model(repository / "queued", SLOW_MATMULS, QUEUED)
    return repository


@pytest.fixture(scope="module")
def limited_server(limits_repository: Path) -> Iterator[ReferenceServer]:
    config = loopback_config(limits_repository, max_inflight_requests=4, max_tensor_elements=1000)
    with running_server(config) as server:
        yield server


async def _http_burst(url: str, n: int) -> list[tuple[int, str, float]]:
    async with aiohttp.ClientSession() as session:

        async def one() -> tuple[int, str, float]:
            start = time.perf_counter()
            async with session.post(url, data=SLOW_REQUEST) as response:
                body = await response.text()
                return response.status, body, time.perf_counter() - start

        return await asyncio.gather(*(one() for _ in range(n)))


async def _grpc_burst(target: str, model: str, n: int) -> list[tuple[grpc.StatusCode, str, float]]:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def one() -> tuple[grpc.StatusCode, str, float]:
            start = time.perf_counter()
            try:
                await stub.ModelInfer(request, timeout=60)
                return grpc.StatusCode.OK, "", time.perf_counter() - start
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or "", time.perf_counter() - start

        return await asyncio.gather(*(one() for _ in range(n)))


def test_requests_past_the_inflight_limit_get_503_at_once(limited_server: ReferenceServer) -> None:
    answers = asyncio.run(_http_burst(f"http://{limited_server.http_url}/v2/models/slow/infer", BURST))
    ok = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    assert len(ok) + len(refused) == BURST, {a[0] for a in answers}
    assert len(ok) >= 4 and refused
    assert all("--max-inflight-requests" in json.loads(body)["error"] for _, body, _ in refused)
    # Refused at the door: far sooner than the accepted requests, which wait their turn on the model.
    slowest_ok = max(seconds for *_, seconds in ok)
    assert max(seconds for *_, seconds in refused) < slowest_ok
    assert limited_server.dataplane is not None and limited_server.dataplane.inflight == 0


def test_grpc_calls_past_the_inflight_limit_get_unavailable(limited_server: ReferenceServer) -> None:
    answers = asyncio.run(_grpc_burst(f"127.0.0.1:{limited_server.grpc_port}", "slow", BURST))
    codes = [code for code, *_ in answers]
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, set(codes)
    assert codes.count(grpc.StatusCode.OK) >= 4 and grpc.StatusCode.UNAVAILABLE in codes
    assert all("--max-inflight-requests" in details for code, details, _ in answers if code != grpc.StatusCode.OK)
    assert limited_server.dataplane is not None and limited_server.dataplane.inflight == 0


def test_cancelled_grpc_calls_give_their_inflight_slots_back(limited_server: ReferenceServer) -> None:
    async def scenario() -> tuple[list[object], grpc.StatusCode]:
        request = pb.ModelInferRequest(model_name="slow")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        request.raw_input_contents.append(np.ones(1, np.float32).tobytes())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{limited_server.grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            # As many calls as there are slots, given up while their requests run or wait.
            calls = [stub.ModelInfer(request, timeout=60) for _ in range(4)]
            await asyncio.sleep(0.01)
            for call in calls:
                call.cancel()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            # Their requests run to their end; then every slot is free again and a new call is served.
            assert limited_server.dataplane is not None
            plane = limited_server.dataplane
            await eventually(lambda: plane.inflight == 0, timeout_s=30)
            try:
                await stub.ModelInfer(request, timeout=60)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
            return outcomes, code

    outcomes, code = asyncio.run(scenario())
    assert all(isinstance(o, (asyncio.CancelledError, pb.ModelInferResponse)) for o in outcomes), outcomes
    assert any(isinstance(o, asyncio.CancelledError) for o in outcomes)
    assert code == grpc.StatusCode.OK
    assert limited_server.dataplane is not None and limited_server.dataplane.inflight == 0


def test_a_full_model_queue_rejects_with_the_queue_policy_error(limits_repository: Path) -> None:
    config = ServerConfig(model_repository=limits_repository, http_port=0, grpc_port=0, metrics_port=0)
    with running_server(config) as server:
        answers = asyncio.run(_grpc_burst(f"127.0.0.1:{server.grpc_port}", "queued", 24))
    codes = [code for code, *_ in answers]
    rejected = [details for code, details, _ in answers if code == grpc.StatusCode.UNAVAILABLE]
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    # One running and two queued at most at any time: most of a simultaneous burst is refused.
    assert rejected and all("Exceeds maximum queue size (2)" in d for d in rejected), rejected[:3]
    assert codes.count(grpc.StatusCode.OK) >= 3


def test_requests_past_the_element_limit_are_refused_before_they_run(limited_server: ReferenceServer) -> None:
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1001], "parameters": {"binary_data_size": 4004}}]}
    )
    answers = asyncio.run(_post_raw(limited_server, header.encode() + bytes(4004), len(header)))
    status, body = answers
    assert status == 400 and "--max-tensor-elements" in json.loads(body)["error"], body
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1001])
    request.raw_input_contents.append(bytes(4004))
    with grpc.insecure_channel(f"127.0.0.1:{limited_server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-tensor-elements" in (caught.value.details() or "")


async def _post_raw(server: ReferenceServer, body: bytes, header_length: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        url = f"http://{server.http_url}/v2/models/slow/infer"
        headers = {"Inference-Header-Content-Length": str(header_length)}
        async with session.post(url, data=body, headers=headers) as response:
            return response.status, await response.text()


def test_the_server_serves_normally_after_an_overload(limited_server: ReferenceServer) -> None:
    (status, body, _), *_ = asyncio.run(_http_burst(f"http://{limited_server.http_url}/v2/models/slow/infer", 1))
    assert status == 200, body


def test_limits_have_safe_defaults_and_refuse_nonsense(
    demo_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_args(["--model-repository", str(demo_repository)])
    assert config.max_inflight_requests == DEFAULT_MAX_INFLIGHT_REQUESTS == 4096
    assert config.max_tensor_elements == DEFAULT_MAX_TENSOR_ELEMENTS == 1 << 24
    assert config.http_max_input_size == 64 * 1024 * 1024
    assert config.host == "127.0.0.1"
    help_text = build_parser().format_help()
    assert "--max-inflight-requests" in help_text and "--max-tensor-elements" in help_text
    for flag in ("--max-inflight-requests", "--max-tensor-elements"):
        with pytest.raises(SystemExit) as exited:
            config_from_args(["--model-repository", str(demo_repository), flag, "0"])
        assert exited.value.code == 2
        assert flag in capsys.readouterr().err


# -- the read gate ---------------------------------------------------------------------------------


def _infer_head(port: int, body: bytes) -> bytes:
    return (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()


def _status(connection: socket.socket) -> int:
    """The status of the next response on `connection` (its first line is enough here)."""
    head = b""
    while b"\r\n" not in head:
        chunk = connection.recv(4096)
        if not chunk:
            raise AssertionError("the server closed the connection")
        head += chunk
    return int(head.split(b" ", 2)[1])


@pytest.mark.parametrize("pause_at", [2, 0])
def test_past_the_read_gate_new_requests_wait_unread_until_half_are_done(
    limits_repository: Path, pause_at: int
) -> None:
    body = SLOW_REQUEST.encode()
    config = loopback_config(limits_repository, http_read_pause_inflight=pause_at)
    with running_server(config) as server:
        assert server.http_port is not None and server.dataplane is not None
        port, plane = server.http_port, server.dataplane
        with contextlib.ExitStack() as stack:
            a, b, probe = (stack.enter_context(socket.create_connection(("127.0.0.1", port), 10)) for _ in range(3))
            # Two requests admitted but held reading their bodies, which come later.
            for connection in (a, b):
                connection.sendall(_infer_head(port, body) + body[:5])
            deadline = time.monotonic() + 10
            while plane.inflight < 2:
                assert time.monotonic() < deadline, "the two requests were never admitted"
                time.sleep(0.005)
            probe.sendall(f"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            probe.settimeout(0.5)
            if pause_at == 0:  # no gate: read and answered at once
                assert _status(probe) == 200
                return
            with pytest.raises(TimeoutError):
                _status(probe)  # unread while the gate is closed
            probe.settimeout(10)
            # A connection being served is still read: its body arrives and it is answered ...
            a.sendall(body[5:])
            assert _status(a) == 200
            # ... which brings in flight down to half the mark: the waiting probe is read and answered.
            assert _status(probe) == 200
            b.sendall(body[5:])
            assert _status(b) == 200


def test_a_body_that_stops_coming_gets_408_with_connection_close(limits_repository: Path) -> None:
    body = SLOW_REQUEST.encode()
    with running_server(loopback_config(limits_repository, http_body_timeout_secs=0.5)) as server:
        assert server.http_port is not None and server.dataplane is not None
        with socket.create_connection(("127.0.0.1", server.http_port), 10) as connection:
            started = time.monotonic()
            connection.sendall(_infer_head(server.http_port, body) + body[:5])  # and nothing more
            answer = b""
            while b"}" not in answer:  # the JSON error ends the response
                chunk = connection.recv(4096)
                assert chunk, answer
                answer += chunk
            elapsed = time.monotonic() - started
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head, answer
        assert "--http-body-timeout-secs" in json.loads(payload)["error"]
        assert 0.5 <= elapsed < 8
        assert server.dataplane.inflight == 0  # the slot it held is free again
