"""The front ends over a scripted `infer_stream`: what gRPC ModelStreamInfer and the HTTP generate
extension make of 0, 1 and N responses, a final flag sent alone, an error response, an execution
that fails mid-stream, concurrent requests on one stream, and a client that goes away.

The data plane here is a fake (it is the front ends that are under test); the replies expected are
those real tritonserver 2.51 gives for the same sequences (tests/integration/test_decoupled_streaming.py
checks them against it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from reference_server.core.tracing import Tracing
from reference_server.errors import InternalError, InvalidArgument, NotFound, ServerError, Unavailable
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.http.generate import ONE_RESPONSE, generate_event, generate_request
from reference_server.frontends.http.rest import RestApi
from reference_server.frontends.http.server import HttpServer
from tests.waiting import eventually
from v2kit import codec as v2

Step = tuple[Any, ...]


def out(*values: int, final: bool = False) -> Step:
    return ("response", values, final)


FLAG: Step = ("flag",)


class ScriptedPlane:
    """What the front ends use of a DataPlane, answering each model with its script: responses,
    errors sent in place of one, a final flag alone, a raise, or a wait on an event."""

    def __init__(self, scripts: dict[str, list[Step]], limit: int = 100) -> None:
        self.scripts = scripts
        self.limit = limit
        self.inflight = 0
        self.started: list[str] = []
        self.closed: list[str] = []
        self.tracing = Tracing()

    def acquire(self) -> None:
        if self.inflight >= self.limit:
            raise Unavailable("server is overloaded")
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        if name not in self.scripts:
            raise NotFound(f"model '{name}' is not found")
        return {"name": name, "inputs": [{"name": "IN", "datatype": "INT32", "shape": [-1]}]}

    def infer_stream(self, request: v2.InferRequest, *, endpoint: str = "") -> AsyncGenerator[tuple[Any, bool], None]:
        if request.model_name not in self.scripts:
            raise NotFound(f"model '{request.model_name}' is not found")
        return self._run(request, self.scripts[request.model_name])

    async def _run(self, request: v2.InferRequest, script: list[Step]) -> AsyncGenerator[tuple[Any, bool], None]:
        self.started.append(request.id)
        try:
            for step in script:
                kind = step[0]
                if kind == "response":
                    data = np.array(step[1], np.int32)
                    tensor = v2.InferTensor("OUT", "INT32", [len(step[1])], data)
                    yield v2.InferResponse(request.model_name, "1", request.id, [tensor]), step[2]
                elif kind == "error":
                    yield InvalidArgument(step[1]), step[2]
                elif kind == "flag":
                    yield None, True
                elif kind == "raise":
                    raise step[1]
                elif kind == "wait":
                    await step[1].wait()
        finally:
            self.closed.append(request.id)


# --- gRPC ModelStreamInfer -------------------------------------------------------------------------


class Context:
    """grpc.aio's ServicerContext as the servicer uses it: the replies written, in order."""

    def __init__(self) -> None:
        self.replies: list[pb.ModelStreamInferResponse] = []
        self.wrote = asyncio.Event()

    async def write(self, message: pb.ModelStreamInferResponse) -> None:
        self.replies.append(message)
        self.wrote.set()

    async def abort(self, code: Any, details: str = "") -> None:
        raise AssertionError(f"the stream was aborted: {code} {details}")


