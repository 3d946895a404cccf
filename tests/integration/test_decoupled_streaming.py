"""Streaming inference end to end: gRPC ModelStreamInfer (raw gRPC, tritonclient's streaming client
and its asyncio one), the HTTP generate extension, and perf_analyzer --streaming, against the
reference server and against real tritonserver 2.51 serving the same decoupled python models
(tests/decoupled_models.py). Triton's replies are the ground truth the expectations below were
taken from; the reference server must give the same.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from perfkit.testing import TritonProcess, write_sleeper
from reference_server.server import ReferenceServer, running_server
from tests.decoupled_models import write_decoupled_ensemble, write_decoupled_models
from tests.servers import loopback_config, running_triton
from v2kit.demo import build_demo_repository

pytestmark = [pytest.mark.integration]

#: (HTTP host:port, gRPC host:port) of a server.
Endpoints = tuple[str, str]

SERVERS = [pytest.param("triton", marks=pytest.mark.peers), "ours"]


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    """The reference server: the demo identity, a decoupled copy of it, and the decoupled python models."""
    repository = build_demo_repository(tmp_path_factory.mktemp("ours") / "models")
    for unused in ("mlp", "convnet"):
        shutil.rmtree(repository / unused)
    decoupled = repository / "identity_decoupled"
    shutil.copytree(repository / "identity", decoupled)
    config = (repository / "identity" / "config.pbtxt").read_text().replace('"identity"', '"identity_decoupled"')
    (decoupled / "config.pbtxt").write_text(config + "\nmodel_transaction_policy { decoupled: true }\n")
    write_decoupled_models(repository)
    write_decoupled_ensemble(repository)
    with running_server(loopback_config(repository)) as server:
        yield server


@pytest.fixture(scope="module")
def triton(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    """Real tritonserver on the same decoupled models, and a python `identity` shaped as the demo's."""
    repository = tmp_path_factory.mktemp("triton") / "models"
    write_decoupled_models(repository)
    write_decoupled_ensemble(repository)
    write_sleeper(repository, "identity", service_ms=0)
    with running_triton(peers, repository, auto_complete=False) as server:
        yield server


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Endpoints:
    if request.param == "triton":
        triton: TritonProcess = request.getfixturevalue("triton")
        return triton.http_url, triton.grpc_url
    reference: ReferenceServer = request.getfixturevalue("ours")
    return f"127.0.0.1:{reference.http_port}", f"127.0.0.1:{reference.grpc_port}"


# --- gRPC ModelStreamInfer, message by message ----------------------------------------------------

Reply = tuple[str, tuple[Any, ...], bool | None, str]


def stream_request(model: str, request_id: str, values: list[int], empty_final: bool | None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="IN", datatype="INT32", shape=[len(values)])
    request.raw_input_contents.append(np.array(values, np.int32).tobytes())
    if empty_final is not None:
        request.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return request


def summary(reply: pb.ModelStreamInferResponse) -> Reply:
    """(error, outputs, triton_final_response, model_version) of a reply."""
    response = reply.infer_response
    outputs = tuple(
        (o.name, np.frombuffer(raw, np.uint32 if o.datatype == "UINT32" else np.int32).tolist())
        for o, raw in zip(response.outputs, response.raw_output_contents)
    )
    parameters = response.parameters
    final = parameters["triton_final_response"].bool_param if "triton_final_response" in parameters else None
    return reply.error_message, outputs, final, response.model_version


def out(value: int, index: int) -> Reply:
    return ("", (("OUT", [value]), ("IDX", [index])), False, "1")


