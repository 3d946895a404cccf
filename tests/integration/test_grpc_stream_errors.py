"""A ModelStreamInfer stream opened with the `triton_grpc_error: true` header ends with the gRPC
status of the first response error (Triton's inference_protocols.md, "GRPC Status Codes";
src/grpc/stream_infer_handler.cc), on real tritonserver 2.51 and on the reference server alike.

Without the header an error stays in the stream as `error_message` and the stream goes on; with
it, a request refused before it runs (an input of the wrong datatype, an unknown model) is still
answered in the stream, as Triton does: only an error a response carries ends the call. The models
are Triton's QA models, unmodified (`tests/triton_qa/python_models/`): `execute_grpc_error` fails
every second request, `decoupled_grpc_error` sends a response, then an error (without the final
flag, with it, or followed by a final flag alone), as qa/L0_backend_python/lifecycle runs them.

tritonserver 2.51 itself sometimes crashes on these streams on a busy machine: its log says
"HandleCancellation called even when the context was not cancelled for ModelStreamInferHandler ...
step COMPLETE", then SIGSEGV (the gRPC cancellation race fixed after 2.51, triton-inference-server/
server#8034 and #8078). A Triton test that Triton's crash broke is run once more on a fresh Triton;
our server gets no second try.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from perfkit.testing.triton import TritonProcess
from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

QA_MODELS = Path(__file__).parent.parent / "triton_qa" / "python_models"
SERVERS = ["triton", "ours"]
HEADER = {"triton_grpc_error": "true"}


class Servers:
    """Triton and ours on one copy of the two QA models; Triton restarted when its known crash ended it."""

    def __init__(self, peers: Path, root: Path, stack: contextlib.ExitStack) -> None:
        self.peers, self.root, self.stack = peers, root, stack
        self.triton = self._start_triton()
        ours = stack.enter_context(running_server(loopback_config(root)))
        self.ours_url = f"{ours.config.host}:{ours.grpc_port}"

    def _start_triton(self) -> TritonProcess:
        return self.stack.enter_context(running_triton(self.peers, self.root, auto_complete=False))

    def url(self, server: str) -> str:
        if server == "ours":
            return self.ours_url
        if self.triton.process.poll() is not None:
            self.triton = self._start_triton()
        return self.triton.grpc_url

    def triton_crashed(self) -> bool:
        """Triton has exited, after logging its cancellation race and a SIGSEGV (and not of anything else)."""
        if self.triton.process.poll() is None:
            return False
        log = self.triton.log_path.read_text(encoding="utf-8", errors="replace")
        return "HandleCancellation called even when the context was not cancelled" in log and "Signal (11)" in log

    def check(self, server: str, body: Callable[[str], None]) -> None:
        """Run `body(url)`; once more on a fresh Triton when Triton's own crash broke the first run."""
        try:
            body(self.url(server))
        except (AssertionError, InferenceServerException, queue.Empty):
            if server != "triton" or not self.triton_crashed():
                raise
            body(self.url(server))


