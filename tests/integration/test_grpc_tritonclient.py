"""The reference server driven over gRPC by NVIDIA's own client library, tritonclient.grpc (sync and
asyncio), through every method of GRPCInferenceService that the server implements."""

from __future__ import annotations

import json
import queue
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration


def url(server: ReferenceServer) -> str:
    return f"127.0.0.1:{server.grpc_port}"


@pytest.fixture(scope="module")
def client(demo_server: ReferenceServer) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(url(demo_server))
    yield c
    c.close()


def direct(repository: Path, model: str, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def fp32_input(x: np.ndarray, name: str = "INPUT0") -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "perfkit-reference-server"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(meta.extensions)
    assert client.get_server_metadata(as_json=True)["name"] == "perfkit-reference-server"


def test_model_metadata_config_and_readiness(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["versions"] == ["1"]
    # as_json renders int64 as strings, as protobuf's JSON mapping does.
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "256"]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "10"]}]
    assert list(client.get_model_metadata("mlp", "1").inputs[0].shape) == [-1, 256]

    config = client.get_model_config("mlp").config
    assert config.name == "mlp" and config.max_batch_size == 64
    assert config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [256])]
    as_json = client.get_model_config("identity", "1", as_json=True)["config"]
    assert as_json["max_batch_size"] == 8 and "dynamic_batching" not in as_json
    assert as_json["input"][0]["data_type"] == "TYPE_FP32"

    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "7")
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_outputs_equal_onnxruntime(
    client: grpcclient.InferenceServerClient, demo_server: ReferenceServer, batch: int
) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    result = client.infer("mlp", [fp32_input(x)], outputs=[out], request_id="req-7")
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (batch, 10) and got.dtype == np.float32
    np.testing.assert_allclose(got, direct(demo_server.config.model_repository, "mlp", x), rtol=1e-5, atol=1e-5)
    response = result.get_response()
    assert response.id == "req-7"
    assert response.model_name == "mlp" and response.model_version == "1"
    # Outputs come back as raw bytes, as Triton sends them.
    assert len(response.raw_output_contents) == 1


def test_convnet_and_identity(client: grpcclient.InferenceServerClient, demo_server: ReferenceServer) -> None:
    repo = demo_server.config.model_repository
    x = np.random.default_rng(1).standard_normal((3, 1, 28, 28)).astype(np.float32)
    got = client.infer("convnet", [fp32_input(x)], model_version="1").as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, direct(repo, "convnet", x), rtol=1e-4, atol=1e-5)
    y = np.arange(2 * 33, dtype=np.float32).reshape(2, 33)
    np.testing.assert_array_equal(client.infer("identity", [fp32_input(y)]).as_numpy("OUTPUT0"), y)


def test_typed_contents_are_accepted(demo_server: ReferenceServer) -> None:
    """tritonclient always sends raw_input_contents; other clients send InferTensorContents."""
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    request = pb.ModelInferRequest(model_name="identity", id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 3])
    tensor.contents.fp32_contents.extend(y.ravel().tolist())
    with grpc.insecure_channel(url(demo_server)) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert response.id == "typed"
    assert list(response.outputs[0].shape) == [2, 3]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 3), y)


