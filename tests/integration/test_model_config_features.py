"""Reshape, classification and the load API's `file:` overrides through NVIDIA's tritonclient (HTTP
and gRPC) and perf_analyzer.

NVIDIA's quick-start densenet_onnx folder (its config.pbtxt as is, a labels file, and a tiny
stand-in ONNX graph with densenet's input and output shapes) loads and answers top-k classes with
labels, and an ensemble step on it gets the same scores; a batching model with reshapes on both sides is loaded from files sent in the load request,
never written into the repository; what should be refused is, with the reason, and the server
serves on.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.integration.test_perf_analyzer import run_perf_analyzer
from tests.servers import loopback_config
from tests.unit.test_reshape_classification import DENSENET_CONFIG  # NVIDIA's quick-start config, as is

pytestmark = pytest.mark.integration

# An ensemble step calls the composing model with its dims; the reshape is the composing model's.
ENSEMBLE_CONFIG = """\
name: "densenet_ensemble"
platform: "ensemble"
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling { step [ { model_name: "densenet_onnx" model_version: -1
  input_map { key: "data_0" value: "IMAGE" } output_map { key: "fc6_1" value: "SCORES" } } ] }
"""
LABELS = [b"TENCH", b"GOLDFISH", b"WHITE SHARK", *(f"CLASS {i}".encode() for i in range(3, 1000))]
WEIGHTS = np.random.default_rng(19).standard_normal((1000, 3, 1, 1)).astype(np.float32)


def _save(graph: onnx.GraphProto, path: Path) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path.read_bytes()


def densenet_standin(path: Path) -> None:
    """data_0 [1,3,224,224] -> channel means -> a 1x1 convolution to 1000 -> fc6_1 [1,1000,1,1]."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "W"], ["fc6_1"]),
        ],
        "densenet_standin",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])],
        [numpy_helper.from_array(WEIGHTS, "W")],
    )
    _save(graph, path)


