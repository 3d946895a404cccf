"""`scheduling.cancel`: a front end's `CancelScope` cancels the unary requests queued inside it:
one still queued is withdrawn and its caller answered CANCELLED; a running one's instance is told;
one queued outside the scope, or answered already, is left alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np

from reference_server.errors import Cancelled
from reference_server.scheduling.cancel import CancelScope
from reference_server.scheduling.execute import BatchItem, RequestsOutcome, Tensors
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats

BOUND_S = 5.0


class Cancellable:
    """OUT = IN; a request runs until the scheduler cancels it on this instance."""

    def __init__(self) -> None:
        self.name = "fake"
        self.running = threading.Event()
        self.released = threading.Event()
        self.cancelled: list[BatchItem] = []

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        t1 = perf_counter_ns()
        self.running.set()
        assert self.released.wait(BOUND_S)
        return [dict(r.inputs) for r in batch], t1, perf_counter_ns()

    def cancel(self, request: BatchItem) -> bool:
        self.cancelled.append(request)
        self.released.set()
        return True


async def test_a_scope_cancels_its_queued_and_running_requests() -> None:
    fake = Cancellable()
    scheduler = Scheduler(BatchingPolicy(), [fake], ModelStats())
    loop = asyncio.get_running_loop()
    answers: dict[str, asyncio.Future[Tensors | Exception]] = {name: loop.create_future() for name in "abc"}

    def submit(name: str) -> None:
        scheduler.submit({"IN": np.array([1])}, ["IN"], answers[name].set_result, request_id=name)

    try:
        running, queued = CancelScope(), CancelScope()
        with running:
            submit("a")
        await asyncio.wait_for(asyncio.to_thread(fake.running.wait, BOUND_S), BOUND_S)
        with queued:
            submit("b")
        submit("c")  # in no scope
        queued.cancel()
        assert isinstance(await asyncio.wait_for(answers["b"], BOUND_S), Cancelled)
        assert fake.cancelled == []
        running.cancel()
        a: Any = await asyncio.wait_for(answers["a"], BOUND_S)
        assert [r.request_id for r in fake.cancelled] == ["a"]
        assert a["IN"].tolist() == [1]
        c: Any = await asyncio.wait_for(answers["c"], BOUND_S)
        assert c["IN"].tolist() == [1]
        running.cancel()  # answered: nothing more happens
        assert len(fake.cancelled) == 1
    finally:
        await scheduler.close(BOUND_S)
