"""BYTES tensors through the reference server to onnxruntime string tensors and back, byte for byte,
driven by NVIDIA's tritonclient over HTTP (JSON and the binary extension) and gRPC (raw contents and
`bytes_contents`).

onnxruntime's Python API carries strings as UTF-8 text, so an element that is not UTF-8 is refused
with a 400 / INVALID_ARGUMENT naming the model, the input and the element, and the server stays up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration

#: NUL inside and at the end, empty, multi-byte UTF-8 (2, 3 and 4 bytes), a 1 MB element.
TEXTS = [b"he\x00llo\x00", b"", "h\u00e9llo \u2713 \U0001f600".encode(), b"x" * (1 << 20)]
NOT_UTF8 = [b"fine", b"caf\xe9", b"\xff"]


def _model(path: Path, node: onnx.NodeProto, in_type: int, out_type: int, dims: list[str]) -> None:
    graph = helper.make_graph(
        [node],
        path.parent.parent.name,
        [helper.make_tensor_value_info("TEXT", in_type, dims)],
        [helper.make_tensor_value_info("OUT", out_type, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    repository = tmp_path_factory.mktemp("strings") / "models"
    echo = repository / "string_echo"
    _model(
        echo / "1" / "model.onnx",
        helper.make_node("Identity", ["TEXT"], ["OUT"]),
        TensorProto.STRING,
        TensorProto.STRING,
        ["batch", "n"],
    )
    (echo / "config.pbtxt").write_text(
        'name: "string_echo"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"
    )
    parse = repository / "parse_floats"
    _model(
        parse / "1" / "model.onnx",
        helper.make_node("Cast", ["TEXT"], ["OUT"], to=TensorProto.FLOAT),
        TensorProto.STRING,
        TensorProto.FLOAT,
        ["n"],
    )  # a bare config: completed from the graph
    with running_server(loopback_config(repository, http_max_input_size=16 << 20)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ReferenceServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, concurrency=4, network_timeout=60)


@pytest.fixture(scope="module")
def grpc_url(server: ReferenceServer) -> str:
    return f"127.0.0.1:{server.grpc_port}"


def strings(items: list[bytes]) -> np.ndarray:
    arr = np.empty((1, len(items)), dtype=object)
    arr[0, :] = items
    return arr


def http_echo(
    client: httpclient.InferenceServerClient, items: list[bytes], binary_in: bool, binary_out: bool
) -> np.ndarray:
    inp = httpclient.InferInput("TEXT", [1, len(items)], "BYTES")
    inp.set_data_from_numpy(strings(items), binary_data=binary_in)
    out = httpclient.InferRequestedOutput("OUT", binary_data=binary_out)
    got = client.infer("string_echo", [inp], outputs=[out]).as_numpy("OUT")
    assert got is not None
    # tritonclient gives a JSON output's elements as the str that JSON carries.
    return got if binary_out else np.vectorize(str.encode, otypes=[object])(got)


@pytest.mark.parametrize(("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)])
def test_http_round_trips_bytes_exactly(
    http: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool
) -> None:
    got = http_echo(http, TEXTS, binary_in, binary_out)
    assert got.shape == (1, len(TEXTS))
    assert got.ravel().tolist() == TEXTS


def test_an_empty_string_tensor_round_trips(http: httpclient.InferenceServerClient) -> None:
    assert http_echo(http, [], True, True).shape == (1, 0)


def test_grpc_raw_contents_round_trip_bytes_exactly(grpc_url: str) -> None:
    with grpcclient.InferenceServerClient(grpc_url) as client:
        inp = grpcclient.InferInput("TEXT", [1, len(TEXTS)], "BYTES")
        inp.set_data_from_numpy(strings(TEXTS))
        got = client.infer("string_echo", [inp]).as_numpy("OUT")
    assert got is not None and got.ravel().tolist() == TEXTS


def test_grpc_bytes_contents_round_trip_bytes_exactly(grpc_url: str) -> None:
    request = pb.ModelInferRequest(model_name="string_echo")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, len(TEXTS)]).contents.bytes_contents.extend(TEXTS)
    with grpc.insecure_channel(grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    raw = response.raw_output_contents[0]
    assert raw == b"".join(len(t).to_bytes(4, "little") + t for t in TEXTS)


def test_not_utf8_is_refused_naming_model_input_and_element(
    http: httpclient.InferenceServerClient, grpc_url: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        http_echo(http, NOT_UTF8, True, True)
    message = str(refused.value)
    assert refused.value.status() == "400"
    assert "'string_echo'" in message and "'TEXT'" in message and "element 1 is not valid UTF-8" in message

    with grpcclient.InferenceServerClient(grpc_url) as client:
        inp = grpcclient.InferInput("TEXT", [1, 3], "BYTES")
        inp.set_data_from_numpy(strings(NOT_UTF8))
        with pytest.raises(InferenceServerException) as grpc_refused:
            client.infer("string_echo", [inp])
    assert grpc_refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "element 1 is not valid UTF-8" in str(grpc_refused.value)
    assert http_echo(http, [b"still up"], True, True).ravel().tolist() == [b"still up"]


def test_a_refused_request_fails_alone_among_concurrent_ones(http: httpclient.InferenceServerClient) -> None:
    payloads = [[b"a\x00", b"b"], NOT_UTF8[1:], [b"", b"c"], [b"d", "\u00e9".encode()]]
    pending = []
    for items in payloads:
        inp = httpclient.InferInput("TEXT", [1, 2], "BYTES")
        inp.set_data_from_numpy(strings(items))
        pending.append(http.async_infer("string_echo", [inp]))
    for items, request in zip(payloads, pending):
        if items is payloads[1]:
            with pytest.raises(InferenceServerException, match="element 0 is not valid UTF-8"):
                request.get_result()
        else:
            assert request.get_result().as_numpy("OUT").ravel().tolist() == items


@pytest.mark.parametrize("binary", [True, False])
def test_a_model_that_parses_strings_answers_right(http: httpclient.InferenceServerClient, binary: bool) -> None:
    inp = httpclient.InferInput("TEXT", [3], "BYTES")
    inp.set_data_from_numpy(np.array([b"1.5", b"-2", b"1e3"], dtype=object), binary_data=binary)
    got = http.infer("parse_floats", [inp]).as_numpy("OUT")
    np.testing.assert_array_equal(got, np.array([1.5, -2.0, 1000.0], dtype=np.float32))
