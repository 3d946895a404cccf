"""Answers through a `Reply`: the HTTP server hands a request to a `Responder`, which answers from a
callback of its own (as the REST API answers an inference from the scheduler's batch-done callback),
with no task per request; and `Scheduler.submit`, the scheduler's side of that callback."""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_server.core.dataplane import DataPlane
from reference_server.core.repository import ModelRepository
from reference_server.errors import InternalError, InvalidArgument, Unavailable
from reference_server.frontends.http.messages import Exchange, HttpRequest, HttpResponse, Reply
from reference_server.frontends.http.server import HttpServer
from reference_server.scheduling.model_scheduler import submit_by_task
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats
from tests.unit.test_http_server import post, read_response, serve
from tests.unit.test_scheduler import BOUND_S, HOLD, FakeInstance, tensor
from v2kit import codec as v2


class LaterResponder:
    """Answers each request one loop callback later, with its path; `/boom` raises instead."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def respond(self, request: HttpRequest, reply: Reply) -> None:
        self.seen.append(request.path)
        if request.path == "/boom":
            raise ValueError("a bug in the handler")
        asyncio.get_running_loop().call_soon(reply, HttpResponse(200, request.path.encode(), "text/plain"))


def test_a_responder_answers_pipelined_requests_in_order_without_a_task_each(run: Any) -> None:
    async def main() -> tuple[list[bytes], int]:
        responder = LaterResponder()
        server = HttpServer(responder, max_body_bytes=1000)
        reader, writer = await serve(server)
        loop = asyncio.get_running_loop()
        made = 0
        default = loop.get_task_factory()

        def counting(loop_: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
            nonlocal made
            made += 1
            return default(loop_, coro, **kw) if default is not None else asyncio.Task(coro, loop=loop_, **kw)

        loop.set_task_factory(counting)  # type: ignore[arg-type]
        writer.write(post("/a", b"1") + post("/b", b"2") + post("/c", b"3"))
        bodies = [(await read_response(reader))[2] for _ in range(3)]
        loop.set_task_factory(default)
        writer.close()
        await server.stop(1)
        return bodies, made

    bodies, made = run(main())
    assert bodies == [b"/a", b"/b", b"/c"]
    assert made == 0


def test_a_responder_that_raises_is_answered_500_and_the_connection_serves_on(run: Any) -> None:
    async def main() -> list[tuple[int, bytes]]:
        server = HttpServer(LaterResponder(), max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(post("/boom", b"") + post("/after", b""))
        answers = []
        for _ in range(2):
            status, _, body = await read_response(reader)
            answers.append((status, body))
        writer.close()
        await server.stop(1)
        return answers

    (status, body), after = run(main())
    assert status == 500 and b"internal error: ValueError: a bug in the handler" in body
    assert after == (200, b"/after")


def test_a_reply_answers_once() -> None:
    answered: list[int] = []
    exchange = Exchange(lambda _, response: answered.append(response.status), HttpRequest("GET", "/x", {}, b""),
                        False, True, None)  # fmt: skip
    exchange(HttpResponse(204))
    with pytest.raises(RuntimeError, match="GET /x was answered twice"):
        exchange(HttpResponse(200))
    assert answered == [204]


async def test_submit_calls_done_with_the_outputs_or_the_error(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    scheduler = Scheduler(BatchingPolicy(max_batch_size=8), [FakeInstance("fake", gate)], ModelStats())
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(3)]

    def done(index: int) -> Any:
        return lambda result: answers[index].set_result(result)

    try:
        scheduler.submit(tensor(3.0), ["OUT"], done(0))
        scheduler.submit(tensor(-1.0), ["OUT"], done(1))  # the fake model refuses negative input
        out, failed = await asyncio.wait_for(asyncio.gather(answers[0], answers[1]), BOUND_S)
        np.testing.assert_array_equal(out["OUT"], np.full((1, 2), 6.0, np.float32))
        assert isinstance(failed, InternalError) and "poisoned input" in failed.message
        # Behind a batch that holds the instance, then failed by close(): `done` hears it.
        scheduler.submit(tensor(HOLD), ["OUT"], lambda _: None)
        scheduler.submit(tensor(1.0), ["OUT"], done(2))
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            await scheduler.close(0)
            gate.set()
            stopped = await asyncio.wait_for(answers[2], BOUND_S)
        assert isinstance(stopped, Unavailable) and stopped.message.startswith("Server is stopping")
        assert "never retrieved" not in caplog.text  # the future's exception went to `done`
    finally:
        gate.set()
        await scheduler.close(BOUND_S)


def test_an_answer_that_comes_after_the_server_closed_its_connection_is_dropped(run: Any) -> None:
    class Held:
        def __init__(self) -> None:
            self.replies: list[Reply] = []
            self.arrived = asyncio.Event()

        def respond(self, request: HttpRequest, reply: Reply) -> None:
            self.replies.append(reply)
            self.arrived.set()

    async def main() -> bytes:
        held = Held()
        server = HttpServer(held, max_body_bytes=1000)
        reader, writer = await serve(server)
        writer.write(post("/held", b""))
        await held.arrived.wait()
        for connection in list(server.connections):
            connection.abort()  # as the server's stop does, with the request still out
        held.replies[0](HttpResponse(200, b"late"))  # before the loop tells the connection: must not raise
        left = await reader.read()
        writer.close()
        await server.stop(0)
        return left

    assert run(main()) == b""


class _Wrapped:
    """A scheduler wrapper whose requests await, as a response cache or a sequence batcher is: its
    `submit` runs `infer` in a task."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def infer(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.infer(*args, **kwargs)

    def submit(self, inputs: Any, output_names: Any, done: Any, **kwargs: Any) -> None:
        submit_by_task(self.infer(inputs, output_names, **kwargs), done)

    async def close(self, grace_s: float) -> None:
        await self.inner.close(grace_s)


