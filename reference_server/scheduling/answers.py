"""How the scheduler (`scheduler.Scheduler`) answers its requests once their batch has run: each one's
outputs, its own error or the batch's, counted in the model's statistics exactly once.

*Answers that come later.* A request whose model left it open when its batch ended (a python
model that returns None for it and keeps its response sender, as Triton's python backend allows a
non-decoupled model to) has an `execute.Deferred` in place of its outputs: it is answered when the
instance settles it (the response came, the request was cancelled, the stub died, the execute
timeout passed), on the loop, while the rest of its batch is answered at once. Until then it is
in `Answers.later`, which the scheduler's shutdown waits for and then fails. Only a request that
is left open pays for any of this: the common path sees a Deferred only where it already looks
for a request's own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter_ns

from reference_server.errors import Cancelled, InternalError, ServerError
from reference_server.scheduling.execute import Deferred, Outcome, Tensors
from reference_server.scheduling.queued import QueuedRequest, record_failure
from reference_server.scheduling.stats import ModelStats

__all__ = ["Answers"]


class Answers:
    """Answers the requests of one scheduler's batches."""

    __slots__ = ("_stats", "_idle", "later")

    def __init__(self, stats: ModelStats, idle: Callable[[], None]) -> None:
        self._stats = stats
        self._idle = idle  # told when the last request answered later is answered (shutdown waits on it)
        #: Requests whose batch ended without their answer (see "Answers that come later").
        self.later: set[QueuedRequest] = set()

    def resolve(self, batch: list[QueuedRequest], outcome: Outcome) -> None:
        """Answer each request of `batch` from its batch's outcome."""
        t0, t1, t2, t3, results, error = outcome
        done = perf_counter_ns()
        stats = self._stats
        if results is None:
            if isinstance(error, ServerError):
                failure: ServerError = error
            else:
                failure = InternalError(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
            for request in batch:
                if request.final_sent:
                    # A decoupled request answered in full before its batch failed (its execute
                    # returned late, or its stub died after): its client has every response and
                    # the final flag, so the statistics count it answered, as the client does.
                    self._succeed(request, {}, outcome, done)
                else:
                    self.fail(request, failure, "BACKEND", done)
            return
        for request, result in zip(batch, results):
            if isinstance(result, Exception):
                if isinstance(result, Deferred):
                    self._wait(request, result, outcome)
                    continue
                own = result if isinstance(result, ServerError) else InternalError(f"{type(result).__name__}: {result}")
                self.fail(request, own, "BACKEND", done)
                continue
            # Inline, not `_succeed`: once per request of every batch.
            future = request.future
            if future.done():
                if future.cancelled():
                    record_failure(stats, request.secondary_stats, done - request.received_ns, "CANCELED")
                continue  # otherwise close() failed it and counted it already
            received = request.received_ns
            stats.record_success(done - received, t0 - received, t1 - t0, t2 - t1, t3 - t2)
            if request.secondary_stats is not None:
                request.secondary_stats.record_success(done - received, t0 - received, t1 - t0, t2 - t1, t3 - t2)
            future.set_result(result)
            if request.done is not None:
                request.done(result)

    def _succeed(self, request: QueuedRequest, result: Tensors, outcome: Outcome, done: int) -> None:
        """`resolve`'s success, for a request answered later."""
        future = request.future
        if future.done():
            if future.cancelled():
                record_failure(self._stats, request.secondary_stats, done - request.received_ns, "CANCELED")
            return  # otherwise close() failed it and counted it already
        t0, t1, t2, t3 = outcome[:4]
        received = request.received_ns
        self._stats.record_success(done - received, t0 - received, t1 - t0, t2 - t1, t3 - t2)
        if request.secondary_stats is not None:
            request.secondary_stats.record_success(done - received, t0 - received, t1 - t0, t2 - t1, t3 - t2)
        future.set_result(result)
        if request.done is not None:
            request.done(result)

    def fail(self, request: QueuedRequest, error: Exception, reason: str, now: int) -> None:
        """Fail `request` with `error`, counted under `reason`, unless it was answered already."""
        future = request.future
        if future.cancelled():  # its caller gave up and was told then (`cancel.cancel_request`)
            record_failure(self._stats, request.secondary_stats, now - request.received_ns, "CANCELED")
            return
        if future.done():
            return  # already answered and counted
        future.set_exception(error)
        if request.done is not None:
            future.exception()  # taken from `done`, not from the future: not "never retrieved"
        record_failure(self._stats, request.secondary_stats, now - request.received_ns, reason)
        if request.done is not None:
            # A request cancelled while its model held it open is told too: its front end counts
            # it in flight (and its server's stop waits for it) until `done` hears of it.
            request.done(error)

    def _wait(self, request: QueuedRequest, deferred: Deferred, outcome: Outcome) -> None:
        later = self.later
        later.add(request)
        loop = asyncio.get_running_loop()

        def settled(result: Tensors | Exception) -> None:
            # The instance settles it from whichever thread learns the answer.
            try:
                loop.call_soon_threadsafe(answer, result)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for an answer any more

        def answer(result: Tensors | Exception) -> None:
            if request not in later:
                return  # failed by the scheduler's shutdown already
            later.discard(request)
            done = perf_counter_ns()
            if isinstance(result, Exception):
                own = result if isinstance(result, ServerError) else InternalError(f"{type(result).__name__}: {result}")
                self.fail(request, own, "CANCELED" if isinstance(result, Cancelled) else "BACKEND", done)
            else:
                self._succeed(request, result, outcome, done)
            if not later:
                self._idle()

        deferred.then(settled)

    def fail_later(self, error: Exception, reason: str) -> None:
        """Fail every request still waiting for its answer (the scheduler is closing)."""
        now = perf_counter_ns()
        waiting = list(self.later)
        self.later.clear()  # in place: an answer that comes now finds its request gone (see _wait)
        for request in waiting:
            self.fail(request, error, reason, now)
