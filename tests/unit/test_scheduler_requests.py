"""The scheduler with instances that take a batch as its requests (`run_requests`, the python
backend's kind): requests unconcatenated with their ids and parameters, errors per request, and a
decoupled model's responses through `Scheduler.infer_stream`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np
import pytest

from reference_server.errors import InternalError, InvalidArgument, ServerError, Unsupported
from reference_server.scheduling.execute import BatchItem, RequestsOutcome, Tensors
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.stats import ModelStats
from tests.waiting import eventually

BOUND_S = 5.0


class RequestsFake:
    """OUT = IN + 1 per request; a request whose IN starts negative gets InvalidArgument alone.
    Decoupled requests get IN[0] responses from another thread after `run_requests` returned."""

    def __init__(self) -> None:
        self.name = "fake"
        self.batches: list[list[tuple[str, dict[str, Any]]]] = []
        self.gate = threading.Event()
        self.gate.set()

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        assert self.gate.wait(BOUND_S)
        t1 = perf_counter_ns()
        self.batches.append([(r.request_id, r.parameters) for r in batch])
        results: list[Tensors | Exception] = []
        for request in batch:
            x = request.inputs["IN"]
            if request.sink is not None:
                threading.Thread(target=_stream, args=(request.sink, int(x.flat[0]))).start()
                results.append({})
            elif x.flat[0] < 0:
                results.append(InvalidArgument("negative"))
            else:
                results.append({"OUT": x + 1})
        return results, t1, perf_counter_ns()


def _stream(sink: Any, count: int) -> None:
    for index in range(count):
        sink({"OUT": np.array([index])}, index == count - 1, None)
    if count == 0:
        sink(None, True, None)


def tensor(value: float) -> Tensors:
    return {"IN": np.array([[value]], dtype=np.float32)}


async def test_requests_arrive_unconcatenated_with_their_ids_and_errors_stay_their_own() -> None:
    fake, stats = RequestsFake(), ModelStats()
    scheduler = Scheduler(BatchingPolicy(max_batch_size=8, dynamic=True, max_queue_delay_ns=0), [fake], stats)
    fake.gate.clear()  # the first batch waits, so the next three queue and batch together
    try:
        first = asyncio.ensure_future(scheduler.infer(tensor(0), ["OUT"], request_id="a", parameters={"k": 1}))
        await asyncio.sleep(0)
        rest = [
            asyncio.ensure_future(scheduler.infer(tensor(v), ["OUT"], request_id=f"r{v}", parameters={"v": v}))
            for v in (1.0, -1.0, 2.0)
        ]
        await eventually(lambda: stats.pending == 3)  # queued behind the held batch
        fake.gate.set()
        assert (await asyncio.wait_for(first, BOUND_S))["OUT"].tolist() == [[1.0]]
        done = await asyncio.wait_for(asyncio.gather(*rest, return_exceptions=True), BOUND_S)
    finally:
        await scheduler.close(BOUND_S)
    assert done[0]["OUT"].tolist() == [[2.0]] and done[2]["OUT"].tolist() == [[3.0]]  # type: ignore[index]
    assert isinstance(done[1], InvalidArgument) and str(done[1]) == "negative"  # its own error, its own status
    assert fake.batches == [[("a", {"k": 1})], [("r1.0", {"v": 1.0}), ("r-1.0", {"v": -1.0}), ("r2.0", {"v": 2.0})]]
    assert (stats.success_count, stats.fail_count, stats.execution_count) == (3, 1, 2)


@pytest.mark.parametrize("count", [0, 1, 3])
async def test_infer_stream_yields_a_decoupled_models_responses(count: int) -> None:
    scheduler = Scheduler(BatchingPolicy(decoupled=True), [RequestsFake()], ModelStats())
    try:
        items = [
            (None if out is None else int(out["OUT"][0]), final)
            async for out, final in scheduler.infer_stream({"IN": np.array([count])}, ["OUT"])
        ]
        with pytest.raises(Unsupported, match="decoupled"):
            await scheduler.infer({"IN": np.array([1])}, ["OUT"])
    finally:
        await scheduler.close(BOUND_S)
    expected = [(None, True)] if count == 0 else [(i, i == count - 1) for i in range(count)]
    assert items == expected


async def test_infer_stream_on_a_model_that_is_not_decoupled_yields_one_final_response() -> None:
    scheduler = Scheduler(BatchingPolicy(max_batch_size=8), [RequestsFake()], ModelStats())
    try:
        items = [item async for item in scheduler.infer_stream(tensor(4), ["OUT"])]
        with pytest.raises(ServerError, match="negative"):
            async for _ in scheduler.infer_stream(tensor(-4), ["OUT"]):
                pass
    finally:
        await scheduler.close(BOUND_S)
    ((outputs, final),) = items
    assert final is True and outputs is not None and outputs["OUT"].tolist() == [[5.0]]


class AnswersThenFailsFake(RequestsFake):
    """A decoupled model that sends a request's IN[0] responses (the last final; none for a
    negative IN) and then fails the batch, as one whose execute returns past execute-timeout-seconds
    or whose stub dies after answering."""

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        for request in batch:
            if request.inputs["IN"].flat[0] > 0:
                _stream(request.sink, int(request.inputs["IN"].flat[0]))
        raise InternalError("execute() did not return within 0.3 s")


async def test_a_decoupled_request_answered_before_its_batch_failed_is_counted_answered() -> None:
    """The client has every response and the final flag: the statistics count a success, not a
    failure, as the client does; a request of a failed batch that got no final flag fails once."""
    stats = ModelStats()
    scheduler = Scheduler(BatchingPolicy(decoupled=True), [AnswersThenFailsFake()], stats)
    try:
        items = [final async for _, final in scheduler.infer_stream({"IN": np.array([2])}, ["OUT"])]
        with pytest.raises(InternalError, match="did not return"):
            async for _ in scheduler.infer_stream({"IN": np.array([-1])}, ["OUT"]):
                pass
    finally:
        await scheduler.close(BOUND_S)
    assert items == [False, True]
    assert (stats.success_count, stats.fail_count) == (1, 1)


class CancellableFake(RequestsFake):
    """Streams one response; then the final flag at once when IN is 0, else only once cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[Any] = []
        self.sinks: list[Any] = []

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        t1 = perf_counter_ns()
        for request in batch:
            assert request.sink is not None
            self.sinks.append(request.sink)
            request.sink({"OUT": np.array([0])}, False, None)
            if request.inputs["IN"].flat[0] == 0:
                request.sink(None, True, None)
        return [{} for _ in batch], t1, perf_counter_ns()

    def cancel(self, request: BatchItem) -> bool:
        assert request.sink is not None
        self.cancelled.append(request.sink)
        request.sink(None, True, None)
        return True


async def test_leaving_a_running_stream_early_cancels_it_on_its_instance() -> None:
    fake = CancellableFake()
    scheduler = Scheduler(BatchingPolicy(decoupled=True), [fake], ModelStats())
    try:
        # A stream read to its end cancels nothing.
        assert [final async for _, final in scheduler.infer_stream({"IN": np.array([0])}, ["OUT"])] == [False, True]
        assert fake.cancelled == []
        stream = scheduler.infer_stream({"IN": np.array([1])}, ["OUT"])
        first = await asyncio.wait_for(stream.__anext__(), BOUND_S)
        assert first[1] is False and fake.cancelled == []
        await stream.aclose()  # type: ignore[attr-defined]  # what a client that goes away does
        assert fake.cancelled == fake.sinks[1:] and len(fake.sinks) == 2
    finally:
        await scheduler.close(BOUND_S)