@pytest.fixture(scope="module")
def servers(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    root = tmp_path_factory.mktemp("grpc_error") / "models"
    for name in ("execute_grpc_error", "decoupled_grpc_error"):
        (root / name / "1").mkdir(parents=True)
        shutil.copy(QA_MODELS / name / "config.pbtxt", root / name / "config.pbtxt")
        shutil.copy(QA_MODELS / name / "model.py", root / name / "1" / "model.py")
    with contextlib.ExitStack() as stack:
        yield Servers(peers, root, stack)


class Stream:
    """One tritonclient stream and what its callback received, in order."""

    def __init__(self, url: str, headers: dict[str, str] | None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue[grpcclient.InferResult | InferenceServerException] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put(error or result), headers=headers)

    def send(self, model: str, **arrays: np.ndarray) -> None:
        tensors = []
        for name, array in arrays.items():
            datatype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        self.client.async_stream_infer(model_name=model, inputs=tensors)

    def next(self) -> tuple[str, str]:
        """("ok", "") or (status, message) of the next answer."""
        answer = self.answers.get(timeout=30)
        if isinstance(answer, InferenceServerException):
            return str(answer.status()), str(answer.message())
        return "ok", ""

    def close(self) -> list[tuple[str, str]]:
        """Stop the stream (waiting for the call to end) and return what else arrived."""
        self.client.stop_stream()
        self.client.close()
        rest = []
        while not self.answers.empty():
            answer = self.answers.get()
            rest.append(("ok", "") if not isinstance(answer, InferenceServerException) else (str(answer.status()), ""))
        return rest


def _in() -> np.ndarray:
    return np.ones((2, 2), dtype=np.float32)


EXECUTION_ERROR = ("StatusCode.INTERNAL", "An error occurred during execution")
IN_STREAM_ERROR = ("None", "An error occurred during execution")


@pytest.mark.parametrize("server", SERVERS)
def test_without_the_header_an_error_stays_in_the_stream(servers: Servers, server: str) -> None:
    def body(url: str) -> None:
        stream = Stream(url, None)
        answers = []
        for _ in range(3):  # the model fails every second request it gets
            stream.send("execute_grpc_error", IN=_in())
            answers.append(stream.next())
        assert answers in ([("ok", ""), IN_STREAM_ERROR, ("ok", "")], [IN_STREAM_ERROR, ("ok", ""), IN_STREAM_ERROR])
        assert stream.close() == []

    servers.check(server, body)


@pytest.mark.parametrize("server", SERVERS)
def test_with_the_header_an_execution_error_ends_the_stream_with_its_status(servers: Servers, server: str) -> None:
    def body(url: str) -> None:
        stream = Stream(url, HEADER)
        answers = []
        for _ in range(2):  # the model fails every second request it gets (from any test): one of these two
            stream.send("execute_grpc_error", IN=_in())
            answers.append(stream.next())
            if answers[-1] != ("ok", ""):
                break
        assert answers[-1] == EXECUTION_ERROR and all(answer == ("ok", "") for answer in answers[:-1])
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            stream.send("execute_grpc_error", IN=_in())
        assert stream.close() == []

    servers.check(server, body)


@pytest.mark.parametrize("server", SERVERS)
def test_with_the_header_a_refused_request_is_still_answered_in_the_stream(servers: Servers, server: str) -> None:
    def body(url: str) -> None:
        stream = Stream(url, HEADER)
        stream.send("execute_grpc_error", IN=np.ones((2, 2), dtype=np.int32))
        status, message = stream.next()
        assert status == "None"
        assert "inference input 'IN' data-type is 'INT32', but model 'execute_grpc_error' expects 'FP32'" in message
        stream.send("no_such_model", IN=_in())
        assert stream.next() == ("None", "Request for unknown model: 'no_such_model' is not found")
        stream.send("decoupled_grpc_error", IN=_in()[0], MODE=np.array([b"MODE_ERROR_FINAL"], dtype=np.object_))
        assert stream.next() == ("ok", "")  # the stream is still open
        assert stream.next() == EXECUTION_ERROR
        assert stream.close() == []

    servers.check(server, body)


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("mode", ["MODE_ERROR_ONLY", "MODE_ERROR_FINAL", "MODE_ERROR_WITH_DELAYED_FINAL"])
def test_a_decoupled_error_response_ends_the_stream(servers: Servers, server: str, mode: str) -> None:
    def body(url: str) -> None:
        stream = Stream(url, HEADER)
        stream.send("decoupled_grpc_error", IN=_in()[0], MODE=np.array([mode.encode()], dtype=np.object_))
        assert stream.next() == ("ok", "")
        assert stream.next() == EXECUTION_ERROR
        assert stream.close() == []  # nothing after the status, not even a late final flag

    servers.check(server, body)
