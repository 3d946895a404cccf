"""The reference server driven over HTTP by NVIDIA's own client library, tritonclient.http."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(demo_server: ReferenceServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(demo_server.http_url)


def direct(repository: Path, model: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "perfkit-reference-server"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(meta["extensions"])


def test_model_metadata_config_and_readiness(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("mlp")
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 10]}]
    assert client.get_model_metadata("mlp", "1")["name"] == "mlp"
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 64
    assert "dynamic_batching" in config
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "7")
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_outputs_equal_onnxruntime(
    client: httpclient.InferenceServerClient, demo_server: ReferenceServer, binary: bool, batch: int
) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer("mlp", [inp], outputs=[out], request_id="req-7")
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (batch, 10)
    np.testing.assert_allclose(got, direct(demo_server.config.model_repository, "mlp", x), rtol=1e-5, atol=1e-5)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_version"] == "1"


def test_convnet_and_identity(client: httpclient.InferenceServerClient, demo_server: ReferenceServer) -> None:
    repo = demo_server.config.model_repository
    x = np.random.default_rng(1).standard_normal((3, 1, 28, 28)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("convnet", [inp], model_version="1").as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, direct(repo, "convnet", x), rtol=1e-4, atol=1e-5)

    y = np.arange(2 * 33, dtype=np.float32).reshape(2, 33)
    inp = httpclient.InferInput("INPUT0", list(y.shape), "FP32")
    inp.set_data_from_numpy(y)
    np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), y)


def test_statistics_count_inferences(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("identity")["model_stats"][0]
    y = np.ones((4, 8), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(y.shape), "FP32")
    inp.set_data_from_numpy(y)
    for _ in range(3):
        client.infer("identity", [inp])
    after = client.get_inference_statistics("identity", "1")["model_stats"][0]
    assert after["name"] == "identity" and after["version"] == "1"
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 12
    assert success["ns"] > 0 and after["inference_stats"]["compute_infer"]["ns"] > 0
    assert after["last_inference"] > 0
    everything = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} == {
        "mlp",
        "convnet",
        "identity",
        "preprocess",
        "mlp_pipeline",
        "python_linear",
    }


def test_repository_index_lists_models(client: httpclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert {(e["name"], e["state"]) for e in index} == {
        ("mlp", "READY"), ("convnet", "READY"), ("identity", "READY"), ("preprocess", "READY"),
        ("mlp_pipeline", "READY"), ("python_linear", "READY"),
    }  # fmt: skip


def test_load_is_refused_outside_explicit_mode(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="--model-control-mode explicit"):
        client.load_model("mlp")


def test_errors_reach_tritonclient_as_messages(client: httpclient.InferenceServerClient) -> None:
    x = np.zeros((1, 255), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match=r"unexpected shape for input 'INPUT0'.*\[-1,256\]"):
        client.infer("mlp", [inp])
    with pytest.raises(InferenceServerException, match="not found"):
        client.infer("nope", [inp])
    # The server still serves.
    ok = np.zeros((1, 256), dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", list(ok.shape), "FP32")
    inp.set_data_from_numpy(ok)
    assert client.infer("mlp", [inp]).as_numpy("OUTPUT0").shape == (1, 10)