def reshaped_model(path: Path) -> bytes:
    """X FP32 [batch,2,2] -> Y, T STRING [batch,1] -> U (identities): the model's side of a reshape."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"]), helper.make_node("Identity", ["T"], ["U"])],
        "reshaped",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2, 2]),
            helper.make_tensor_value_info("T", TensorProto.STRING, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2, 2]),
            helper.make_tensor_value_info("U", TensorProto.STRING, ["batch", 1]),
        ],
    )
    return _save(graph, path)


def reshaped_config(reshape: list[int] | None = None) -> str:
    """The client sees X and Y as [batch, 4]; the model takes and gives [batch, 2, 2]."""
    shape = {"shape": reshape or [2, 2]}
    return json.dumps({
        "name": "reshaped",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [
            {"name": "X", "data_type": "TYPE_FP32", "dims": [4], "reshape": shape},
            {"name": "T", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "output": [
            {"name": "Y", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}, "label_filename": "labels.txt"},
            {"name": "U", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "dynamic_batching": {},
    })  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The reshaped model's folder as the load request's `file:` parameters."""
    onnx_bytes = reshaped_model(tmp_path_factory.mktemp("files") / "model.onnx")
    return {"file:1/model.onnx": onnx_bytes, "file:labels.txt": b"zero\none\ntwo\n"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    repository = tmp_path_factory.mktemp("config_features") / "models"
    folder = repository / "densenet_onnx"
    densenet_standin(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(DENSENET_CONFIG)
    (folder / "densenet_labels.txt").write_bytes(b"\n".join(LABELS) + b"\n")
    (repository / "densenet_ensemble" / "1").mkdir(parents=True)
    (repository / "densenet_ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with running_server(loopback_config(repository, load=("densenet_onnx", "densenet_ensemble"))) as running:
        yield running


def _clients(server: ReferenceServer) -> list[Any]:
    return [
        httpclient.InferenceServerClient(server.http_url, network_timeout=60),
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"),
    ]


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_the_densenet_quick_start_folder_answers_labelled_top_k_classes(server: ReferenceServer) -> None:
    image = np.random.default_rng(5).random((3, 224, 224), dtype=np.float32)
    scores = (WEIGHTS[:, :, 0, 0] @ image.mean(axis=(1, 2), dtype=np.float64)).astype(np.float32)
    for client in _clients(server):
        module = _module(client)
        data = module.InferInput("data_0", [3, 224, 224], "FP32")
        data.set_data_from_numpy(image)
        raw = client.infer("densenet_onnx", [data]).as_numpy("fc6_1")
        assert raw.shape == (1000,)  # the client sees dims [1000], not the model's [1,1000,1,1]
        np.testing.assert_allclose(raw, scores, rtol=1e-4, atol=1e-5)
        top = np.argsort(-raw, kind="stable")[:3]
        expected = [f"{raw[i]:f}:{i}:".encode() + LABELS[i] for i in top]
        classes = client.infer("densenet_onnx", [data], outputs=[module.InferRequestedOutput("fc6_1", class_count=3)])
        got = classes.as_numpy("fc6_1")
        assert got.shape == (3,) and got.tolist() == expected  # no batch dimension: max_batch_size 0
        # More classes than elements: all of them (Triton's min(k, n)).
        every = client.infer("densenet_onnx", [data], outputs=[module.InferRequestedOutput("fc6_1", class_count=5000)])
        assert every.as_numpy("fc6_1").shape == (1000,)
        image_input = module.InferInput("IMAGE", [3, 224, 224], "FP32")
        image_input.set_data_from_numpy(image)
        composed = client.infer("densenet_ensemble", [image_input]).as_numpy("SCORES")
        np.testing.assert_array_equal(composed, raw)
        client.close()
    assert "classification" in httpclient.InferenceServerClient(server.http_url).get_server_metadata()["extensions"]


def test_a_model_loads_from_files_in_the_load_request_and_keeps_its_batch_dimension(
    server: ReferenceServer, files: dict[str, bytes]
) -> None:
    x = np.array([[0.5, 2.5, -1.0, 2.0], [4.0, 3.0, 2.0, 1.0], [0.0, 0.0, 9.0, 0.0]], np.float32)
    for client in _clients(server):  # HTTP (base64 in JSON), then gRPC (bytes_param): a reload
        module = _module(client)
        client.load_model("reshaped", config=reshaped_config(), files=files)
        assert client.is_model_ready("reshaped")
        inputs = [module.InferInput("X", [3, 4], "FP32"), module.InferInput("T", [3, 1], "BYTES")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.array([[b"a"], [b"b"], [b"c"]], dtype=object))
        outputs = [module.InferRequestedOutput("Y", class_count=2), module.InferRequestedOutput("U")]
        result = client.infer("reshaped", inputs, outputs=outputs)
        assert result.as_numpy("Y").tolist() == [
            [b"2.500000:1:one", b"2.000000:3"],
            [b"4.000000:0:zero", b"3.000000:1:one"],
            [b"9.000000:2:two", b"0.000000:0:zero"],  # equal values rank in index order
        ]
        assert result.as_numpy("U").tolist() == [[b"a"], [b"b"], [b"c"]]
        plain = client.infer("reshaped", inputs, outputs=[module.InferRequestedOutput("Y")]).as_numpy("Y")
        assert plain.shape == (3, 4)
        np.testing.assert_array_equal(plain, x)
        client.close()
    # The extension document's JSON form: the classes as strings in "data".
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    request = {
        "inputs": [
            {"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "T", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]},
        ],
        "outputs": [{"name": "Y", "parameters": {"classification": 2}}],
    }
    connection.request("POST", "/v2/models/reshaped/infer", body=json.dumps(request))
    response = connection.getresponse()
    assert response.status == 200
    (output,) = json.loads(response.read())["outputs"]
    assert output == {"name": "Y", "datatype": "BYTES", "shape": [1, 2], "data": ["4.000000:3", "3.000000:2:two"]}
    connection.close()
    # The files went to a folder of the server's own, never into the repository.
    assert not (server.config.model_repository / "reshaped").exists()


def _refusal(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return str(caught.value)


def test_what_does_not_fit_is_refused_with_the_reason_and_the_server_serves_on(
    server: ReferenceServer, files: dict[str, bytes], tmp_path: Path
) -> None:
    http_client, grpc_client = _clients(server)
    http_client.load_model("reshaped", config=reshaped_config(), files=files)
    assert server.dataplane is not None
    repository = server.dataplane.repository
    staged = repository.source("reshaped")
    assert staged is not None and (staged / "1" / "model.onnx").read_bytes() == files["file:1/model.onnx"]
    for client in (http_client, grpc_client):
        message = _refusal(client.load_model, "reshaped", config=reshaped_config(), files={"file:../x": b"x"})
        assert "Invalid file parameter 'file:../x'" in message and "must stay within model directory" in message
        message = _refusal(client.load_model, "reshaped", files=files)
        assert "Load parameter 'config' must be specified for model file override" in message
        message = _refusal(client.load_model, "reshaped", config=reshaped_config([2, 3]), files=files)
        for part in ("model 'reshaped'", "model input 'X' has different size for dims and reshape", "[4]", "[2,3]"):
            assert part in message
        module = _module(client)
        text = module.InferInput("T", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"a"]], dtype=object))
        number = module.InferInput("X", [1, 4], "FP32")
        number.set_data_from_numpy(np.zeros((1, 4), np.float32))
        asked = [module.InferRequestedOutput("U", class_count=1)]
        message = _refusal(client.infer, "reshaped", [number, text], outputs=asked)
        assert "class result not available for output due to unsupported type 'BYTES'" in message
    # Bad base64, over HTTP where the files travel as base64 text.
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = json.dumps({"parameters": {"config": reshaped_config(), "file:1/model.onnx": "not base64!"}})
    connection.request("POST", "/v2/repository/models/reshaped/load", body=body)
    response = connection.getresponse()
    assert response.status == 400
    assert "load parameter 'file:1/model.onnx' is not valid base64" in json.loads(response.read())["error"]
    # Base64 broken into lines, as MIME writes it, is the same file.
    wrapped = {key: base64.encodebytes(content).decode() for key, content in files.items()}
    body = json.dumps({"parameters": {"config": reshaped_config(), **wrapped}})
    connection.request("POST", "/v2/repository/models/reshaped/load", body=body)
    assert connection.getresponse().status == 200
    replaced, staged = staged, repository.source("reshaped")
    assert staged is not None and staged != replaced and not replaced.exists()  # the folder it served from before
    connection.close()
    # The failed reloads kept the loaded version, and the server is up.
    assert http_client.is_server_ready() and http_client.is_model_ready("reshaped")
    # The loads that failed left no folders; the one served from stays until the model unloads.
    assert repository.source("reshaped") == staged and sorted(staged.parent.parent.iterdir()) == [staged.parent]
    http_client.unload_model("reshaped")
    assert not http_client.is_model_ready("reshaped")
    assert not staged.exists()
    http_client.close()
    grpc_client.close()


@pytest.mark.peers
def test_perf_analyzer_measures_a_reshaped_model(peers: Path, server: ReferenceServer, files: dict[str, bytes]) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("reshaped", config=reshaped_config(), files=files)
    client.close()
    # This checks the protocol, not the measurement: -s 1000 takes any three windows as stable, which
    # a machine shared with other work needs.
    result = run_perf_analyzer(
        peers, "-m", "reshaped", "-u", f"127.0.0.1:{server.grpc_port}", "-i", "grpc", "-b", "2",
        "--concurrency-range", "2", "-p", "150", "-s", "1000", "-r", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # The server counts two inferences per request: the batch dimension survives the reshapes.
    inferences = re.search(r"Inference count: (\d+)", result.stdout)
    requests = re.search(r"Successful request count: (\d+)", result.stdout)
    assert inferences and requests, result.stdout
    assert int(inferences[1]) == 2 * int(requests[1]) > 0
