"""A request leaves no reference cycle behind in the server: everything it made is freed by
reference counting when it is answered, so the garbage collector has nothing to find per request.

Cycles per request cost a server under load twice: the collector's runs (every 700 objects left
over) and, as the long-lived generation grows, full collections that walk every object the process
holds (onnxruntime's, protobuf's), tens of milliseconds each. Compiled by mypyc, a nested function
and its environment hold each other, so a closure made per request is such a cycle
(docs/compiled.md); interpreted code can make them too (an object whose callback refers back to
it). The server runs in this process here, so the collector sees its objects; they are told by
their types' modules."""

from __future__ import annotations

import gc
import queue
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from reference_server.server import ReferenceServer, running_server
from tests.decoupled_models import write_decoupled_models
from tests.servers import loopback_config
from v2kit.demo import build_demo_repository

#: A model of the demo repository of each kind a request can take: ONNX, a python-backend model
#: (the stub crossing), and an ensemble of two steps. Each with its input's length.
MODELS = {"mlp": 256, "python_linear": 64, "mlp_pipeline": 256}
REQUESTS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    repository: Path = build_demo_repository(tmp_path_factory.mktemp("cycles") / "models")
    write_decoupled_models(repository)
    config = loopback_config(repository, load=(*MODELS, "repeat"))
    with running_server(config) as running:
        yield running


def _client(server: ReferenceServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _infer(client: Any, model: str, length: int) -> None:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", [1, length], "FP32")
    tensor.set_data_from_numpy(np.ones((1, length), dtype=np.float32))
    assert client.infer(model, [tensor]).as_numpy("OUTPUT0") is not None


def _stream(client: grpcclient.InferenceServerClient, answers: queue.Queue[Any]) -> None:
    tensor = grpcclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.int32))
    client.async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
    while True:  # three responses, then the final flag alone
        result, error = answers.get(timeout=30)
        assert error is None, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            return


def _servers_garbage(objects: list[object]) -> Counter[str]:
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    return Counter({kind: n for kind, n in kinds.items() if kind.startswith(("reference_server.", "v2kit."))})


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", list(MODELS))
def test_a_request_leaves_no_reference_cycle(server: ReferenceServer, model: str, protocol: str) -> None:
    client = _client(server, protocol)
    for _ in range(5):  # connections, caches and lazily made things, made once
        _infer(client, model, MODELS[model])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(REQUESTS):
            _infer(client, model, MODELS[model])
        gc.collect()
        garbage = _servers_garbage(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        client.close()
    # Anything made once per request and left to the collector shows REQUESTS times or more.
    per_request = {kind: n for kind, n in garbage.items() if n >= REQUESTS}
    assert not per_request, f"{model} over {protocol}: left for the garbage collector: {per_request}"


def test_a_streamed_request_leaves_no_reference_cycle(server: ReferenceServer) -> None:
    # A decoupled model's responses over a gRPC stream: the data plane's streamed path.
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for _ in range(5):
            _stream(client, answers)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(REQUESTS):
                _stream(client, answers)
            gc.collect()
            garbage = _servers_garbage(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    finally:
        client.stop_stream()
        client.close()
    per_request = {kind: n for kind, n in garbage.items() if n >= REQUESTS}
    assert not per_request, f"a streamed request left for the garbage collector: {per_request}"
