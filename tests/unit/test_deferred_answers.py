"""A request its instance leaves open when the batch ends (`execute.Deferred`): the rest of the batch
is answered at once, it is answered when settled (from any thread), counted once, and the
scheduler's shutdown waits for it and then fails it (`scheduling/answers.py`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from time import perf_counter_ns

import numpy as np
import pytest

from reference_server.errors import Cancelled, Unavailable
from reference_server.scheduling.execute import BatchItem, Deferred, RequestsOutcome, Tensors
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats
from tests.waiting import eventually

BOUND_S = 5.0


class LeavesOpen:
    """OUT = IN; a request whose IN is negative is left open, its Deferred kept in `open`."""

    def __init__(self) -> None:
        self.name = "fake"
        self.open: list[Deferred] = []

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        t1 = perf_counter_ns()
        results: list[Tensors | Exception] = []
        for request in batch:
            if request.inputs["IN"].flat[0] < 0:
                deferred = Deferred()
                self.open.append(deferred)
                results.append(deferred)
            else:
                results.append({"OUT": request.inputs["IN"]})
        return results, t1, perf_counter_ns()


def tensor(value: int) -> Tensors:
    return {"IN": np.array([value], dtype=np.int32)}


def policy() -> BatchingPolicy:
    return BatchingPolicy(max_batch_size=0, dynamic=False)


async def test_an_open_request_is_answered_when_settled_from_another_thread() -> None:
    fake, stats = LeavesOpen(), ModelStats()
    scheduler = Scheduler(policy(), [fake], stats)
    try:
        held = asyncio.ensure_future(scheduler.infer(tensor(-1), ["OUT"]))
        await eventually(lambda: fake.open, BOUND_S)
        assert await asyncio.wait_for(scheduler.infer(tensor(3), ["OUT"]), BOUND_S) == {"OUT": [3]}
        assert not held.done()
        out = {"OUT": np.array([7], np.int32)}
        thread = threading.Thread(target=fake.open[0].settle, args=(out,))
        thread.start()
        thread.join()
        assert (await asyncio.wait_for(held, BOUND_S))["OUT"].tolist() == [7]
        assert not fake.open[0].settle({"OUT": np.array([8])})  # answered once
        assert stats.success_count == 2  # each request counted once
        assert not scheduler._answers.later
    finally:
        await scheduler.close(0)


async def test_an_open_request_settled_with_an_error_fails_alone_and_cancelled_counts_so() -> None:
    fake = LeavesOpen()
    scheduler = Scheduler(policy(), [fake], ModelStats())
    try:
        first = asyncio.ensure_future(scheduler.infer(tensor(-1), ["OUT"]))
        await eventually(lambda: fake.open, BOUND_S)
        fake.open[0].settle(Cancelled("Request was cancelled"))
        with pytest.raises(Cancelled):
            await asyncio.wait_for(first, BOUND_S)
        assert not scheduler._answers.later
    finally:
        await scheduler.close(0)


async def test_a_submitted_open_request_cancelled_tells_its_caller() -> None:
    # A front end's request (`submit`, answered through `done`) stays in its in-flight count until
    # `done` hears of it: a cancelled one too, counted CANCELED, once.
    fake, stats = LeavesOpen(), ModelStats()
    scheduler = Scheduler(policy(), [fake], stats)
    try:
        heard: list[Tensors | Exception] = []
        scheduler.submit(tensor(-1), ["OUT"], heard.append)
        await eventually(lambda: fake.open, BOUND_S)
        fake.open[0].settle(Cancelled("Request was cancelled"))
        await eventually(lambda: heard, BOUND_S)
        assert len(heard) == 1 and isinstance(heard[0], Cancelled)
        assert stats.failures["CANCELED"] == 1 and stats.fail_count == 1
        assert not scheduler._answers.later
    finally:
        await scheduler.close(0)


async def test_the_sink_answers_with_its_one_response_at_the_final_flag() -> None:
    deferred = Deferred()
    answers: list[object] = []
    deferred.then(answers.append)
    deferred.sink({"OUT": np.array([1])}, False, None)
    assert answers == []
    deferred.sink(None, True, None)
    assert len(answers) == 1 and answers[0]["OUT"].tolist() == [1]  # type: ignore[index]


async def test_closing_waits_for_an_open_request_then_fails_it() -> None:
    fake = LeavesOpen()
    scheduler = Scheduler(policy(), [fake], ModelStats())
    held = asyncio.ensure_future(scheduler.infer(tensor(-1), ["OUT"]))
    await eventually(lambda: fake.open, BOUND_S)
    closing = asyncio.ensure_future(scheduler.close(BOUND_S))
    await asyncio.sleep(0.05)
    assert not closing.done()  # the grace period waits for the open request
    fake.open[0].settle({"OUT": np.array([1], np.int32)})
    await asyncio.wait_for(closing, BOUND_S)
    assert (await held)["OUT"].tolist() == [1]

    fake = LeavesOpen()
    scheduler = Scheduler(policy(), [fake], ModelStats())
    held = asyncio.ensure_future(scheduler.infer(tensor(-1), ["OUT"]))
    await eventually(lambda: fake.open, BOUND_S)
    await asyncio.wait_for(scheduler.close(0), BOUND_S)
    with pytest.raises(Unavailable, match="still executing"):
        await held
    fake.open[0].settle({"OUT": np.array([1], np.int32)})  # too late: nothing changes
    await asyncio.sleep(0.01)