NEGATIVE = ("repeat: element 1 is negative (-2)", (), False, "")
EMPTY_FINAL = ("", (), True, "")
#: What Triton 2.51 answers each request with, in order: (model, IN, triton_enable_empty_final_response).
STREAMS: dict[str, tuple[str, list[int], bool | None, list[Reply]]] = {
    "n-responses": ("repeat", [1, -2, 3], None, [out(1, 0), NEGATIVE, out(3, 2)]),
    "n-responses-empty-final": ("repeat", [1, -2, 3], True, [out(1, 0), NEGATIVE, out(3, 2), EMPTY_FINAL]),
    "no-responses": ("repeat", [], False, []),
    "no-responses-empty-final": ("repeat", [], True, [EMPTY_FINAL]),
    "final-flag-only": ("silent", [5], None, []),
    "final-flag-only-empty-final": ("silent", [5], True, [EMPTY_FINAL]),
    "after-execute-returned": ("late", [7, 8], True, [("", (("OUT", [7, 8]),), True, "1")]),
}


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_decoupled_models_stream_as_triton_streams_them(server: Endpoints) -> None:
    """All the requests go on one stream at once; each request's replies keep their order."""
    channel = grpc.insecure_channel(server[1])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    requests = [stream_request(model, rid, values, empty) for rid, (model, values, empty, _) in STREAMS.items()]
    replies: dict[str, list[Reply]] = {rid: [] for rid in STREAMS}
    try:
        for reply in stub.ModelStreamInfer(iter(requests), timeout=30):
            replies[reply.infer_response.id].append(summary(reply))
    finally:
        channel.close()
    assert replies == {rid: expected for rid, (*_, expected) in STREAMS.items()}


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_tritonclient_streams_a_decoupled_model(server: Endpoints) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server[1])
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = grpcclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([4, 5, 6], np.int32))
    client.async_stream_infer("repeat", [tensor], request_id="r", enable_empty_final_response=True)
    client.stop_stream()  # waits for the server to end the call, after the request's last reply
    got = []
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        got.append((response.id, None if final else int(result.as_numpy("OUT")[0]), final))
    client.close()
    assert got == [("r", 4, False), ("r", 5, False), ("r", 6, False), ("r", None, True)]


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_tritonclient_aio_streams_a_decoupled_model(server: Endpoints) -> None:
    async def main() -> list[tuple[str, list[int]]]:
        client = grpcaio.InferenceServerClient(server[1])
        tensor = grpcaio.InferInput("IN", [2], "INT32")
        tensor.set_data_from_numpy(np.array([7, 8], np.int32))

        async def requests() -> Any:
            for rid in ("a", "b"):
                yield {"model_name": "late", "inputs": [tensor], "request_id": rid}

        got = []
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got.append((result.get_response().id, result.as_numpy("OUT").tolist()))
            if len(got) == 2:
                break
        await client.close()
        return got

    assert sorted(asyncio.run(asyncio.wait_for(main(), 30))) == [("a", [7, 8]), ("b", [7, 8])]


# --- an ensemble with a decoupled step -------------------------------------------------------------

#: (IN, what Triton 2.51 streams for it) for `repeat_times10`, with empty final responses asked for.
ENSEMBLE_STREAMS: dict[str, tuple[list[int], list[Reply]]] = {
    # `times10` runs once per response of `repeat`; the last response carries the final flag.
    "three": (
        [1, 2, 3],
        [("", (("INDEX", [i]), ("RESULT", [10 * v])), i == 2, "1") for i, v in enumerate([1, 2, 3])],
    ),
    # `repeat` sends no response: the ensemble's final flag comes alone.
    "none": ([], [EMPTY_FINAL]),
}


def _ensemble_replies(server: Endpoints, requests: list[pb.ModelInferRequest]) -> dict[str, list[Reply]]:
    channel = grpc.insecure_channel(server[1])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    replies: dict[str, list[Reply]] = {request.id: [] for request in requests}
    try:
        for reply in stub.ModelStreamInfer(iter(requests), timeout=30):
            error, outputs, final, version = summary(reply)
            replies.setdefault(reply.infer_response.id, []).append((error, tuple(sorted(outputs)), final, version))
    finally:
        channel.close()
    for rid, got in replies.items():
        # Which response carries the final flag depends on what is still in flight when the last one
        # completes (Triton's rule): a final flag alone after the last response counts as that one's.
        if len(got) >= 2 and got[-1] == EMPTY_FINAL and got[-2][2] is False:
            replies[rid] = [*got[:-2], (*got[-2][:2], True, got[-2][3])]
        # Responses from different passes may complete in any order, in Triton as here.
        replies[rid] = sorted(replies[rid], key=lambda reply: (reply[2] is True, reply[1]))
    return replies


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_an_ensemble_streams_the_responses_of_its_decoupled_step(server: Endpoints) -> None:
    requests = [stream_request("repeat_times10", rid, values, True) for rid, (values, _) in ENSEMBLE_STREAMS.items()]
    replies = _ensemble_replies(server, requests)
    expected = {
        rid: sorted(want, key=lambda reply: (reply[2] is True, reply[1])) for rid, (_, want) in ENSEMBLE_STREAMS.items()
    }
    assert replies == expected


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_an_error_response_of_the_decoupled_step_ends_the_ensembles_stream(server: Endpoints) -> None:
    (replies,) = _ensemble_replies(server, [stream_request("repeat_times10", "bad", [4, -1, 5], True)]).values()
    # Triton sends the step's error, named after the ensemble, as the final reply.
    assert replies[-1] == ("in ensemble 'repeat_times10', repeat: element 1 is negative (-1)", (), True, "")
    assert all(reply[1] == (("INDEX", [0]), ("RESULT", [40])) for reply in replies[:-1])


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_an_ensemble_with_a_decoupled_step_is_decoupled(server: Endpoints) -> None:
    http_client = httpclient.InferenceServerClient(server[0])
    grpc_client = grpcclient.InferenceServerClient(server[1])
    try:
        config = http_client.get_model_config("repeat_times10")
        assert config["model_transaction_policy"] == {"decoupled": True}
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.infer("repeat_times10", [stream_input(grpcclient, [1])])
        assert caught.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
        with pytest.raises(InferenceServerException) as caught:
            http_client.infer("repeat_times10", [stream_input(httpclient, [1])])
        assert caught.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    finally:
        http_client.close()
        grpc_client.close()


