"""Triton's default scheduler and dynamic batcher, for one model version.

Theory of operation
-------------------
Requests enter `Scheduler.infer`, which validates the batch dimension, applies the queue policy's
size limit, appends a `QueuedRequest` to a FIFO deque and awaits a plain future: no task per request.
Each model instance owns one worker thread fed by a `SimpleQueue`; the event loop calls
`ModelInstance.run` itself only for short batches of a lone instance (see "Short runs on the
loop"). Everything else (queue, idle instances, timers, statistics) is owned by the event loop, so
none of it needs a lock.

*When is a batch formed?* Only when an instance is idle, as in Triton (core
`dynamic_batch_scheduler.cc`, `BatcherThread` waits for a free payload slot before it calls
`GetDynamicBatch`). `_schedule` runs (1) one loop iteration after an arrival, if an instance is
idle, so requests that arrive in the same iteration share a batch (without dynamic batching there
is nothing to gather: at once); (2) directly when an instance
finishes, so everything that queued while it was busy is gathered into its next batch even with
`max_queue_delay_microseconds: 0`; (3) from a single loop timer, for queue delays and request
timeouts. There is no batching coroutine: those three triggers are callbacks. Under a backlog
whole batches also go to busy instances ahead of time (see "Backlogs").

*Which requests form the batch?* `policy.take_batch` replays Triton's `GetDynamicBatch` on the head
of the queue (the rules are in `policy.py`'s docstring); `policy.batch_key` gives each request its
batch size and what it must share with others to batch.

*Short runs on the loop.* Each batch a worker runs costs two thread hand-offs (a `SimpleQueue`
wake-up one way, `call_soon_threadsafe`'s self-pipe the other) and a GIL round trip, about 100 us
of CPU per batch on a 2-core box, more than a small MLP's whole `run`. So a model with exactly one
instance that says it may (`runs_on_loop`: onnxruntime on CPU with one intra-op thread) runs a
batch on the event-loop thread itself when its expected cost is at most `INLINE_MAX_NS`, which
caps how long one batch holds up every other connection and model. The expectation is fitted to
the CPU time of the last batches, inline or not, against their input elements (`execute.RunCost`);
with no history yet the batch goes to the worker. CPU time, not wall time: a batch on the worker
also waits for the GIL while the loop is busy, and counting that wait would keep the next batches
off the loop, each waiting again. Requests that arrive during an inline run wait in the sockets
and are read as soon as it ends, so the dynamic batcher still finds them together. Several
instances keep their worker threads, which run in parallel. Nothing else changes: the same
`execute.execute`, the same statistics, and `_finish` one loop iteration later.

*Backlogs.* A worker's finished batch reaches the loop through `call_soon_threadsafe`, and the
next batch goes back only when the loop runs that callback: one batch per instance per loop
iteration. A loop busy with many connections makes iterations long, and the instance then idles
between batches (at concurrency 8 on the demo identity, 4300 infer/s against 6600 with batches
handed ahead; under open-loop overload, far worse). So when every instance is busy and the queue
holds whole batches (any request without dynamic batching; the largest preferred size with it), a
completion hands them out at once, up to `AHEAD_BATCHES` per instance, to the least loaded ones;
the worker runs them back to back. A lone instance that runs on the loop takes them inline, for at
most `INLINE_MAX_NS` per callback. A partial batch still waits for an idle instance, so it can
grow, and a queue policy with a timeout turns this off: a request handed ahead cannot expire.
Batches handed ahead count as executing, not queued (`pending`, `max_queue_size`), and their
queue time runs until their run starts. Triton forms a batch only for an idle instance.

*Queue policy* (`default_queue_policy`; priority levels are not modelled): `max_queue_size`
counts queued requests, not executing ones, and a full queue rejects at once. A request's deadline
is its enqueue time plus `default_timeout_microseconds`, or its own lower `timeout_us` when
`allow_timeout_override` is set. As in `PolicyQueue::Enqueue`, a request cannot add a timeout
when the default is 0. The timer expires requests while the instances are still busy, so
clients get "Request timeout expired" on time. REJECT fails them with UNAVAILABLE. DELAY moves
them to a second deque that is served only after the regular queue.

*preserve_ordering* numbers batches as they are dispatched and releases completed batches in
that order. Requests rejected while queued never got a number, so, as in Triton (whose
`DelegateResponse` runs at dequeue), they never hold anyone up.

*Instances without a worker* (`start_requests`: the python backend) get their batch on the loop
and call back when it is answered (`streaming.start_batch`); `_finish` then runs at once, or one
iteration later when the answer came inside the dispatch itself. *Decoupled models* are served by
`infer_stream` (`streaming.stream_responses`): a consumer that leaves early withdraws a queued
request and cancels a running one through its instance. A request that its instance leaves open
when the batch ends (`execute.Deferred`) is answered when it settles (`answers.Answers`).

*Statistics* (`stats.ModelStats`): queue time runs from `received_ns` to the start of the batch's
run; compute_input covers gathering inputs, compute_infer `run`, compute_output splitting outputs
(`perf_counter_ns`, where the batch runs). Request time ends when the response is released on the
loop. Each request ends in exactly one of success, REJECTED (queue full or timeout), CANCELED
(caller gave up), BACKEND (`run` raised) or OTHER (failed by `close`).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import partial
from time import perf_counter_ns, thread_time_ns
from typing import Any

from reference_server.errors import ServerError, Unavailable, Unsupported
from reference_server.scheduling.answers import Answers
from reference_server.scheduling.cancel import cancel_request, watch
from reference_server.scheduling.execute import (
    ModelInstance,
    Outcome,
    RequestsInstance,
    ResponseSink,
    RunCost,
    Tensors,
    batch_elements,
    execute,
)
from reference_server.scheduling.policy import BatchingPolicy, batch_key, take_batch
from reference_server.scheduling.queued import Batch, QueuedRequest, Slot, record_failure
from reference_server.scheduling.rate_limiter import RateGate
from reference_server.scheduling.stats import ModelStats
from reference_server.scheduling.streaming import start_batch, stream_responses
from v2kit.runtime.timer import TimerHandle, call_at_ns

__all__ = ["AHEAD_BATCHES", "INLINE_MAX_NS", "Scheduler"]

#: The longest expected batch (ns) that a `runs_on_loop` instance executes on the event loop.
INLINE_MAX_NS = 1_000_000

#: How many batches an instance may hold, running and waiting their turn, under a backlog (see "Backlogs").
AHEAD_BATCHES = 16

_DECOUPLED = (
    "ModelInfer RPC doesn't support models with decoupled transaction policy: this model sends "
    "its responses as a stream (gRPC ModelStreamInfer, HTTP generate_stream)"
)
_STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"


class Scheduler:
    """Queue, batch and run inference requests for one model version on its instances."""

    def __init__(
        self, policy: BatchingPolicy, instances: Sequence[ModelInstance | RequestsInstance], stats: ModelStats,
        gate: RateGate | None = None,
    ) -> None:  # fmt: skip
        if not instances:
            raise ValueError("a scheduler needs at least one model instance")
        self._policy = policy
        self._stats = stats
        self._batching = policy.dynamic and policy.max_batch_size > 0
        preferred = policy.preferred_batch_sizes or (policy.max_batch_size,)
        self._preferred = frozenset(preferred)
        self._max_preferred = max(preferred)
        self._ordered = policy.preserve_ordering
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[QueuedRequest] = deque()
        self._delayed: deque[QueuedRequest] = deque()  # expired under timeout_action DELAY
        self._next_deadline = 0  # earliest deadline in _queue, or 0; may be stale-early
        self._timer: TimerHandle | None = None
        self._timer_ns = 0
        self._schedule_queued = False
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Future[None] | None = None
        self._drained: asyncio.Event | None = None
        self._next_seq = 0  # preserve_ordering: next batch number to hand out
        self._release_seq = 0  # ... and the next one to release
        self._held: dict[int, tuple[list[QueuedRequest], Outcome]] = {}
        self._answers = Answers(stats, self._check_drained)
        self._resolve = self._answers.resolve
        self._fail = self._answers.fail
        self._slots = [Slot(instance) for instance in instances]
        self._idle: deque[Slot] = deque(self._slots)
        inline = len(instances) == 1 and getattr(instances[0], "runs_on_loop", False) is True
        self._prepare: Callable[[Tensors], Tensors] | None = getattr(instances[0], "prepare_inputs", None)
        self._inline_slot = self._slots[0] if inline else None
        self._run_cost = RunCost()  # of the inline slot's batches
        # Handing busy instances batches ahead would let a queued request outlive its timeout unseen.
        self._ahead = 0 if policy.default_timeout_ns or gate is not None else AHEAD_BATCHES
        self._gate = gate  # --rate-limit execution_count: a batch starts when its resources are free
        for slot in self._slots:
            if slot.start is not None:
                continue
            # Daemon, so a scheduler that is never closed cannot keep the process alive.
            slot.thread = threading.Thread(
                target=self._work, args=(slot,), name=f"{slot.instance.name}-worker", daemon=True
            )
            slot.thread.start()

    # -- public API ------------------------------------------------------------------------------

    async def infer(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> Tensors:
        """Run one request, batched with others where the policy allows; returns its outputs.

        `received_ns` is on the `time.perf_counter_ns` clock (default: now). An empty
        `output_names` asks for every output. `request_id` and `parameters` reach backends that
        show them to the model (python). Raises InvalidArgument for a bad batch dimension or an
        input the instances' `prepare_inputs` refuses, Unavailable when the queue is full, the
        request times out or the scheduler is closing, Unsupported for a decoupled model (use
        `infer_stream`), and InternalError (or the model's own error) when the model fails.
        `secondary_stats`: see `model_scheduler.ModelScheduler`.
        """
        if self._policy.decoupled:
            raise Unsupported(_DECOUPLED)
        request = self._submit(
            inputs, output_names, timeout_us, received_ns, request_id, parameters, None, secondary_stats
        )
        try:
            return await request.future
        except asyncio.CancelledError:
            cancel_request(request, self._withdraw, self._slots)
            raise

    def submit(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        done: Callable[[Tensors | Exception], None],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> None:
        """`infer` for a caller that is no coroutine: raises what `infer` raises before the request
        is queued; once queued, `done` gets its outputs or the error that failed it, once, called
        on the loop where the batch ends (no loop pass for a future's callbacks). `done` must not
        raise, and the request cannot be withdrawn."""
        if self._policy.decoupled:
            raise Unsupported(_DECOUPLED)
        self._submit(inputs, output_names, timeout_us, received_ns, request_id, parameters, None, secondary_stats, done)

    def infer_stream(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
        """Run one request and yield its responses as (outputs, final) as they come.

        A decoupled model yields 0..N responses, the last with final True; a final flag sent
        without a response yields (None, True), and a response the model sent as an error yields
        that `ServerError` in place of the outputs (the stream goes on, as Triton's does, unless
        it is final). Any other model yields exactly one (outputs, True). A request that fails as
        a whole (refused, or its execute raised) raises a `ServerError` as `infer` does.
        Leaving the iteration early withdraws a request that is still queued, and tells a
        running decoupled one's model (`streaming.stream_responses`).
        """
        if self._policy.decoupled:
            submit = partial(self._submit, inputs, output_names, timeout_us, received_ns, request_id, parameters,
                             secondary_stats=secondary_stats)  # fmt: skip
            return stream_responses(submit, self._withdraw, self._slots)
        return _OneAnswer(self.infer(inputs, output_names, timeout_us=timeout_us, received_ns=received_ns,
                                     request_id=request_id, parameters=parameters, secondary_stats=secondary_stats))  # fmt: skip

    def _submit(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        timeout_us: int | None,
        received_ns: int | None,
        request_id: str,
        parameters: dict[str, Any] | None,
        sink: ResponseSink | None,
        secondary_stats: ModelStats | None = None,
        done: Callable[[Tensors | Exception], None] | None = None,
    ) -> QueuedRequest:
        """Admit and queue one request; its future resolves when its batch has run."""
        if self._closing:
            raise Unavailable(_STOPPING)
        now = perf_counter_ns()
        if received_ns is None:
            received_ns = now
        if self._prepare is not None:
            inputs = self._prepare(inputs)
        batch_size, key = batch_key(self._policy, self._batching, inputs)
        policy = self._policy
        if policy.max_queue_size and len(self._queue) + len(self._delayed) >= policy.max_queue_size:
            record_failure(self._stats, secondary_stats, perf_counter_ns() - received_ns, "REJECTED")
            raise Unavailable(f"Exceeds maximum queue size ({policy.max_queue_size})")
        deadline = 0
        if policy.default_timeout_ns:
            timeout_ns = policy.default_timeout_ns
            # Only lower, and only when allowed: PolicyQueue::Enqueue ignores the rest.
            if policy.allow_timeout_override and timeout_us and timeout_us * 1000 < timeout_ns:
                timeout_ns = timeout_us * 1000
            deadline = now + timeout_ns
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Tensors] = loop.create_future()
        request = QueuedRequest(
            inputs, output_names, batch_size, key, future, received_ns, now, deadline, request_id, parameters, sink,
            secondary_stats, done,
        )  # fmt: skip
        self._queue.append(request)
        watch(request, self._withdraw, self._slots)  # a front end's cancel.CancelScope, if one is open
        self._stats.pending += 1
        if deadline and (not self._next_deadline or deadline < self._next_deadline):
            self._next_deadline = deadline
            self._arm(deadline)
        if self._idle and not self._schedule_queued:
            if self._batching:
                self._schedule_queued = True
                loop.call_soon(self._schedule)
            else:
                self._schedule()  # nothing to gather: an idle instance takes it now
        return request

    def _withdraw(self, request: QueuedRequest) -> None:
        """The caller gave up: a request still queued leaves the queue and counts as CANCELED."""
        if request.queued:
            self._unqueue(request)
            record_failure(self._stats, request.secondary_stats, perf_counter_ns() - request.received_ns, "CANCELED")
            self._check_drained()
            request.future.cancel()

    async def close(self, grace_s: float) -> None:
        """Stop accepting requests, let queued and running ones finish for up to `grace_s`
        seconds, fail the rest with Unavailable, and stop the worker threads.

        Batches waiting for their queue delay are sent at once. A `run` still executing after
        the grace period cannot be interrupted: its callers get Unavailable now and its worker
        thread exits once `run` returns. Safe to call more than once; later calls wait for the
        first.
        """
        if self._close_task is None:
            self._closing = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._close_task = asyncio.ensure_future(self._shut_down(grace_s))
        # Shielded: a caller that gives up waiting must not leave the shutdown half done.
        await asyncio.shield(self._close_task)

    async def _shut_down(self, grace_s: float) -> None:
        self._schedule()  # flush batches that were waiting for their queue delay
        if grace_s > 0 and not self._is_drained():
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), grace_s)
            except asyncio.TimeoutError:
                pass
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = perf_counter_ns()
        for request in itertools.chain(self._queue, self._delayed):
            request.queued = False
            self._fail(request, Unavailable("Server is stopping: request was still queued"), "OTHER", now)
        self._stats.pending -= len(self._queue) + len(self._delayed)
        self._queue.clear()
        self._delayed.clear()
        for slot in self._slots:
            for _, batch in slot.running:
                for request in batch:
                    error = Unavailable("Server is stopping: request was still executing")
                    self._fail(request, error, "OTHER", now)
        # Batches held back for ordering have their outputs; their predecessors just failed.
        for seq in sorted(self._held):
            self._resolve(*self._held.pop(seq))
        self._answers.fail_later(Unavailable("Server is stopping: request was still executing"), "OTHER")
        if self._gate is not None:
            self._gate.close()
        for slot in self._slots:
            slot.inbox.put(None)
        for slot in self._slots:
            # Idle workers exit at once; busy ones are left to finish `run` on their own.
            if not slot.running and slot.thread is not None:
                slot.thread.join()

    # -- batch formation (event loop) ------------------------------------------------------------

    def _schedule(self) -> None:
        self._schedule_queued = False
        now = perf_counter_ns()
        if self._next_deadline and now >= self._next_deadline:
            self._expire(now)
        idle, gate = self._idle, self._gate
        while idle and (self._queue or self._delayed):
            count = self._take(now) if self._batching else 1
            if count == 0:
                break  # waiting for the queue delay; _take armed the timer
            slot = idle.popleft() if gate is None else gate.acquire(idle, self._schedule)
            if slot is None:
                break  # waiting for resources: the limiter calls _schedule again
            self._dispatch(slot, [self._pop() for _ in range(count)])
        if gate is not None:
            gate.settle(idle)
        if self._ahead and not idle:
            self._dispatch_ahead(now)
        if self._next_deadline:
            self._arm(self._next_deadline)

    def _take(self, now: int) -> int:
        """How many requests from the head of the queue to batch now; 0 means wait (the timer is armed)."""
        candidates: Iterable[QueuedRequest] = (
            itertools.chain(self._queue, self._delayed) if self._delayed else self._queue
        )
        count, wake_ns = take_batch(self._policy, self._preferred, self._max_preferred, candidates, now, self._closing)
        if count == 0:
            self._arm(wake_ns)
        return count

    def _dispatch_ahead(self, now: int) -> None:
        """Every instance is busy and the queue holds whole batches: hand them out now, up to
        `AHEAD_BATCHES` per instance, so an instance that finishes starts its next batch at once
        instead of one event-loop iteration later (see "Backlogs")."""
        inline_until = now + INLINE_MAX_NS  # the loop runs inline batches here for at most this long
        while self._queue and len(self._queue) >= (self._max_preferred if self._batching else 1):
            slot = min(self._slots, key=_backlog)
            if len(slot.running) >= self._ahead or (slot is self._inline_slot and perf_counter_ns() > inline_until):
                return
            count = self._take(now) if self._batching else 1
            if count == 0:
                return
            self._dispatch(slot, [self._pop() for _ in range(count)])

    def _pop(self) -> QueuedRequest:
        return self._queue.popleft() if self._queue else self._delayed.popleft()

    def _dispatch(self, slot: Slot, batch: list[QueuedRequest]) -> None:
        for request in batch:
            request.queued = False
        self._stats.pending -= len(batch)
        entry = (self._next_seq, batch)
        self._next_seq += 1
        slot.running.append(entry)
        if slot.start is not None:
            assert self._loop is not None  # set by infer() before anything is dispatched
            start_batch(self._loop, slot, entry, self._finish)
            return
        if slot is self._inline_slot:
            elements = batch_elements(batch)
            if 0 < self._run_cost.expected_ns(elements) <= INLINE_MAX_NS:
                loop = self._loop
                assert loop is not None  # set by infer() before anything is dispatched
                started = thread_time_ns()
                outcome = execute(slot.instance, batch)
                loop.call_soon(self._finish, slot, entry, outcome, thread_time_ns() - started, elements)
                return
        slot.inbox.put(entry)

    def _expire(self, now: int) -> None:
        """Apply timeout_action to every queued request whose deadline has passed."""
        queue_ = self._queue
        if not self._policy.allow_timeout_override:
            # Every deadline is enqueue time + the same timeout, so they ascend along the queue
            # and only its head needs looking at: O(1) per request under load.
            while queue_ and now >= queue_[0].deadline_ns:
                self._timed_out(queue_.popleft(), now)
            self._next_deadline = queue_[0].deadline_ns if queue_ else 0
        else:
            keep: deque[QueuedRequest] = deque()
            next_deadline = 0
            for request in queue_:
                deadline = request.deadline_ns
                if deadline and now >= deadline:
                    self._timed_out(request, now)
                    continue
                keep.append(request)
                if deadline and (not next_deadline or deadline < next_deadline):
                    next_deadline = deadline
            self._queue = keep
            self._next_deadline = next_deadline
        self._check_drained()

    def _timed_out(self, request: QueuedRequest, now: int) -> None:
        if self._policy.timeout_action == "DELAY":
            request.deadline_ns = 0
            self._delayed.append(request)
        else:
            request.queued = False
            self._stats.pending -= 1
            self._fail(request, Unavailable("Request timeout expired"), "REJECTED", now)

    def _arm(self, when_ns: int) -> None:
        """Make sure _schedule runs at `when_ns` (perf_counter_ns) or earlier."""
        if self._closed or self._loop is None:
            return
        if self._timer is not None:
            if self._timer_ns <= when_ns:
                return
            self._timer.cancel()
        self._timer = call_at_ns(self._loop, when_ns, self._on_timer)
        self._timer_ns = when_ns

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _unqueue(self, request: QueuedRequest) -> None:
        request.queued = False
        self._stats.pending -= 1
        try:
            self._queue.remove(request)
        except ValueError:
            self._delayed.remove(request)

    # -- execution (worker threads) --------------------------------------------------------------

    def _work(self, slot: Slot) -> None:
        instance = slot.instance
        inbox = slot.inbox
        measured = slot is self._inline_slot  # its cost decides which batches run on the loop
        while (entry := inbox.get()) is not None:
            if self._closed:
                continue  # close() failed what waited here; the sentinel follows
            started = thread_time_ns() if measured else 0
            outcome = execute(instance, entry[1])
            cpu_ns = thread_time_ns() - started if measured else 0
            elements = batch_elements(entry[1]) if measured else 0  # here, not on the loop
            loop = self._loop
            assert loop is not None  # set by infer() before anything is dispatched
            try:
                loop.call_soon_threadsafe(self._finish, slot, entry, outcome, cpu_ns, elements)
            except RuntimeError:
                return  # the loop is closed; nobody is waiting for this batch any more

    # -- completion (event loop) -----------------------------------------------------------------

    def _finish(self, slot: Slot, entry: Batch, outcome: Outcome, cpu_ns: int = 0, elements: int = 0) -> None:
        seq, batch = entry
        running = slot.running
        if running and running[0] is entry:
            running.popleft()
        elif entry in running:  # an inline batch that overtook one on the worker
            running.remove(entry)
        else:
            return  # close() already failed it
        if not self._closed and not running:
            self._idle.append(slot)
        if self._gate is not None:
            self._gate.release(slot, bool(self._queue or self._delayed))
        t0, t1, t2, t3, _, error = outcome
        if error is None:
            self._stats.record_execution(sum(r.batch_size for r in batch), t1 - t0, t2 - t1, t3 - t2)
            if cpu_ns:
                self._run_cost.record(elements, cpu_ns)
        if self._ordered and not self._closed:
            self._held[seq] = (batch, outcome)
            while self._release_seq in self._held:
                self._resolve(*self._held.pop(self._release_seq))
                self._release_seq += 1
        else:
            self._resolve(batch, outcome)
        if not self._closed:
            self._schedule()
            self._check_drained()

    def _is_drained(self) -> bool:
        idle = len(self._idle) == len(self._slots)
        return idle and not self._queue and not self._delayed and not self._held and not self._answers.later

    def _check_drained(self) -> None:
        if self._drained is not None and self._is_drained():
            self._drained.set()


class _OneAnswer:  # an async iterator, not an async generator: mypyc compiles no async generator
    """The one response of a model that is not decoupled, as `infer_stream` yields it."""

    def __init__(self, answer: Awaitable[Tensors]) -> None:
        self._answer: Awaitable[Tensors] | None = answer

    def __aiter__(self) -> _OneAnswer:
        return self

    async def __anext__(self) -> tuple[Tensors | ServerError | None, bool]:
        answer, self._answer = self._answer, None
        if answer is None:
            raise StopAsyncIteration
        return await answer, True

    async def aclose(self) -> None:
        """Closed before its step: the answer is never awaited, so close it (no 'never awaited')."""
        answer, self._answer = self._answer, None
        close = getattr(answer, "close", None)
        if close is not None:
            close()


def _backlog(slot: Slot) -> int:
    return len(slot.running)
