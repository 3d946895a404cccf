"""A client that gives up reaches a python model's `request.is_cancelled()` on every path: a cancelled
unary gRPC call (RST_STREAM), a closed HTTP connection, a cancelled stream (`is_cancelled()` on the
request and on its response sender, in an `async def execute`), and the BLS request a model made
for the cancelled one. The models (tests/python_async_models.py) write the file named by the
request's `marker` parameter when they see it: far sooner than the 10 s they would otherwise run.

Real tritonserver 2.51 cancels the gRPC call and the stream alike; it does not cancel on a closed
HTTP connection nor pass a cancellation on to BLS requests, so those two run on ours only.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.test_python_async_sender import Stream
from tests.python_async_models import write_async_models
from tests.servers import Endpoints

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cancel_unary") / "models"
    write_async_models(root)
    return root


def wait_for(path: Path, timeout_s: float = 5.0, missing: str = "the model never saw the cancellation") -> str:
    """The marker's text once the model has written it (whole: the models rename it into place)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{missing} ({path} not written)"
        time.sleep(0.02)
    return path.read_text()


def _running(marker: str) -> None:
    """Until unary_watch runs the request with this marker: then the client leaves (it waits 10 s)."""
    wait_for(Path(marker + ".started"), 60.0, "unary_watch never started on the request")


def _in(values: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return tensor


def _cancel_grpc_call(server: Endpoints, model: str, **parameters: str) -> None:
    """Start a unary gRPC call and reset it once the model runs (then the model is told)."""
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        call = client.async_infer(model, [_in([1])], callback=lambda result, error: None, parameters=parameters)
        _running(parameters.get("marker") or parameters["child_marker"])
        call.cancel()
    finally:
        client.close()


def test_a_cancelled_unary_grpc_call_reaches_the_model(server: Endpoints, tmp_path: Path) -> None:
    marker = tmp_path / "grpc"
    _cancel_grpc_call(server, "unary_watch", marker=str(marker))
    assert wait_for(marker) == "cancelled"


def test_a_cancelled_stream_reaches_request_and_sender_in_an_async_execute(server: Endpoints, tmp_path: Path) -> None:
    marker = tmp_path / "stream"
    stream = Stream(server.grpc)
    stream.send("cancel_watch", [1], "x", marker=str(marker))
    assert stream.take() == ("x", [0], False)
    stream.close()  # stop_stream(cancel_requests=True)
    assert wait_for(marker) == "cancelled"


def test_a_closed_http_connection_reaches_the_model(ours: Endpoints, tmp_path: Path) -> None:
    marker = tmp_path / "http"
    host, port = ours.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}],
            "parameters": {"marker": str(marker)}}  # fmt: skip
    connection.request("POST", "/v2/models/unary_watch/infer", json.dumps(body))
    _running(str(marker))
    connection.close()
    assert wait_for(marker) == "cancelled"


@pytest.mark.parametrize("model", ["bls_watch", "async_bls_watch"])
def test_cancelling_a_request_cancels_its_bls_requests(ours: Endpoints, tmp_path: Path, model: str) -> None:
    marker = tmp_path / "child"
    _cancel_grpc_call(ours, model, child_marker=str(marker))
    assert wait_for(marker) == "cancelled"
    # The server serves on.
    client = grpcclient.InferenceServerClient(ours.grpc)
    try:
        assert client.is_model_ready(model) and client.is_model_ready("unary_watch")
        assert client.infer("sender_unary", [_in([0])]).as_numpy("OUT").tolist() == [0]
    finally:
        client.close()
