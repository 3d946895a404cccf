"""Iterative sequences and request rescheduling (python backend README, "Request Rescheduling"),
on real tritonserver 2.51 and on the reference server alike.

The models are Triton's own QA models, unmodified (`tests/triton_qa/python_models/`, from the
server repository's qa/python_models): `iterative_sequence` (decoupled: each execute sends one
response and reschedules the request until the count runs out), `request_rescheduling_addsub`
(reschedules its first request, returning None in its place) and `wrong_return_type` (returns a
response for a rescheduled request). All three have `sequence_batching { iterative_sequence: true }`
and are called without a sequence id, which such a model accepts: the sequence batcher gives the
request a sequence of its own. The steps follow qa/L0_backend_python/request_rescheduling, and a BLS
model of ours calls both models as qa's bls_request_rescheduling does. A model without
`iterative_sequence` that reschedules fails here (Triton leaves its client waiting).
"""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

QA_MODELS = Path(__file__).parent.parent / "triton_qa" / "python_models"
MODELS = ("iterative_sequence", "request_rescheduling_addsub", "wrong_return_type")


#: BLS into both rescheduling models, as qa bls_request_rescheduling does (without its sleeps):
#: the add/sub answer, and the OUT of each response of iterative_sequence for COUNT responses.
BLS = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count = pb_utils.Tensor("IN", pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy())
            a = np.arange(16, dtype=np.float32)
            inputs = [pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)]
            added = pb_utils.InferenceRequest(
                model_name="request_rescheduling_addsub", inputs=inputs, requested_output_names=["OUTPUT0"]
            ).exec()
            if added.has_error():
                raise pb_utils.TritonModelException(added.error().message())
            counts = []
            stream = pb_utils.InferenceRequest(
                model_name="iterative_sequence", inputs=[count], requested_output_names=["OUT"]
            ).exec(decoupled=True)
            for response in stream:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    counts.append(int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0]))
            sums = pb_utils.get_output_tensor_by_name(added, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", sums), pb_utils.Tensor("COUNTS", np.array(counts, dtype=np.int32))
            ]))
        return responses
"""
BLS_CONFIG = """\
name: "bls_reschedule"
backend: "python"
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "COUNTS" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""


#: Reschedules each request once and answers what the model saw on each run: the correlation id
#: and the flags, (id, flags) of the first run, then of the second.
SEEN = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.first = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            cid, flags = request.correlation_id(), request.flags()
            if cid not in self.first:
                self.first[cid] = (cid, flags)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            seen = np.array([*self.first.pop(cid), cid, flags], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]))
        return responses
"""
SEEN_CONFIG = """\
name: "seen"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_INT64 dims: [ 4 ] } ]
sequence_batching { iterative_sequence: true }
instance_group [ { kind: KIND_CPU } ]
"""


def write_repository(root: Path) -> Path:
    (root / "seen" / "1").mkdir(parents=True)
    (root / "seen" / "1" / "model.py").write_text(SEEN)
    (root / "seen" / "config.pbtxt").write_text(SEEN_CONFIG)
    (root / "bls_reschedule" / "1").mkdir(parents=True)
    (root / "bls_reschedule" / "1" / "model.py").write_text(BLS)
    (root / "bls_reschedule" / "config.pbtxt").write_text(BLS_CONFIG)
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        shutil.copy(QA_MODELS / name / "config.pbtxt", root / name / "config.pbtxt")
        shutil.copy(QA_MODELS / name / "model.py", root / name / "1" / "model.py")
    # The add/sub model without a sequence batcher: it may not reschedule.
    (root / "not_iterative" / "1").mkdir(parents=True)
    shutil.copy(QA_MODELS / "request_rescheduling_addsub" / "model.py", root / "not_iterative" / "1" / "model.py")
    config = (QA_MODELS / "request_rescheduling_addsub" / "config.pbtxt").read_text()
    config = config[: config.index("sequence_batching")].replace("request_rescheduling_addsub", "not_iterative")
    (root / "not_iterative" / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def servers(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """{"triton": (http, grpc), "ours": (http, grpc)}, in explicit model control with every model
    loaded, as the QA test runs Triton."""
    repository = write_repository(tmp_path_factory.mktemp("reschedule") / "models")
    with (
        running_triton(
            peers, repository, extra_args=["--model-control-mode=explicit", "--load-model=*"], auto_complete=False
        ) as triton,
        running_server(loopback_config(repository, load=("*",))) as ours,
    ):
        yield {
            "triton": (triton.http_url, triton.grpc_url),
            "ours": (ours.http_url, f"{ours.config.host}:{ours.grpc_port}"),
        }


def _stream_counts(grpc_url: str, count: int) -> list[int]:
    """The OUT values of the responses to one `iterative_sequence` request for `count` responses,
    streamed without a sequence id (qa grpc_endpoint_test.py test_grpc_decoupled)."""
    answers: queue.Queue[object] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_url) as client:
        # Reload to reset the model's state, as the QA test does.
        client.unload_model("iterative_sequence")
        client.load_model("iterative_sequence")
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([count], dtype=np.int32))
        client.async_stream_infer(model_name="iterative_sequence", inputs=[tensor])
        values = []
        for _ in range(count):
            answer = answers.get(timeout=30)
            if isinstance(answer, InferenceServerException):
                raise answer
            assert isinstance(answer, grpcclient.InferResult)
            values.append(int(answer.as_numpy("OUT")[0]))
        client.stop_stream()
    return values


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_a_decoupled_iterative_sequence_runs_until_done(servers: dict[str, tuple[str, str]], server: str) -> None:
    assert _stream_counts(servers[server][1], 3) == [2, 1, 0]


def _add_sub_inputs(module: object, shape: int = 16) -> tuple[list[object], np.ndarray, np.ndarray]:
    a = np.arange(shape, dtype=np.float32) / 4
    b = np.full(shape, 0.5, dtype=np.float32)
    tensors = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, [shape], "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors, a, b


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_a_rescheduled_request_is_answered_by_its_next_run(servers: dict[str, tuple[str, str]], server: str) -> None:
    """qa test_grpc_non_decoupled: the model returns None for its first request and reschedules
    it; the client gets the one answer of the run after. Over HTTP too, with the model loaded again
    (its first request again rescheduled)."""
    http_url, grpc_url = servers[server]
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.unload_model("request_rescheduling_addsub")
        client.load_model("request_rescheduling_addsub")
        inputs, a, b = _add_sub_inputs(grpcclient)
        result = client.infer(model_name="request_rescheduling_addsub", inputs=inputs)  # type: ignore[arg-type]
        assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
        assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
        client.unload_model("request_rescheduling_addsub")
        client.load_model("request_rescheduling_addsub")
    http = httpclient.InferenceServerClient(http_url)
    try:
        for _ in range(2):  # the first rescheduled, the second not
            inputs, a, b = _add_sub_inputs(httpclient)
            result = http.infer("request_rescheduling_addsub", inputs)  # type: ignore[arg-type]
            assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    finally:
        http.close()


def _wrong_return_error(grpc_url: str) -> str:
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
    with grpcclient.InferenceServerClient(grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("wrong_return_type", [tensor])
    return str(caught.value.message())


def test_a_response_for_a_rescheduled_request_fails_it_alike(servers: dict[str, tuple[str, str]]) -> None:
    """qa bls_request_rescheduling test_wrong_return_type: Triton's words, on both."""
    words = "Expected a None object in the execute function return list for reschduled request"
    triton, ours = (_wrong_return_error(servers[s][1]) for s in ("triton", "ours"))
    assert words in triton
    assert ours == triton