def stream_input(client: Any, values: list[int]) -> Any:
    tensor = client.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


# --- models that are not decoupled, over the stream (the reference server's own) --------------------


def identity_input(module: Any, values: list[float]) -> Any:
    tensor = module.InferInput("INPUT0", [1, len(values)], "FP32")
    tensor.set_data_from_numpy(np.array([values], np.float32))
    return tensor


def test_tritonclient_streams_many_requests_to_a_model_that_is_not_decoupled(ours: ReferenceServer) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ours.grpc_port}")
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for i in range(8):
        client.async_stream_infer("identity", [identity_input(grpcclient, [i, i + 0.5])], request_id=str(i))
    client.stop_stream()
    got = {}
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param  # the one response is the last
        got[response.id] = result.as_numpy("OUTPUT0").tolist()
    client.close()
    assert got == {str(i): [[i, i + 0.5]] for i in range(8)}


def test_tritonclient_aio_streams_a_model_that_is_not_decoupled(ours: ReferenceServer) -> None:
    async def main() -> dict[str, Any]:
        client = grpcaio.InferenceServerClient(f"127.0.0.1:{ours.grpc_port}")

        async def requests() -> Any:
            for i in range(4):
                yield {"model_name": "identity", "inputs": [identity_input(grpcaio, [i])], "request_id": str(i)}

        got = {}
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("OUTPUT0").tolist()
            if len(got) == 4:
                break
        await client.close()
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == {str(i): [[float(i)]] for i in range(4)}


def test_unary_inference_on_a_decoupled_model_gets_tritons_error(ours: ReferenceServer) -> None:
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{ours.grpc_port}")
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer("identity_decoupled", [identity_input(grpcclient, [1.0])])
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert caught.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    http_client = httpclient.InferenceServerClient(f"127.0.0.1:{ours.http_port}")
    with pytest.raises(InferenceServerException) as caught:
        http_client.infer("identity_decoupled", [identity_input(httpclient, [1.0])])
    assert caught.value.status() == "501"
    assert caught.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    # ...and the model is served where it can be: on the stream.
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    grpc_client.async_stream_infer("identity_decoupled", [identity_input(grpcclient, [2.0])], request_id="d")
    grpc_client.stop_stream()
    result, error = results.get_nowait()
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2.0]]


# --- the HTTP generate extension ----------------------------------------------------------------------


def post(address: str, path: str, body: Any) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection(address, timeout=30)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


GENERATE_IDENTITY = [
    ("generate", {"id": "7", "INPUT0": [1.5, 2, 3]}),
    ("generate", {"INPUT0": 2.5, "flag": True, "parameters": {"x": 1}}),
    ("generate_stream", {"id": "7", "INPUT0": [1.5, 2, 3]}),
    ("generate_stream", {"INPUT0": 2.5}),
    ("generate", {"INPUT1": [1]}),
    ("generate_stream", {"INPUT0": [1], "parameters": {"p": [2]}}),
]


@pytest.mark.peers
def test_generate_on_a_model_that_is_not_decoupled_answers_as_triton(
    ours: ReferenceServer, triton: TritonProcess
) -> None:
    for endpoint, body in GENERATE_IDENTITY:
        path = f"/v2/models/identity/{endpoint}"
        theirs = post(triton.http_url, path, body)
        mine = post(f"127.0.0.1:{ours.http_port}", path, body)
        if theirs[0] == 200:
            assert mine == theirs, (endpoint, body)
        else:  # errors: the status and the content type; the wording is ours where Triton's is its JSON parser's
            assert mine[:2] == theirs[:2], (endpoint, body, mine, theirs)


