"""A client that gives up a decoupled python model's request reaches the model, and a model awaits
a decoupled BLS call (`async_exec(decoupled=True)`).

`ticker` sends a response every 10 ms from inside `execute` for up to 10 s, asking
`request.is_cancelled()` before each; when it turns True it writes the file named by the request
parameter `marker` and ends the stream. Each test closes the client's side after a few responses
and waits for the marker: far sooner than the 10 s the model would otherwise run.
"""

from __future__ import annotations

import http.client
import json
import queue
import time
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

_TICKER = """\
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            marker = json.loads(request.parameters()).get("marker", "")
            for tick in range(1000):
                if request.is_cancelled():
                    with open(marker, "w") as handle:
                        handle.write(str(tick))
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([tick], np.int32))]))
                time.sleep(0.01)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_ASYNC_BLS_STREAM = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="repeat", inputs=[pb_utils.Tensor("IN", values * k)], requested_output_names=["OUT"]
                ).async_exec(decoupled=True)
                for k in (1, 10)
            ]
            got = []
            for stream in await asyncio.gather(*calls):
                got += [int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]) for r in stream
                        if pb_utils.get_output_tensor_by_name(r, "OUT") is not None]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(got, np.int32))]))
        return responses
"""

_IO = """\
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    repository = tmp_path_factory.mktemp("cancel") / "models"
    write_decoupled_models(repository)
    for name, source, decoupled in (("ticker", _TICKER, True), ("async_bls_stream", _ASYNC_BLS_STREAM, False)):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(source)
        policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
        (repository / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{_IO}{policy}'
        )
    with running_server(loopback_config(repository)) as server:
        yield server


def wait_for(path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"the model never saw the cancellation ({path} not written)"
        time.sleep(0.02)
    time.sleep(0.05)  # written and closed
    return path.read_text()


def test_closing_a_grpc_stream_cancels_the_running_request(ours: ReferenceServer, tmp_path: Path) -> None:
    marker = tmp_path / "grpc"
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ours.grpc_port}")
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    client.async_stream_infer("ticker", [tensor], parameters={"marker": str(marker)})
    for expected in range(3):
        assert responses.get(timeout=10).as_numpy("OUT").tolist() == [expected]
    client.stop_stream(cancel_requests=True)
    client.close()
    # The model stops well before its 10 s of ticks.
    assert 3 <= int(wait_for(marker, timeout_s=5)) < 500


def test_leaving_generate_stream_cancels_the_running_request(ours: ReferenceServer, tmp_path: Path) -> None:
    marker = tmp_path / "http"
    connection = http.client.HTTPConnection(f"127.0.0.1:{ours.http_port}", timeout=10)
    body = {"IN": [1], "parameters": {"marker": str(marker)}}
    connection.request("POST", "/v2/models/ticker/generate_stream", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200
    assert b'"OUT":0' in response.fp.readline() + response.fp.readline()
    connection.close()
    assert 1 <= int(wait_for(marker, timeout_s=5)) < 500
    # The model serves the next request to its end.
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ours.http_port}")
    assert client.is_model_ready("ticker")


def test_an_async_model_awaits_decoupled_bls_calls(ours: ReferenceServer) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ours.http_port}")
    tensor = httpclient.InferInput("IN", [3], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], np.int32))
    result = client.infer("async_bls_stream", [tensor])
    # `repeat` answers each element in turn, both calls in flight together.
    assert result.as_numpy("OUT").tolist() == [1, 2, 3, 10, 20, 30]
