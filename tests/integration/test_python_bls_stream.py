"""A python model's decoupled BLS call (`exec(decoupled=True)`), on tritonserver 2.51 and on ours:
the iterator gives the called model's responses in order, and when that model sends its final flag
alone, one last empty response (Triton's README: "it is possible that the last response is
empty"); a final flag riding on the last response adds none. `ResponseIterator.cancel()` (the
python_backend README, "Cancelling decoupled BLS requests"; later than 2.51, so ours alone) ends
the call: the called model sees `is_cancelled()` and the iterator ends with a CANCELLED error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

# Sends COUNT responses, then its final flag alone (MODE 0) or on the last response (MODE 1); with
# MODE 2 it sends until it sees the request cancelled (at most 200, 20 ms apart); MODE 3 answers how
# many it had sent when it last saw that (-1: never).
COUNTER = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    cancelled_after = -1

    def execute(self, requests):
        for request in requests:
            count, mode = (int(x) for x in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
            sender = request.get_response_sender()
            if mode == 3:
                out = pb_utils.Tensor("OUT", np.array([self.cancelled_after], np.int32))
                sender.send(pb_utils.InferenceResponse([out]), flags=FINAL)
                continue
            if mode == 2:
                sent = 0
                while sent < 200 and not sender.is_cancelled():
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([sent], np.int32))]))
                    sent += 1
                    time.sleep(0.02)
                if sender.is_cancelled():
                    self.cancelled_after = sent
                note = f"cancelled after {sent}" if sender.is_cancelled() else "never cancelled"
                error = pb_utils.TritonError(note, pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            for i in range(count):
                last = mode == 1 and i == count - 1
                out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))])
                sender.send(out, flags=FINAL if last else 0)
            if mode == 0:
                sender.send(flags=FINAL)
        return None
"""

CALLER = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def describe(response):
    if response.has_error():
        return ["error", response.error().code(), response.error().message()]
    if not response.output_tensors():
        return "empty"
    return int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])


def call(count, mode):
    tensor = pb_utils.Tensor("IN", np.array([count, mode], np.int32))
    request = pb_utils.InferenceRequest(model_name="counter", inputs=[tensor], requested_output_names=["OUT"])
    return request.exec(decoupled=True)


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            count, mode, cancel_after = (int(x) for x in pb_utils.get_input_tensor_by_name(request, "X").as_numpy())
            seen = []
            responses = call(count, mode)
            for response in responses:
                seen.append(describe(response))
                if len(seen) == cancel_after:
                    responses.cancel()
            if cancel_after:
                seen.append(["counter saw it after", [describe(response) for response in call(0, 3)]])
            info = np.array([json.dumps(seen).encode()], dtype=np.object_)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", info)]))
        return answers
"""

COUNTER_CONFIG = """\
name: "counter"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CALLER_CONFIG = """\
name: "caller"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _repository(root: Path) -> Path:
    for name, source, config in (("counter", COUNTER, COUNTER_CONFIG), ("caller", CALLER, CALLER_CONFIG)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def urls(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"triton": http url, "ours": http url}, both serving one copy of the two models."""
    root = _repository(tmp_path_factory.mktemp("bls_stream") / "models")
    with running_triton(peers, root, auto_complete=False) as triton, running_server(loopback_config(root)) as ours:
        yield {"triton": triton.http_url, "ours": ours.http_url}


def _seen(url: str, count: int, mode: int, cancel_after: int = 0) -> list[object]:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("X", [3], "INT32")
        tensor.set_data_from_numpy(np.array([count, mode, cancel_after], np.int32))
        seen: list[object] = json.loads(client.infer("caller", [tensor]).as_numpy("SEEN")[0])
        return seen
    finally:
        client.close()


@pytest.mark.parametrize(("mode", "expected"), [(0, [0, 1, 2, "empty"]), (1, [0, 1, 2])])
def test_the_iterator_gives_what_the_called_model_sent_as_triton_does(
    urls: dict[str, str], mode: int, expected: list[object]
) -> None:
    assert {server: _seen(url, 3, mode) for server, url in urls.items()} == {"triton": expected, "ours": expected}


def test_cancel_ends_the_call_and_the_called_model_sees_it(urls: dict[str, str]) -> None:
    *seen, (label, counter) = _seen(urls["ours"], 0, 2, cancel_after=2)  # type: ignore[misc]
    assert seen[:2] == [0, 1]
    # Responses already on their way may still come before the end, which is a CANCELLED error.
    assert all(isinstance(item, int) for item in seen[2:-1]) and len(seen) < 20, seen
    assert seen[-1] == ["error", 7, "Request was cancelled"], seen  # TritonError.CANCELLED
    assert label == "counter saw it after"
    (sent,) = counter  # how many it had sent when its is_cancelled() turned True
    assert 2 <= sent < 20, counter
