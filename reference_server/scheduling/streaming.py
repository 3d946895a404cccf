"""The scheduler's paths for decoupled models and for instances that need no worker thread.

*Streams.* `stream_responses` is `Scheduler.infer_stream` for a decoupled model: it queues the
request with a sink, which the backend calls with each response from any thread (0..N, the last
one final), and yields them in order. A request that fails as a whole (refused, or its execute
raised) raises instead. When the consumer leaves before the final response (the client closed
its stream or connection), a request still queued is withdrawn, and one already running is
cancelled: `cancel.Cancellable.cancel` tells the instance, so the model's `is_cancelled()` turns True.

*Instances that start batches* (`start_requests`, the python backend): `start_batch` hands the
batch over on the loop and finishes it when the instance calls back, with no worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from time import perf_counter_ns

from reference_server.errors import InternalError, ServerError
from reference_server.scheduling.cancel import cancel_request
from reference_server.scheduling.execute import (
    Outcome,
    RequestsOutcome,
    Rescheduled,
    ResponseSink,
    Tensors,
    requests_outcome,
)
from reference_server.scheduling.queued import Batch, QueuedRequest, Slot

__all__ = ["start_batch", "stream_responses"]


async def stream_responses(
    submit: Callable[[ResponseSink], QueuedRequest],
    withdraw: Callable[[QueuedRequest], None],
    slots: list[Slot],
) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
    """Queue a decoupled request with `submit` and yield its responses as (outputs, final)."""
    loop = asyncio.get_running_loop()
    # (outputs, final, error, whether the error fails the request as a whole)
    items: asyncio.Queue[tuple[Tensors | None, bool, Exception | None, bool]] = asyncio.Queue()
    request: QueuedRequest | None = None

    def sink(outputs: Tensors | None, final: bool, error: Exception | None) -> None:
        # Called from the backend's threads, or from the loop itself.
        if final and error is None and request is not None:
            request.final_sent = True
        try:
            loop.call_soon_threadsafe(items.put_nowait, (outputs, final, error, False))
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more

    def executed(future: asyncio.Future[Tensors]) -> None:
        # The model's execute failed (or the request was refused): that ends the stream.
        if not future.cancelled() and (error := future.exception()) is not None:
            assert isinstance(error, Exception)
            items.put_nowait((None, True, error, True))
        elif not future.cancelled() and isinstance(result := future.result(), Rescheduled):
            # Released to run again: this run's responses are all here; the sequence batcher runs it again.
            items.put_nowait((result, True, None, False))

    request = submit(sink)
    request.future.add_done_callback(executed)
    ended = False
    try:
        while True:
            outputs, final, error, fatal = await items.get()
            ended = final
            if error is not None:
                failure = error if isinstance(error, ServerError) else InternalError(str(error))
                if fatal:
                    raise failure
                yield failure, final
            else:
                yield outputs, final
            if final:
                return
    finally:
        if not ended:
            # Queued: withdrawn; running (or done executing, still streaming): the model may stop early.
            cancel_request(request, withdraw, slots)
        else:
            # Its final response is in (and `final_sent` set, if the model sent it): the sink lets
            # the request go, or the request, which holds the sink, and the sink would hold each
            # other, a reference cycle per stream left to the garbage collector.
            request = None


def start_batch(
    loop: asyncio.AbstractEventLoop, slot: Slot, entry: Batch, finish: Callable[[Slot, Batch, Outcome], None]
) -> None:
    """Hand a batch to an instance that runs it without a worker (`start_requests`)."""
    assert slot.start is not None
    batch = entry[1]
    t0 = perf_counter_ns()
    starting = True

    def done(result: RequestsOutcome | Exception) -> None:
        outcome = requests_outcome(batch, t0, result)
        if starting:
            # Never inside the scheduler's dispatch (it may be iterating its queue): one iteration later.
            loop.call_soon(finish, slot, entry, outcome)
        else:
            # Answered later, from a callback of its own (the loop reading the stub): finish now,
            # not one loop iteration later.
            finish(slot, entry, outcome)

    try:
        slot.start(batch, done)
    except Exception as error:
        done(error)
    starting = False