async def test_start_infer_answers_a_plain_scheduler_from_its_callback_and_a_wrapped_one_from_a_task(
    demo_repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", root / "identity")
    repository = ModelRepository(root)
    await repository.load("identity")
    plane = DataPlane(repository)
    loop = asyncio.get_running_loop()
    made = 0
    default = loop.get_task_factory()

    def counting(loop_: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
        nonlocal made
        made += 1
        return default(loop_, coro, **kw) if default is not None else asyncio.Task(coro, loop=loop_, **kw)

    def request(outputs: str = "", name: str = "INPUT0") -> v2.InferRequest:
        body = '{"inputs":[{"name":"' + name + '","shape":[1,3],"datatype":"FP32","data":[1,5,3]}]' + outputs + "}"
        return v2.decode_infer_request(body.encode(), None, "identity")

    async def answer(infer_request: v2.InferRequest) -> v2.InferResponse | Exception:
        answered: asyncio.Future[v2.InferResponse | Exception] = loop.create_future()
        plane.start_infer(infer_request, answered.set_result)
        return await asyncio.wait_for(answered, BOUND_S)

    loop.set_task_factory(counting)  # type: ignore[arg-type]
    try:
        plain = await answer(request())
        # Classification rides the callback too: the top 2 of [1, 5, 3] as Triton formats them.
        ranked = await answer(request(',"outputs":[{"name":"OUTPUT0","parameters":{"classification":2}}]'))
        tasks_for_plain = made
        with pytest.raises(InvalidArgument):  # a bad request raises at once on the callback path
            plane.start_infer(request(name="NOPE"), lambda _: None)
        repository.get("identity").scheduler = _Wrapped(repository.get("identity").scheduler)  # type: ignore[assignment]
        wrapped = await answer(request())
        with pytest.raises(InvalidArgument):  # checked before any scheduler: at once on the task path too
            plane.start_infer(request(name="NOPE"), lambda _: None)
    finally:
        loop.set_task_factory(default)
        await repository.close(0)
    assert isinstance(plain, v2.InferResponse) and np.asarray(plain.outputs[0].data).tolist() == [[1, 5, 3]]
    assert isinstance(ranked, v2.InferResponse)
    assert [s.decode() if isinstance(s, bytes) else s for s in np.asarray(ranked.outputs[0].data).ravel()] == [
        "5.000000:1",
        "3.000000:2",
    ]
    assert tasks_for_plain == 0
    assert isinstance(wrapped, v2.InferResponse) and np.asarray(wrapped.outputs[0].data).tolist() == [[1, 5, 3]]
    assert made == 1  # the wrapped scheduler's request ran in a task