def stream_request(model: str, request_id: str, empty_final: bool | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    tensor = request.inputs.add(name="IN", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(1)
    if empty_final is not None:
        request.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return request


async def requests_of(*requests: pb.ModelInferRequest, hold: asyncio.Event | None = None) -> AsyncIterator[Any]:
    for request in requests:
        yield request
    if hold is not None:
        await hold.wait()  # the client keeps its side of the stream open


def summary(reply: pb.ModelStreamInferResponse) -> tuple[str, str, list[int], bool | None, str]:
    """(id, error, OUT values, triton_final_response, model_version) of one reply."""
    response = reply.infer_response
    values = list(np.frombuffer(response.raw_output_contents[0], np.int32)) if response.raw_output_contents else []
    final = (
        response.parameters["triton_final_response"].bool_param
        if "triton_final_response" in response.parameters
        else None
    )
    return response.id, reply.error_message, values, final, response.model_version


def stream(plane: ScriptedPlane, *requests: pb.ModelInferRequest) -> list[tuple[str, str, list[int], bool | None, str]]:
    async def main() -> list[pb.ModelStreamInferResponse]:
        context = Context()
        await InferenceServicer(plane).ModelStreamInfer(requests_of(*requests), context)  # type: ignore[arg-type]
        return context.replies

    replies = asyncio.run(asyncio.wait_for(main(), 10))
    assert plane.inflight == 0, "every request gives its in-flight slot back"
    return [summary(r) for r in replies]


REPEAT = [out(1), ("error", "element 1 is negative", False), out(3), FLAG]


def test_n_responses_each_with_triton_final_response_and_no_empty_final_unless_asked() -> None:
    plane = ScriptedPlane({"repeat": REPEAT})
    assert stream(plane, stream_request("repeat", "r")) == [
        ("r", "", [1], False, "1"),
        ("r", "element 1 is negative", [], False, ""),  # an error response: the stream goes on
        ("r", "", [3], False, "1"),
    ]


def test_the_empty_final_response_comes_when_the_request_asks_for_it() -> None:
    plane = ScriptedPlane({"repeat": REPEAT})
    replies = stream(plane, stream_request("repeat", "r", empty_final=True))
    assert replies[-1] == ("r", "", [], True, "")
    assert len(replies) == 4
    assert stream(plane, stream_request("repeat", "r", empty_final=False))[-1] == ("r", "", [3], False, "1")


def test_zero_responses_give_nothing_or_only_the_empty_final() -> None:
    plane = ScriptedPlane({"silent": [FLAG]})
    assert stream(plane, stream_request("silent", "s")) == []
    assert stream(plane, stream_request("silent", "s", empty_final=True)) == [("s", "", [], True, "")]


def test_one_response_that_carries_the_final_flag() -> None:
    plane = ScriptedPlane({"late": [out(7, 8, final=True)]})
    assert stream(plane, stream_request("late", "l", empty_final=True)) == [("l", "", [7, 8], True, "1")]


def test_a_failed_execution_ends_its_request_with_an_error_and_the_stream_goes_on() -> None:
    plane = ScriptedPlane(
        {"broken": [out(1), ("raise", InternalError("the model crashed"))], "ok": [out(5, final=True)]}
    )
    replies = stream(plane, stream_request("broken", "b"), stream_request("ok", "o"))
    assert sorted(replies) == [
        ("b", "", [1], False, "1"),
        ("b", "the model crashed", [], True, ""),
        ("o", "", [5], True, "1"),
    ]
    assert plane.closed.count("b") == 1


def test_a_request_refused_before_it_runs_is_answered_with_its_id_alone() -> None:
    plane = ScriptedPlane({})
    assert stream(plane, stream_request("nosuch", "n")) == [("n", "model 'nosuch' is not found", [], None, "")]


def test_requests_on_one_stream_run_concurrently() -> None:
    release = asyncio.Event()
    plane = ScriptedPlane({"slow": [out(1), ("wait", release), out(2, final=True)], "fast": [out(9, final=True)]})

    async def main() -> list[tuple[str, str, list[int], bool | None, str]]:
        context = Context()
        hold = asyncio.Event()
        call = asyncio.create_task(
            InferenceServicer(plane).ModelStreamInfer(  # type: ignore[arg-type]
                requests_of(stream_request("slow", "s"), stream_request("fast", "f"), hold=hold), context
            )
        )
        # The slow request's second response waits on `release`; the fast one, sent after it,
        # is answered meanwhile.
        await eventually(lambda: len(context.replies) == 2)
        release.set()
        await eventually(lambda: len(context.replies) == 3)
        hold.set()
        await call
        return [summary(r) for r in context.replies]

    replies = asyncio.run(asyncio.wait_for(main(), 10))
    assert [r[:3] for r in replies] == [("s", "", [1]), ("f", "", [9]), ("s", "", [2])]


def test_a_cancelled_stream_cancels_the_requests_still_running() -> None:
    never = asyncio.Event()
    plane = ScriptedPlane({"stuck": [out(1), ("wait", never), out(2, final=True)]})

    async def main() -> None:
        context = Context()
        call = asyncio.create_task(
            InferenceServicer(plane).ModelStreamInfer(  # type: ignore[arg-type]
                requests_of(stream_request("stuck", "a"), stream_request("stuck", "b"), hold=asyncio.Event()), context
            )
        )
        await eventually(lambda: len(context.replies) == 2)
        call.cancel()  # what the gRPC server does when the client resets the stream
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(asyncio.wait_for(main(), 10))
    assert sorted(plane.closed) == ["a", "b"]
    assert plane.inflight == 0


# --- the HTTP generate extension --------------------------------------------------------------------


def test_generate_request_maps_keys_to_inputs_and_parameters_and_shapes_as_triton() -> None:
    inputs = {
        "IN": {"name": "IN", "datatype": "INT32", "shape": [-1, -1]},
        "PAIRS": {"name": "PAIRS", "datatype": "FP32", "shape": [2, -1]},
        "TEXT": {"name": "TEXT", "datatype": "BYTES", "shape": [1]},
    }
    body = {
        "id": "42",
        "IN": [1, 2, 3],
        "TEXT": "hi",
        "temperature": 0.5,
        "parameters": {"PAIRS": [1, 2, 3, 4], "stream": True},
    }
    request = generate_request(json.dumps(body).encode(), "m", "2", inputs)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "42")
    assert {t.name: t.shape for t in request.inputs} == {"IN": [1, 3], "TEXT": [1], "PAIRS": [2, 2]}
    assert request.inputs[1].data.tolist() == [b"hi"]
    assert request.parameters == {"temperature": 0.5, "stream": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"OTHER": [1]}, "parameter 'OTHER' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ({"PAIRS": [1, 2, 3]}, "The schema can not convert input 'PAIRS' to tensor with proper shape"),
        (
            {"PAIRS": [1, 2], "parameters": {"PAIRS": [1, 2]}},
            "Converting keyword: 'parameters': input 'PAIRS' already exists",
        ),
        ({"parameters": 3}, "Expected JSON object for keyword: 'parameters'"),
        ({"id": 5}, "Unable to parse 'id'"),
        ([1], "generate request body must be a JSON object"),
    ],
)
def test_generate_request_refuses_what_triton_refuses(body: Any, message: str) -> None:
    inputs = {"PAIRS": {"name": "PAIRS", "datatype": "FP32", "shape": [2, -1]}}
    with pytest.raises(InvalidArgument) as caught:
        generate_request(json.dumps(body).encode(), "m", "", inputs)
    assert caught.value.message.startswith(message)