def test_stream_infer_matches_responses_by_request_id(
    client: grpcclient.InferenceServerClient, demo_server: ReferenceServer
) -> None:
    repo = demo_server.config.model_repository
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    sent = {f"s{i}": np.random.default_rng(i).standard_normal((1 + i % 3, 256)).astype(np.float32) for i in range(8)}
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, x in sent.items():
            client.async_stream_infer("mlp", [fp32_input(x)], request_id=request_id)
        # A failing request is answered on the stream, and the stream goes on.
        client.async_stream_infer("mlp", [fp32_input(np.zeros((1, 7), np.float32))], request_id="bad")
        client.async_stream_infer("identity", [fp32_input(np.ones((1, 4), np.float32))], request_id="after")
        got = [results.get(timeout=30) for _ in range(len(sent) + 2)]
    finally:
        client.stop_stream()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "unexpected shape for input 'INPUT0'" in errors[0].message()
    by_id = {r.get_response().id: r for r, e in got if e is None}
    assert set(by_id) == set(sent) | {"after"}
    for request_id, x in sent.items():
        np.testing.assert_allclose(by_id[request_id].as_numpy("OUTPUT0"), direct(repo, "mlp", x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(by_id["after"].as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))


def test_statistics_count_what_was_sent(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]
    y = np.ones((4, 8), dtype=np.float32)
    for _ in range(3):
        client.infer("identity", [fp32_input(y)])
    after = client.get_inference_statistics("identity", "1").model_stats[0]
    assert after.name == "identity" and after.version == "1"
    success = after.inference_stats.success
    assert success.count - int(before["inference_stats"]["success"]["count"]) == 3
    assert after.inference_count - int(before["inference_count"]) == 12
    assert success.ns > 0 and after.inference_stats.compute_infer.ns > 0
    assert after.last_inference > 0
    assert {b.batch_size for b in after.batch_stats} >= {4}
    everything = client.get_inference_statistics().model_stats
    assert {s.name for s in everything} == {"mlp", "convnet", "identity", "preprocess", "mlp_pipeline", "python_linear"}


def test_repository_index_lists_models(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(e["name"], e["state"]) for e in index} == {
        ("mlp", "READY"), ("convnet", "READY"), ("identity", "READY"), ("preprocess", "READY"),
        ("mlp_pipeline", "READY"), ("python_linear", "READY"),
    }  # fmt: skip
    assert {m.name for m in client.get_model_repository_index().models} == {
        "mlp", "convnet", "identity", "preprocess", "mlp_pipeline", "python_linear",
    }  # fmt: skip


async def test_asyncio_client_covers_every_method(demo_server: ReferenceServer) -> None:
    repo = demo_server.config.model_repository
    client = aioclient.InferenceServerClient(url(demo_server))
    try:
        assert await client.is_server_live() and await client.is_server_ready()
        assert (await client.get_server_metadata()).name == "perfkit-reference-server"
        assert await client.is_model_ready("convnet")
        assert (await client.get_model_metadata("convnet")).inputs[0].name == "INPUT0"
        assert list((await client.get_model_config("convnet")).config.input[0].dims) == [1, 28, 28]
        before = (await client.get_inference_statistics("convnet")).model_stats[0].inference_count

        x = np.random.default_rng(3).standard_normal((5, 1, 28, 28)).astype(np.float32)
        inp = aioclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = await client.infer("convnet", [inp], request_id="aio")
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), direct(repo, "convnet", x), rtol=1e-4, atol=1e-5)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for i in range(4):
                yield {"model_name": "convnet", "inputs": [inp], "request_id": f"a{i}"}

        ids = []
        async for stream_result, error in client.stream_infer(requests()):
            assert error is None
            ids.append(stream_result.get_response().id)
            np.testing.assert_allclose(stream_result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT0"), rtol=1e-6)
            if len(ids) == 4:
                break  # the server keeps a stream open until the client ends it
        assert sorted(ids) == ["a0", "a1", "a2", "a3"]

        after = (await client.get_inference_statistics("convnet")).model_stats[0].inference_count
        assert after - before == 5 * 5
        index = await client.get_model_repository_index()
        assert {m.name for m in index.models} == {
            "mlp",
            "convnet",
            "identity",
            "preprocess",
            "mlp_pipeline",
            "python_linear",
        }
        with pytest.raises(InferenceServerException) as refused:
            await client.load_model("convnet")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        with pytest.raises(InferenceServerException) as refused:
            await client.unload_model("convnet")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        await client.close()


def _override(name: str, *, count: int, dynamic_batching: bool) -> str:
    config: dict[str, Any] = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 8 if name == "identity" else 64,
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
    }
    if dynamic_batching:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": 200}
    return json.dumps(config)


def test_load_and_unload_in_explicit_mode(repository_copy: Path) -> None:
    config = loopback_config(repository_copy, load=("mlp",))
    with running_server(config) as server:
        client = grpcclient.InferenceServerClient(url(server))
        try:
            index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
            assert index["mlp"]["state"] == "READY"
            assert "state" not in index["convnet"] and not client.is_model_ready("convnet")

            client.load_model("convnet")
            assert client.is_model_ready("convnet")
            x = np.zeros((1, 1, 28, 28), np.float32)
            assert client.infer("convnet", [fp32_input(x)]).as_numpy("OUTPUT0").shape == (1, 10)

            # A config override replaces config.pbtxt: mlp loses its dynamic batcher and gets two
            # instances; identity gains a batcher and three instances.
            assert client.get_model_config("mlp").config.HasField("dynamic_batching")
            client.load_model("mlp", config=_override("mlp", count=2, dynamic_batching=False))
            mlp = client.get_model_config("mlp").config
            assert not mlp.HasField("dynamic_batching")
            assert [g.count for g in mlp.instance_group] == [2]
            y = np.ones((2, 256), np.float32)
            assert client.infer("mlp", [fp32_input(y)]).as_numpy("OUTPUT0").shape == (2, 10)

            client.load_model("identity", config=_override("identity", count=3, dynamic_batching=True))
            identity = client.get_model_config("identity", as_json=True)["config"]
            assert identity["dynamic_batching"]["max_queue_delay_microseconds"] == "200"
            assert [g["count"] for g in identity["instance_group"]] == [3]

            with pytest.raises(InferenceServerException) as bad:
                client.load_model("mlp", config='{"max_batch_size": "lots"')
            assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert client.is_model_ready("mlp")  # a failed reload leaves the serving version in place

            client.unload_model("convnet")
            assert not client.is_model_ready("convnet")
            with pytest.raises(InferenceServerException) as gone:
                client.infer("convnet", [fp32_input(x)])
            assert gone.value.status() == "StatusCode.NOT_FOUND"  # unloaded: Triton's "has no available versions"
            with pytest.raises(InferenceServerException) as missing:
                client.load_model("no_such_model")
            assert missing.value.status() == "StatusCode.NOT_FOUND"
        finally:
            client.close()
