"""How the python-backend stub sends execute answers (`backends/python/stub.py`): a batch sent ahead
of its predecessor's answer is answered together with the next one waiting; any other is answered at
once, without looking for a next one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from reference_server.backends.python import ipc, stub
from reference_server.backends.python.pb import triton_python_backend_utils as pb_utils


class _Identity:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())]) for r in requests]


@pytest.fixture
def ends() -> Iterator[tuple[stub.Stub, ipc.Channel]]:
    server, child = ipc.Channel.pair()
    server_arena, stub_arena = ipc.Arena.create("in", 1 << 16), ipc.Arena.create("out", 1 << 16)
    the_stub = stub.Stub(ipc.Channel(child), server_arena, stub_arena)
    the_stub.model = _Identity()
    yield the_stub, server
    server.close()
    the_stub.channel.close()
    the_stub.loop.close()
    server_arena.close()
    stub_arena.close()


def _execute(the_stub: stub.Stub, batch_id: int, ahead: bool) -> dict[str, Any]:
    desc = ipc.write_tensor(the_stub.server_arena, "IN", np.full(4, batch_id, np.float32), [])
    request = (batch_id, [desc], [], "", "{}", 0, 0)
    return {"op": "execute", "id": batch_id, "model_name": "m", "requests": [request], "free": [], "ahead": ahead}


def _take(the_stub: stub.Stub) -> tuple[dict[str, Any], list[int]]:
    the_stub.pump(lambda: bool(the_stub.work))
    return the_stub.work.popleft()


def test_a_batch_not_sent_ahead_is_answered_at_once(ends: tuple[stub.Stub, ipc.Channel]) -> None:
    the_stub, server = ends
    server.send(_execute(the_stub, 1, ahead=False))
    server.send(_execute(the_stub, 2, ahead=True))
    the_stub._execute(*_take(the_stub))
    answer, _ = server.recv(wait=False)
    assert answer["op"] == "executed" and answer["id"] == 1
    assert not the_stub.work  # the second was not read on the way: nothing looked for it
    the_stub._execute(*_take(the_stub))
    assert server.recv(wait=False)[0]["id"] == 2


def test_a_batch_sent_ahead_is_answered_with_the_next_one_waiting(ends: tuple[stub.Stub, ipc.Channel]) -> None:
    the_stub, server = ends
    server.send(_execute(the_stub, 1, ahead=True))
    server.send(_execute(the_stub, 2, ahead=True))
    the_stub._execute(*_take(the_stub))
    with pytest.raises(BlockingIOError):
        server.recv(wait=False)  # held back: the next execute was found waiting
    the_stub._execute(*_take(the_stub))
    answer, _ = server.recv(wait=False)
    assert answer["op"] == "executed_many" and [a["id"] for a in answer["answers"]] == [1, 2]
    outputs = [a["responses"][0]["outputs"][0] for a in answer["answers"]]
    assert [float(ipc.read_tensor(the_stub.arena, d, [], copy=True)[0]) for d in outputs] == [1.0, 2.0]


def test_executes_the_server_sent_together_are_run_and_answered_together(ends: tuple[stub.Stub, ipc.Channel]) -> None:
    the_stub, server = ends
    server.send(
        {"op": "execute_many", "executes": [_execute(the_stub, 1, ahead=True), _execute(the_stub, 2, ahead=True)]}
    )
    the_stub._execute(*_take(the_stub))
    assert [m["id"] for m, _ in the_stub.work] == [2]  # both routed by one receive
    the_stub._execute(*_take(the_stub))
    answer, _ = server.recv(wait=False)
    assert answer["op"] == "executed_many" and [a["id"] for a in answer["answers"]] == [1, 2]