def test_generate_on_a_model_that_is_not_decoupled(ours: ReferenceServer) -> None:
    address = f"127.0.0.1:{ours.http_port}"
    event = b'{"OUTPUT0":[1.5,2.0,3.0],"id":"7","model_name":"identity","model_version":"1"}'
    assert post(address, "/v2/models/identity/generate", {"id": "7", "INPUT0": [1.5, 2, 3]}) == (
        200, "application/json", event,
    )  # fmt: skip
    assert post(address, "/v2/models/identity/versions/1/generate_stream", {"id": "7", "INPUT0": [1.5, 2, 3]}) == (
        200, "text/event-stream; charset=utf-8", b"data: " + event + b"\n\n",
    )  # fmt: skip
    status, kind, body = post(address, "/v2/models/nosuch/generate_stream", {"INPUT0": [1]})
    assert (status, kind) == (404, "application/json") and b"nosuch" in body


@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_generate_stream_on_a_decoupled_model(server: Endpoints) -> None:
    address = server[0]
    status, kind, body = post(address, "/v2/models/repeat/generate_stream", {"id": "42", "IN": [1, -2, 3]})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert body == (
        b'data: {"IDX":0,"OUT":1,"id":"42","model_name":"repeat","model_version":"1"}\n\n'
        b'data: {"error":"repeat: element 1 is negative (-2)"}\n\n'
        b'data: {"IDX":2,"OUT":3,"id":"42","model_name":"repeat","model_version":"1"}\n\n'
    )
    assert post(address, "/v2/models/silent/generate_stream", {"IN": [4]}) == (
        200, "text/event-stream; charset=utf-8", b"",
    )  # fmt: skip
    assert post(address, "/v2/models/repeat/generate", {"IN": [4]}) == (
        200, "application/json", b'{"IDX":0,"OUT":4,"model_name":"repeat","model_version":"1"}',
    )  # fmt: skip
    status, kind, body = post(address, "/v2/models/repeat/generate", {"IN": [4, 5]})
    assert (status, json.loads(body)) == (200, {"error": (
        "generate expects model to produce exactly 1 response, use generate stream for model that "
        "generates various number of responses"
    )})  # fmt: skip


# --- perf_analyzer ---------------------------------------------------------------------------------------


@pytest.mark.peers
@pytest.mark.parametrize("server", SERVERS, indirect=True)
def test_perf_analyzer_streams_to_a_decoupled_model(peers: Path, server: Endpoints) -> None:
    # Four zeros in, four responses out per request: perf_analyzer counts both.
    result = subprocess.run(
        [
            str(peers / "bin" / "perf_analyzer"), "-m", "repeat", "-u", server[1], "-i", "grpc", "--streaming",
            "--shape", "IN:4", "--input-data", "zero", "--concurrency-range", "2", "-p", "150", "-s", "1000", "-r", "10",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Detected decoupled model" in result.stdout
    figures = {}
    for line in result.stdout.splitlines():
        name, _, value = line.strip().partition(": ")
        if name in ("Throughput", "Response Throughput"):
            figures[name] = float(value.split()[0])
    assert figures["Throughput"] > 0, result.stdout
    assert 3.5 < figures["Response Throughput"] / figures["Throughput"] < 4.5, result.stdout


# --- a client that goes away -----------------------------------------------------------------------------


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_a_client_that_goes_away_cancels_its_requests(ours: ReferenceServer) -> None:
    # `late` would answer these after 10 s; the requests must be gone long before.
    plane = ours.dataplane
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ours.grpc_port}")
    client.start_stream(callback=lambda result, error: None)
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    for rid in ("a", "b"):
        client.async_stream_infer("late", [tensor], request_id=rid, parameters={"delay_ms": 10_000})
    wait_until(lambda: plane.inflight == 2)
    client.stop_stream(cancel_requests=True)
    wait_until(lambda: plane.inflight == 0, timeout_s=5)
    client.close()
    connection = http.client.HTTPConnection(f"127.0.0.1:{ours.http_port}", timeout=30)
    connection.request("POST", "/v2/models/late/generate_stream", json.dumps({"IN": [1], "delay_ms": 10_000}))
    wait_until(lambda: plane.inflight == 1)
    connection.close()
    wait_until(lambda: plane.inflight == 0, timeout_s=5)
    # The server goes on serving the model.
    assert post(f"127.0.0.1:{ours.http_port}", "/v2/models/late/generate", {"IN": [3]})[2] == (
        b'{"OUT":3,"model_name":"late","model_version":"1"}'
    )
