"""A python model's `async def execute` (decoupled: its coroutines run concurrently in one instance),
the response sender used after `execute` returned and instead of returning, and its misuse: the
same model folders (tests/python_async_models.py) on our server and on real tritonserver 2.51, with
the same results through tritonclient's gRPC streams and HTTP.

Where Triton 2.51 leaves a client waiting for ever (a coroutine that raised, a decoupled request
that never gets its final flag, a non-decoupled one that gets nothing), ours ends the request with
an error; those tests check ours, and check only what Triton does answer.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.backends.python.instance import PythonInstance
from tests.python_async_models import write_async_models
from tests.servers import Endpoints

pytestmark = [pytest.mark.integration]

#: How long any one answer may take: far more than any of them needs.
_WAIT_S = 10.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("async") / "models"
    write_async_models(root)
    return root


class Stream:
    """One tritonclient gRPC stream; `take` waits for the next response or error."""

    def __init__(self, url: str) -> None:
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, values: list[int], request_id: str, **parameters: Any) -> None:
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, np.int32))
        self.client.async_stream_infer(
            model, [tensor], request_id=request_id, enable_empty_final_response=True, parameters=parameters or None
        )

    def take(self) -> tuple[str, list[int] | None, bool] | str:
        """(request id, OUT or None, final), or an error's text."""
        result, error = self.answers.get(timeout=_WAIT_S)
        if error is not None:
            return str(error)
        response = result.get_response()
        out = result.as_numpy("OUT").tolist() if any(o.name == "OUT" for o in response.outputs) else None
        return response.id, out, response.parameters["triton_final_response"].bool_param

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def stream(server: Endpoints) -> Iterator[Stream]:
    opened = Stream(server.grpc)
    yield opened
    opened.close()


def _infer(server: Endpoints, transport: str, model: str, values: list[int]) -> list[int] | str:
    module: Any = httpclient if transport == "http" else grpcclient
    client: Any = module.InferenceServerClient(server.http if transport == "http" else server.grpc)
    tensor = module.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    try:
        out: list[int] = client.infer(model, [tensor]).as_numpy("OUT").tolist()
        return out
    except InferenceServerException as exc:
        return str(exc.message())
    finally:
        client.close()


def test_one_instance_runs_async_decoupled_requests_concurrently(stream: Stream) -> None:
    # `gate` answers only once 4 requests wait in its one instance at the same time (else, after
    # 5 s, each raises): they can only all complete if execute returned while they awaited.
    for index in range(4):
        stream.send("gate", [4], str(index))
    answers = [stream.take() for _ in range(4)]
    assert sorted(answers, key=str) == [(str(i), [4], True) for i in range(4)]


def test_a_raising_coroutine_fails_only_its_own_request(server: Endpoints, stream: Stream) -> None:
    stream.send("async_raises", [-1], "bad")
    stream.send("async_raises", [5], "good")
    # Both servers answer the good request; Triton 2.51 never answers the bad one (it logs the
    # traceback and leaves the stream waiting), ours ends it with Triton's words for a failed execute.
    answers = [stream.take() for _ in range(1 if server.name == "triton" else 2)]
    assert ("good", [5], True) in answers
    if server.name == "ours":
        (error,) = [a for a in answers if isinstance(a, str)]
        assert (
            "Failed to process the request(s) for model 'async_raises_0_0', message: ValueError: negative input -1"
            in error
        )
        assert "model.py" in error  # the model's frame, as Triton reports a Python error
    stream.send("async_raises", [7], "after")
    assert stream.take() == ("after", [7], True)


def test_threads_send_responses_after_execute_returned(stream: Stream) -> None:
    stream.send("threaded", [1, 2, 3], "a")
    answers = [stream.take() for _ in range(4)]
    assert answers == [("a", [1], False), ("a", [2], False), ("a", [3], False), ("a", None, True)]
    # Several requests at once, each on its own thread: each one's responses in its own order.
    for name in "bcd":
        stream.send("threaded", [10, 20], name)
    answers = [stream.take() for _ in range(9)]
    for name in "bcd":
        assert [a for a in answers if a[0] == name] == [(name, [10], False), (name, [20], False), (name, None, True)]


def test_sending_after_the_final_flag_leaves_the_answered_request_alone(stream: Stream) -> None:
    # The model's second send raises "Unable to send response. Response sender has been closed."
    # inside execute; the client has its whole answer already, and the model goes on serving.
    stream.send("after_final", [4], "x")
    assert stream.take() == ("x", [4], True)
    stream.send("after_final", [6], "y")
    assert stream.take() == ("y", [6], True)


def test_a_decoupled_request_never_given_its_final_flag_ends(server: Endpoints, stream: Stream) -> None:
    stream.send("no_final", [4], "x")
    assert stream.take() == ("x", [4], False)
    if server.name == "triton":
        return  # Triton 2.51 leaves this stream waiting for ever
    error = stream.take()
    assert isinstance(error, str)
    assert "Failed to process the request(s) for model 'no_final_0_0'" in error
    assert "released without the final flag" in error and "TRITONSERVER_RESPONSE_COMPLETE_FINAL" in error


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_non_decoupled_model_answers_through_its_response_sender(server: Endpoints, transport: str) -> None:
    assert _infer(server, transport, "sender_unary", [0, 9]) == [0, 9]  # sent with the final flag
    assert _infer(server, transport, "sender_unary", [4, 9]) == [4, 9]  # sent and returned: Triton 2.51 answers
    # Given no response by execute, the request stays open until a thread sends it, after execute returned.
    assert _infer(server, transport, "sender_unary", [6, 9]) == [6, 9]
    error = _infer(server, transport, "sender_unary", [3])
    assert isinstance(error, str)
    assert error.startswith("Failed to process the request(s) for model 'sender_unary_0_0', message: ")
    assert "Unable to send response. Non-decoupled model cannot send complete final before sending a response." in error


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_misusing_a_non_decoupled_sender_fails_the_request(ours: Endpoints, transport: str) -> None:
    # Triton 2.51 answers these otherwise: two responses reach its front end ("expected a single
    # response, got 2"), the next two are never answered.
    two = _infer(ours, transport, "sender_unary", [1])
    assert isinstance(two, str) and "Non-decoupled model cannot send more than one response." in two
    assert _infer(ours, transport, "sender_unary", [2]) == [2]  # one response, no final flag: answered
    # Left open by execute, and its sender dropped with it: nothing can answer it any more.
    nothing = _infer(ours, transport, "sender_unary", [5])
    assert isinstance(nothing, str) and "response sender was released without the final flag" in nothing


def test_misuse_leaks_no_stub_stream_nor_shared_memory(ours: Endpoints) -> None:
    server = ours.ours
    assert server is not None and server.repository is not None
    stubs = len(psutil.Process().children())
    with Stream(ours.grpc) as stream:
        for index, model in enumerate(["no_final", "after_final", "async_raises", "no_final"]):
            stream.send(model, [-1 if model == "async_raises" else 1], str(index))
        answers = 0
        while answers < 4:
            answer = stream.take()
            answers += isinstance(answer, str) or answer[2]
    assert len(psutil.Process().children()) == stubs
    for model in ("no_final", "after_final", "async_raises"):
        # A stream is dropped before its final response goes out: none is left once all are in.
        (instance,) = server.repository.get(model).instances
        assert isinstance(instance, PythonInstance)
        stub = instance._stub
        assert stub is not None and not stub._streams, model
        # Each request's inputs stay in shared memory until its final response, and no longer.
        assert stub.server_arena.free_bytes() == stub.server_arena.size, model
