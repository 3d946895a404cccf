"""Ensembles (`platform: "ensemble"`) through real tritonclient, HTTP and gRPC: composed answers,
parallel steps, ensembles of ensembles, requested-output subsets, dynamic batching of composing
models across concurrent ensemble requests, Triton's load-time refusals with the ensemble and the
step named (the server keeps serving), a composing model's failure, and the statistics extension
listing the ensemble beside its composing models."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration


def onnx_model(name: str, op: str, constant: float | None = None, shape: list[int] | None = None) -> bytes:
    """X FP32 [batch, n] -> Y: `op` of X (and `constant` or `shape`), ir_version 8 for any onnxruntime."""
    inputs = ["X"]
    initializers = []
    if constant is not None:
        initializers.append(helper.make_tensor("C", TensorProto.FLOAT, [], [constant]))
        inputs.append("C")
    if shape is not None:
        initializers.append(helper.make_tensor("S", TensorProto.INT64, [len(shape)], shape))
        inputs.append("S")
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["Y"])],
        name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "n"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def composing_config(name: str, batching: str = "") -> str:
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n' + batching
    )


def step(model: str, source: str, target: str, inp: str = "X", out: str = "Y") -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{inp}" value: "{source}" }} '
        f'output_map {{ key: "{out}" value: "{target}" }} }}'
    )


def ensemble_config(name: str, steps: list[str], outputs: tuple[str, ...] = ("OUT",)) -> str:
    tensors = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ -1 ] }}' for o in outputs)
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"output [ {tensors} ]\nensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


ENSEMBLES = {
    "chain": ensemble_config("chain", [step("add_one", "IN", "mid"), step("double", "mid", "OUT")]),
    "fork": ensemble_config("fork", [step("add_one", "IN", "A"), step("triple", "IN", "B")], ("A", "B")),
    "nested": ensemble_config("nested", [step("chain", "IN", "x", inp="IN", out="OUT"), step("add_one", "x", "OUT")]),
    "failing": ensemble_config("failing", [step("add_one", "IN", "mid"), step("reshape3", "mid", "OUT")]),
    "batched": ensemble_config("batched", [step("add_one", "IN", "mid"), step("gather", "mid", "OUT")]),
    "mixed": ensemble_config("mixed", [step("add_one", "IN", "mid"), step("py_square", "mid", "OUT")]),
    # Refused at load:
    "bad_cycle": ensemble_config(
        "bad_cycle",
        [step("add_one", "IN", "a"), step("double", "b", "c"), step("add_one", "c", "b"), step("double", "b", "OUT")],
    ),
    "bad_tensor": ensemble_config("bad_tensor", [step("add_one", "IN", "mid"), step("double", "nothing", "OUT")]),
    "bad_model": ensemble_config("bad_model", [step("add_one", "IN", "mid"), step("no_such_model", "mid", "OUT")]),
    "bad_input": ensemble_config("bad_input", [step("add_one", "IN", "OUT", inp="NOPE")]),
    "bad_dep": ensemble_config("bad_dep", [step("add_one", "IN", "mid"), step("broken", "mid", "OUT")]),
    "loop_a": ensemble_config("loop_a", [step("loop_b", "IN", "OUT", inp="IN", out="OUT")]),
    "loop_b": ensemble_config("loop_b", [step("loop_a", "IN", "OUT", inp="IN", out="OUT")]),
}


PY_SQUARE = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * x)]))
        return responses
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensembles") / "models"
    models = {
        "add_one": (onnx_model("add_one", "Add", 1.0), ""),
        "double": (onnx_model("double", "Mul", 2.0), ""),
        "triple": (onnx_model("triple", "Mul", 3.0), ""),
        # Fails at run time unless a row has exactly 3 elements.
        "reshape3": (onnx_model("reshape3", "Reshape", shape=[-1, 3]), ""),
        # A long delay, reached only if the 8 concurrent requests do not fill the preferred batch.
        "gather": (onnx_model("gather", "Mul", 1.0), "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n"),
    }
    for name, (model, batching) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model)
        (root / name / "config.pbtxt").write_text(composing_config(name, batching))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: [\n')
    (root / "py_square" / "1").mkdir(parents=True)
    (root / "py_square" / "1" / "model.py").write_text(PY_SQUARE)
    (root / "py_square" / "config.pbtxt").write_text(composing_config("py_square").replace("onnxruntime", "python"))
    for name, config in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)  # empty: an ensemble has no model file
        (root / name / "config.pbtxt").write_text(config)
    onnx.checker.check_model(onnx.load_from_string(models["add_one"][0]))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ReferenceServer]:
    with running_server(loopback_config(repository)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ReferenceServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="module")
def grpc(server: ReferenceServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


X = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=np.float32)


def infer(client: Any, model: str, x: np.ndarray, outputs: tuple[str, ...] | None = None) -> Any:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("IN", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    requested = None if outputs is None else [module.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, [tensor], outputs=requested)


def stats_of(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_composed_answers(transport: str, request: pytest.FixtureRequest) -> None:
    client = request.getfixturevalue(transport)
    assert client.is_model_ready("chain") and client.is_model_ready("nested")
    np.testing.assert_array_equal(infer(client, "chain", X).as_numpy("OUT"), (X + 1) * 2)
    np.testing.assert_array_equal(infer(client, "nested", X).as_numpy("OUT"), (X + 1) * 2 + 1)
    # An ONNX step feeding a python-backend step.
    np.testing.assert_array_equal(infer(client, "mixed", X).as_numpy("OUT"), (X + 1) ** 2)
    fork = infer(client, "fork", X)
    np.testing.assert_array_equal(fork.as_numpy("A"), X + 1)
    np.testing.assert_array_equal(fork.as_numpy("B"), X * 3)


def test_metadata_and_config_say_ensemble(http: httpclient.InferenceServerClient) -> None:
    metadata = http.get_model_metadata("chain")
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "IN", "datatype": "FP32", "shape": [-1, -1]}]
    config = http.get_model_config("chain")
    assert config["platform"] == "ensemble" and config["backend"] == "" and config["instance_group"] == []
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["input_map"], s["output_map"]) for s in steps] == [
        ("add_one", {"X": "IN"}, {"Y": "mid"}),
        ("double", {"X": "mid"}, {"Y": "OUT"}),
    ]


def test_requested_outputs_prune_steps_nobody_needs(http: httpclient.InferenceServerClient) -> None:
    add_before = stats_of(http, "add_one")["inference_stats"]["success"]["count"]
    triple_before = stats_of(http, "triple")["inference_stats"]["success"]["count"]
    result = infer(http, "fork", X, outputs=("B",))
    np.testing.assert_array_equal(result.as_numpy("B"), X * 3)
    assert result.as_numpy("A") is None
    # As in Triton, the step that only writes the unrequested output does not run.
    assert stats_of(http, "add_one")["inference_stats"]["success"]["count"] == add_before
    assert stats_of(http, "triple")["inference_stats"]["success"]["count"] == triple_before + 1


def test_statistics_list_the_ensemble_and_its_composing_models(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    names = ("chain", "add_one", "double")
    before = {name: stats_of(http, name) for name in names}
    for _ in range(3):
        infer(http, "chain", X)
    after = {name: stats_of(http, name) for name in names}

    def delta(name: str, *path: str) -> int:
        a: Any = after[name]
        b: Any = before[name]
        for key in path:
            a, b = a[key], b[key]
        return int(a) - int(b)

    for name in names:
        assert delta(name, "inference_stats", "success", "count") == 3
        assert delta(name, "inference_count") == 6  # 3 requests of batch size 2
    assert delta("chain", "execution_count") == 3
    assert {b["batch_size"] for b in after["chain"]["batch_stats"]} == {2}
    # Triton's ensemble compute times are the sums of its steps' compute times.
    for phase in ("compute_input", "compute_infer", "compute_output"):
        steps = delta("add_one", "inference_stats", phase, "ns") + delta("double", "inference_stats", phase, "ns")
        assert delta("chain", "inference_stats", phase, "ns") == steps
    assert delta("chain", "inference_stats", "success", "ns") >= delta("double", "inference_stats", "success", "ns")
    # gRPC lists the same entries, and all models at once includes the ensemble.
    everything = {s.name for s in grpc.get_inference_statistics().model_stats}
    assert {"chain", "add_one", "double", "nested", "fork"} <= everything


def test_composing_model_failure_fails_the_request_with_its_message(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException) as direct:
        infer_model_input(http, "reshape3", X + 1)
    for client in (http, grpc):
        with pytest.raises(InferenceServerException) as info:
            infer(client, "failing", X)
        assert direct.value.message() in info.value.message()
        assert "Reshape" in info.value.message()
    assert stats_of(http, "failing")["inference_stats"]["fail"]["count"] == 2
    np.testing.assert_array_equal(infer(http, "failing", X[:, :3]).as_numpy("OUT"), X[:, :3] + 1)


def infer_model_input(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> Any:
    tensor = httpclient.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor])


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (
            "bad_cycle",
            "output 'OUT' for ensemble 'bad_cycle' is not written: at least one of its depending tensors, 'c', is not "
            "connected: step 2 (model 'add_one') -> step 1 (model 'double') -> step 2 (model 'add_one') form a cycle",
        ),
        (
            "bad_tensor",
            "output 'OUT' for ensemble 'bad_tensor' is not written: at least one of its depending tensors, 'nothing', "
            "is not connected: step 1 (model 'double') reads 'nothing', which is neither an ensemble input nor "
            "written by any step",
        ),
        (
            "bad_model",
            "ensemble bad_model contains models that are not available or ambiguous: no_such_model "
            "(step 1 (model 'no_such_model') of ensemble 'bad_model'",
        ),
        (
            "bad_input",
            "in ensemble bad_input, ensemble tensor IN is mapping to non-existing input NOPE in model add_one "
            "(step 0 (model 'add_one') of ensemble 'bad_input')",
        ),
        (
            "loop_a",
            "circular dependency between ensembles: loop_a -> ... -> loop_b -> loop_a "
            "(step 0 (model 'loop_b') of ensemble 'loop_a': loop_a -> loop_b -> loop_a)",
        ),
        (
            "bad_dep",
            "ensemble 'bad_dep' depends on 'broken' which has no loaded version. Model 'broken' loading failed "
            "with error: ",
        ),
    ],
)
def test_bad_ensembles_are_refused_at_load(http: httpclient.InferenceServerClient, name: str, words: str) -> None:
    entry = {e["name"]: e for e in http.get_model_repository_index()}[name]
    assert entry["state"] == "UNAVAILABLE"
    assert words in entry["reason"]
    assert not http.is_model_ready(name)
    with pytest.raises(InferenceServerException) as info:
        infer(http, name, X)
    # Triton's 404 and words for a model whose load failed; the reason is the index's.
    assert (info.value.status(), info.value.message()) == (
        "404",
        f"Request for unknown model: '{name}' has no available versions",
    )
    # The server and the other models keep serving.
    assert http.is_server_live()
    np.testing.assert_array_equal(infer(http, "chain", X).as_numpy("OUT"), (X + 1) * 2)


def test_concurrent_ensemble_requests_batch_in_the_composing_model(server: ReferenceServer) -> None:
    async def burst() -> list[np.ndarray]:
        client = aiohttpclient.InferenceServerClient(server.http_url)
        try:

            async def one(i: int) -> np.ndarray:
                tensor = aiohttpclient.InferInput("IN", [1, 4], "FP32")
                tensor.set_data_from_numpy(np.full((1, 4), float(i), dtype=np.float32))
                return (await client.infer("batched", [tensor])).as_numpy("OUT")  # type: ignore[no-any-return]

            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    results = asyncio.run(burst())
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out, np.full((1, 4), float(i) + 1, dtype=np.float32))
    http = httpclient.InferenceServerClient(server.http_url)
    gather = stats_of(http, "gather")
    ensemble = stats_of(http, "batched")
    # Eight ensemble requests, each one execution of the ensemble; the composing model with
    # dynamic batching ran them in fewer, larger executions.
    assert ensemble["execution_count"] == ensemble["inference_count"] == 8
    assert gather["inference_count"] == 8
    assert gather["execution_count"] < gather["inference_count"]
    assert max(b["batch_size"] for b in gather["batch_stats"]) > 1


def ready_models(client: httpclient.InferenceServerClient) -> set[str]:
    return {e["name"] for e in client.get_model_repository_index() if e.get("state") == "READY"}


def test_explicit_load_of_an_ensemble_loads_its_composing_models(repository: Path) -> None:
    with running_server(loopback_config(repository, load=("nested",))) as explicit:
        client = httpclient.InferenceServerClient(explicit.http_url)
        assert ready_models(client) == {"nested", "chain", "add_one", "double"}
        np.testing.assert_array_equal(infer(client, "nested", X).as_numpy("OUT"), (X + 1) * 2 + 1)
        # A composing model gone: the ensembles on it are not ready, and say which model is missing.
        client.unload_model("double")
        assert not client.is_model_ready("chain") and not client.is_model_ready("nested")
        index = {e["name"]: e for e in client.get_model_repository_index()}
        assert index["chain"]["state"] == "UNAVAILABLE" and "double" in index["chain"]["reason"]
        with pytest.raises(InferenceServerException) as info:
            infer(client, "nested", X)
        # The step's answer: Triton's 404 for a model it unloaded.
        assert info.value.status() == "404" and "'double' has no available versions" in info.value.message()
        client.load_model("double")
        assert client.is_model_ready("nested")
        # Triton's unload_dependents unloads the ensembles that use the model, nested ones too.
        client.unload_model("add_one", unload_dependents=True)
        assert ready_models(client) == {"double"}