def test_a_model_without_iterative_sequences_may_not_reschedule(servers: dict[str, tuple[str, str]]) -> None:
    """Core refuses the release (infer_request.cc) and Triton 2.51 then leaves the client waiting
    for an answer that never comes; here the request fails at once with core's words instead."""
    http = httpclient.InferenceServerClient(servers["ours"][0])
    try:
        inputs, _, _ = _add_sub_inputs(httpclient)
        with pytest.raises(InferenceServerException) as caught:
            http.infer("not_iterative", inputs)  # type: ignore[arg-type]
    finally:
        http.close()
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured to "
        "handle such a flag."
    )


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_bls_calls_reach_rescheduling_models(servers: dict[str, tuple[str, str]], server: str) -> None:
    """qa bls_request_rescheduling test_non_decoupled_e2e and test_decoupled_e2e, from one BLS model."""
    with grpcclient.InferenceServerClient(servers[server][1]) as client:
        for name in ("request_rescheduling_addsub", "iterative_sequence"):  # fresh model state
            client.unload_model(name)
            client.load_model(name)
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([3], dtype=np.int32))
        result = client.infer("bls_reschedule", [count])
    assert result.as_numpy("SUM").tolist() == (np.arange(16, dtype=np.float32) * 2).tolist()
    assert result.as_numpy("COUNTS").tolist() == [2, 1, 0]


def _seen(http_url: str, **sequence: object) -> list[int]:
    http = httpclient.InferenceServerClient(http_url)
    try:
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        return [int(v) for v in http.infer("seen", [tensor], **sequence).as_numpy("SEEN")]  # type: ignore[arg-type]
    finally:
        http.close()


def test_what_the_model_sees_of_an_iterative_sequence_alike(servers: dict[str, tuple[str, str]]) -> None:
    """Without an id: the batcher's own (1, 2, ...), START on the first run, neither flag on the
    rerun. With an id and START: the client's, START first, none on the rerun."""
    answers = {}
    for server in ("triton", "ours"):
        with grpcclient.InferenceServerClient(servers[server][1]) as client:
            client.unload_model("seen")  # the batcher's ids count from 1 again
            client.load_model("seen")
        url = servers[server][0]
        answers[server] = [_seen(url), _seen(url), _seen(url, sequence_id=42, sequence_start=True)]
    assert answers["ours"] == answers["triton"] == [[1, 1, 1, 0], [2, 1, 2, 0], [42, 1, 42, 0]]


def test_a_request_that_ends_its_sequence_is_not_rescheduled(servers: dict[str, tuple[str, str]]) -> None:
    """Core takes no RESCHEDULE release of a request flagged END (IterativeSequencer adds no
    callback for it), and Triton 2.51's client then waits forever; here it fails with core's words."""
    with pytest.raises(InferenceServerException, match="while the model is not configured to handle such a flag"):
        _seen(servers["ours"][0], sequence_id=43, sequence_start=True, sequence_end=True)