def test_generate_event_flattens_outputs_and_sorts_keys_as_triton() -> None:
    outputs = [
        v2.InferTensor("OUT", "FP32", [1, 3], np.array([[1.5, 2, 3]], np.float32)),
        v2.InferTensor("IDX", "UINT32", [1], np.array([7], np.uint32)),
    ]
    event = generate_event(v2.InferResponse("m", "1", "42", outputs))
    assert json.dumps(event, separators=(",", ":")) == (
        '{"IDX":7,"OUT":[1.5,2.0,3.0],"id":"42","model_name":"m","model_version":"1"}'
    )


async def http_exchange(plane: ScriptedPlane, path: str, body: dict[str, Any], *, events: int | None = None) -> Any:
    """POST `body` to `path` on a RestApi over `plane`; the raw answer (or, with `events`, the
    reader and writer once the head and that many events are in)."""
    server = HttpServer(RestApi(plane), max_body_bytes=1 << 20)  # type: ignore[arg-type]
    port = await server.listen("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    return server, reader, writer, head


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
    data = await reader.readexactly(size + 2)
    assert data.endswith(b"\r\n")
    return data[:-2]


def sse(*events: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]


def generate_stream(run: Any, plane: ScriptedPlane, model: str, body: dict[str, Any]) -> tuple[str, list[bytes]]:
    async def main() -> tuple[str, list[bytes]]:
        server, reader, writer, head = await http_exchange(plane, f"/v2/models/{model}/generate_stream", body)
        chunks = []
        while chunk := await read_chunk(reader):
            chunks.append(chunk)
        writer.close()
        await server.stop(1)
        return head, chunks

    head, chunks = run(main())
    assert plane.inflight == 0
    return head, chunks


def test_generate_stream_sends_each_response_as_a_server_sent_event_in_its_own_chunk(run: Any) -> None:
    plane = ScriptedPlane({"repeat": REPEAT})
    head, chunks = generate_stream(run, plane, "repeat", {"id": "42", "IN": [1, -2, 3]})
    assert head.startswith("HTTP/1.1 200 OK\r\n")
    assert "Transfer-Encoding: chunked\r\n" in head and "Content-Length" not in head
    assert "Content-Type: text/event-stream; charset=utf-8\r\n" in head
    event = {"OUT": 1, "id": "42", "model_name": "repeat", "model_version": "1"}
    assert chunks == sse(event, {"error": "element 1 is negative"}, {**event, "OUT": 3})


def test_generate_stream_status_is_the_first_responses(run: Any) -> None:
    plane = ScriptedPlane({"bad": [("error", "element 0 is negative", False), out(2), FLAG], "silent": [FLAG]})
    head, chunks = generate_stream(run, plane, "bad", {"IN": [-1, 2]})
    assert head.startswith("HTTP/1.1 400 Bad Request\r\n")
    assert chunks == sse({"error": "element 0 is negative"}, {"OUT": 2, "model_name": "bad", "model_version": "1"})
    head, chunks = generate_stream(run, plane, "silent", {"IN": [1]})
    assert head.startswith("HTTP/1.1 200 OK\r\n") and chunks == []


def test_generate_stream_flushes_each_event_as_it_comes(run: Any) -> None:
    release = asyncio.Event()
    plane = ScriptedPlane({"slow": [out(1), ("wait", release), out(2, final=True)]})

    async def main() -> tuple[bytes, bytes]:
        server, reader, writer, _ = await http_exchange(plane, "/v2/models/slow/generate_stream", {"IN": [1]})
        first = await read_chunk(reader)  # out before the model's second response exists
        release.set()
        second = await read_chunk(reader)
        assert await read_chunk(reader) == b""
        writer.close()
        await server.stop(1)
        return first, second

    first, second = run(main())
    assert [first, second] == sse(*({"OUT": v, "model_name": "slow", "model_version": "1"} for v in (1, 2)))


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_a_client_that_goes_away_before_the_first_response_cancels_its_request(run: Any, endpoint: str) -> None:
    never = asyncio.Event()
    plane = ScriptedPlane({"stuck": [("wait", never), out(1, final=True)]})

    async def main() -> None:
        server = HttpServer(RestApi(plane), max_body_bytes=1 << 20)  # type: ignore[arg-type]
        port = await server.listen("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b'{"IN": [1]}'
        writer.write(
            f"POST /v2/models/stuck/{endpoint} HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n".encode() + body
        )
        await eventually(lambda: plane.started == [""])
        writer.close()
        await eventually(lambda: plane.closed == [""])
        await eventually(lambda: plane.inflight == 0)
        await server.stop(1)

    run(main())


def test_a_client_that_goes_away_cancels_its_generate_stream(run: Any) -> None:
    never = asyncio.Event()
    plane = ScriptedPlane({"stuck": [out(1), ("wait", never), out(2, final=True)]})

    async def main() -> None:
        server, reader, writer, _ = await http_exchange(plane, "/v2/models/stuck/generate_stream", {"IN": [1]})
        await read_chunk(reader)
        writer.close()
        await eventually(lambda: plane.closed == [""])
        await eventually(lambda: plane.inflight == 0)
        await server.stop(1)

    run(main())


@pytest.mark.parametrize(
    ("script", "status", "body"),
    [
        ([out(4), FLAG], 200, {"OUT": 4, "model_name": "m", "model_version": "1"}),
        ([out(1), out(2), FLAG], 200, {"error": ONE_RESPONSE}),
        ([FLAG], 200, {"error": ONE_RESPONSE}),
        ([("error", "element 0 is negative", True)], 400, {"error": "element 0 is negative"}),
        ([("raise", InternalError("the model crashed"))], 500, {"error": "the model crashed"}),
    ],
)
def test_generate_wants_exactly_one_response(run: Any, script: list[Step], status: int, body: dict[str, Any]) -> None:
    plane = ScriptedPlane({"m": script})

    async def main() -> tuple[str, bytes]:
        server, reader, writer, head = await http_exchange(plane, "/v2/models/m/generate", {"IN": [1]})
        data = await read_chunk(reader)  # chunked, as Triton's: the body in one chunk, then the end
        assert await read_chunk(reader) == b""
        writer.close()
        await server.stop(1)
        return head, data

    head, data = run(main())
    assert head.startswith(f"HTTP/1.1 {status} ") and "Content-Type: application/json\r\n" in head
    assert json.loads(data) == body
    assert plane.inflight == 0


def test_a_generate_request_refused_before_it_runs_is_a_json_error(run: Any) -> None:
    plane = ScriptedPlane({})

    async def main() -> str:
        server, reader, writer, head = await http_exchange(plane, "/v2/models/nosuch/generate_stream", {"IN": [1]})
        writer.close()
        await server.stop(1)
        return head

    head = run(main())
    assert head.startswith("HTTP/1.1 404 Not Found\r\n") and "Content-Type: application/json\r\n" in head


def test_server_errors_keep_their_message_in_the_stream(run: Any) -> None:
    # A ServerError subclass the model sent keeps its own status when it comes first.
    class Busy(ServerError):
        http_status = 503

    plane = ScriptedPlane({"busy": [("raise", Busy("try later"))]})
    head, chunks = generate_stream(run, plane, "busy", {"IN": [1]})
    assert head.startswith("HTTP/1.1 503 ") and chunks == sse({"error": "try later"})


def test_an_overloaded_server_refuses_streamed_requests_and_runs_nothing(run: Any) -> None:
    plane = ScriptedPlane({"m": [out(1, final=True)]}, limit=0)
    assert stream(plane, stream_request("m", "x")) == [("x", "server is overloaded", [], None, "")]

    async def main() -> tuple[str, bytes]:
        server, reader, writer, head = await http_exchange(plane, "/v2/models/m/generate", {"IN": [1]})
        data = await read_chunk(reader)
        writer.close()
        await server.stop(1)
        return head, data

    head, data = run(main())
    assert head.startswith("HTTP/1.1 503 ") and json.loads(data) == {"error": "server is overloaded"}
    head, chunks = generate_stream(run, plane, "m", {"IN": [1]})
    assert head.startswith("HTTP/1.1 503 ") and chunks == sse({"error": "server is overloaded"})
    assert plane.started == []
