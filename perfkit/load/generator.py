"""The load generator: drives a closed or open loop against an InferClient and records Samples.

It knows nothing about HTTP or gRPC (the client does) and nothing about windows or statistics (the
measurement does): it sends, times on an injected clock, and appends to a SampleBuffer. A streamed
request's outcome also carries when each of its responses arrived (`Outcome.response_ns`, on the
client's `time.perf_counter_ns`, which is `RealClock`'s; a test's client gives them on its fake
clock), and is recorded with them (`SampleBuffer.record_streamed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from perfkit.load.clocks import Clock, FakeClock, RealClock
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, Load, OpenLoop, ScheduleStream
from perfkit.load.sequences import LiveSequence, SequenceLoad

# The clocks live in perfkit.load.clocks, interpreted: tests subclass FakeClock, and an interpreted
# class cannot derive from a compiled one. Imported from here as before.
__all__ = [
    "CANCELLED_AT_DRAIN",
    "CHUNK",
    "NOT_SENT",
    "Clock",
    "FakeClock",
    "InferClientLike",
    "LoadGenerator",
    "RealClock",
]

CHUNK = 4096  # schedule offsets produced at a time
# A window's figures (the server's statistics, the window's percentiles) take a few ms of the loop,
# 10-25 ms on a CPU just woken from idle: an open-loop send due that soon is let go first (`sync`).
QUIET_NS = 25_000_000
NOT_SENT = "not sent: open-loop client limit reached"
# A request still unanswered when the level's drain timed out (`stop`'s drain_timeout_s, which sweep
# sets past --request-timeout): cancelled and counted as a failure of this kind, never lost.
CANCELLED_AT_DRAIN = "cancelled at drain: no answer within the drain timeout after the level ended"


class InferClientLike(Protocol):
    async def send(self, prepared: Any) -> Any: ...


class LoadGenerator:
    """Runs one load at a time; `start` it, then `stop` it (in-flight requests are awaited).

    With `sequences` (a sequence model) each request is the next of a sequence slot's, as
    `perfkit.load.sequences` decides: closed-loop worker i runs slot i; an open loop draws a slot
    per send; `stop` ends every open sequence with one more request carrying END. A chained load
    (generative sessions) sends a sequence's steps one after another's answer, its think time
    apart: closed-loop worker i runs slot i's sessions one after another; an open loop's schedule
    starts sessions, each running on to its end in a task of its own; `stop` cuts think times
    short and owes no END."""

    def __init__(
        self,
        client: InferClientLike,
        prepared: Sequence[Any],
        buffer: SampleBuffer,
        clock: Clock,
        *,
        max_outstanding: int = 10_000,
        sequences: SequenceLoad | None = None,
    ) -> None:
        if not prepared and sequences is None:
            raise ValueError("the load generator needs at least one prepared request")
        self.client = client
        self.prepared = list(prepared)
        self.buffer = buffer
        self.clock = clock
        self.max_outstanding = max_outstanding
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self.started_ns = 0
        self.sequences = sequences
        self._slot_freed: asyncio.Event | None = None  # serial sequences: a slot's answer came
        self._thinking: set[asyncio.Task[Any]] = set()  # chained sequences waiting out a think time
        self._left = -1
        self._due_ns = 0  # the open loop's next send, while it waits for it; 0: none
        self._passed: list[asyncio.Future[None]] = []  # `sync` callers waiting for that send to go

    @property
    def outstanding(self) -> int:
        return len(self._in_flight)

    async def sync(self) -> None:
        """Samples land in the buffer as requests complete: none to collect (a distributed load
        generator pulls its workers' samples here). An open-loop send due within QUIET_NS is let
        go first: the window's figures, taken next, hold the loop for a few ms, and a send they held
        would leave late (on a 2-core VM the late sends at 20 req/s were mostly these)."""
        due = self._due_ns
        if due and not self._stopping and due - self.clock.now_ns() < QUIET_NS:
            passed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._passed.append(passed)
            await passed

    def _send_passed(self) -> None:
        """The awaited open-loop send has left (or none will): the `sync` callers go on."""
        self._due_ns = 0
        waiting, self._passed = self._passed, []
        for passed in waiting:
            if not passed.done():
                passed.set_result(None)

    def start(self, load: Load, request_limit: int = 0) -> None:
        """Start `load`; with `request_limit` (--request-count) send that many requests, no more."""
        if self._tasks:
            raise RuntimeError("a load is already running; stop it first")
        self._stopping = False
        self._left = request_limit or -1  # sends left; negative: no limit
        self.started_ns = self.clock.now_ns()
        loop = asyncio.get_running_loop()
        sequences = self.sequences
        if isinstance(load, ClosedLoop):
            if sequences is not None:
                sequences.begin_level(load.concurrency)
                self._tasks = [loop.create_task(self._closed_sequence_worker(i)) for i in range(load.concurrency)]
            else:
                self._tasks = [
                    loop.create_task(self._closed_worker(i, load.concurrency)) for i in range(load.concurrency)
                ]
        elif isinstance(load, OpenLoop):
            if sequences is not None:
                sequences.begin_level(0 if sequences.chained else sequences.spec.num_of_sequences)
                self._slot_freed = asyncio.Event()
            self._tasks = [loop.create_task(self._open_dispatcher(ScheduleStream(load)))]
        else:
            raise TypeError(f"unknown load {load!r}")

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Send nothing more; wait for requests already sent (bounded by the client's own timeout),
        and after `drain_timeout_s` cancel those still unanswered, each recorded as CANCELLED_AT_DRAIN."""
        self._stopping = True
        for thinking in self._thinking:
            thinking.cancel()
        tasks, self._tasks = self._tasks, []
        pending = [*tasks, *self._in_flight]
        if pending:
            done = await _wait_cancelling_late(pending, drain_timeout_s)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        if self.sequences is not None and not self.sequences.chained:
            await self._end_open_sequences(drain_timeout_s)

    def _cancelled(self, intended: int, sent: int, request: Any, sequence_id: int = 0) -> None:
        """A request cancelled unanswered by `stop`'s drain timeout: recorded as a failure of its own
        kind, so that the level and the export count it once (a cancellation before `stop` is no
        drain's and records nothing)."""
        if self._stopping:
            self.buffer.record(intended, sent, self.clock.now_ns(), CANCELLED_AT_DRAIN, request.bytes_out,
                               sequence_id=sequence_id)  # fmt: skip

    async def _end_open_sequences(self, timeout_s: float | None) -> None:
        """perf_analyzer's CompleteOngoingSequences: one request with END for each open sequence."""
        assert self.sequences is not None
        loop = asyncio.get_running_loop()
        ends = [
            loop.create_task(self._sequence_request(slot, self.clock.now_ns(), last=True))
            for slot in self.sequences.manager.open_slots()
        ]
        if ends:
            await _wait_cancelling_late(ends, timeout_s)

    async def _sequence_request(self, slot: int, intended: int, *, last: bool = False) -> None:
        sequences, clock = self.sequences, self.clock
        assert sequences is not None
        sent = clock.now_ns()
        request, live = sequences.send(slot, sent, last=last)
        await self._sequence_answer(intended, sent, request, live)

    async def _sequence_answer(self, intended: int, sent: int, request: Any, live: LiveSequence) -> None:
        assert self.sequences is not None
        try:
            outcome = await self.client.send(request)
        except asyncio.CancelledError:
            self._cancelled(intended, sent, request, live.sequence_id)
            raise
        done = self.clock.now_ns()
        buffer = self.buffer
        buffer.record(intended, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                      outcome.send_ns, outcome.recv_ns, tokens=outcome.tokens, sequence_id=live.sequence_id)  # fmt: skip
        self.sequences.answered(live, done, not outcome.error, buffer.record_sequence)

    async def _closed_sequence_worker(self, slot: int) -> None:
        # _sequence_request inlined: this loop is the hot path of concurrency mode on a sequence model.
        clock, client, record = self.clock, self.client, self.buffer.record
        sequences = self.sequences
        assert sequences is not None
        chained = sequences.chained
        record_sequence = self.buffer.record_session if chained else self.buffer.record_sequence
        while not self._stopping and self._left:
            self._left -= 1
            sent = clock.now_ns()
            request, live = sequences.send(slot, sent)
            try:
                outcome = await client.send(request)
            except asyncio.CancelledError:
                self._cancelled(sent, sent, request, live.sequence_id)
                raise
            done = clock.now_ns()
            record(sent, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                   outcome.send_ns, outcome.recv_ns, tokens=outcome.tokens, sequence_id=live.sequence_id)  # fmt: skip
            sequences.answered(live, done, not outcome.error, record_sequence, outcome.text if chained else "")
            if chained and live.remaining and (think := sequences.think_ns(live)):
                if not await self._think(done + think):
                    return

    async def _think(self, until_ns: int) -> bool:
        """A session's think time before its next turn; False when the load stopped meanwhile
        (`stop` cancels the wait, so a level ends without waiting out think times)."""
        task = asyncio.current_task()
        assert task is not None
        self._thinking.add(task)
        try:
            await self.clock.sleep_until(until_ns)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            return False  # the caller's task ends at once: nothing after this awaits
        finally:
            self._thinking.discard(task)
        return not self._stopping

    async def _open_session(self, intended: int) -> None:
        """A chained open loop: one session from its scheduled first turn to its last; each later
        turn intended at its predecessor's answer plus the think time."""
        sequences, clock, client, buffer = self.sequences, self.clock, self.client, self.buffer
        assert sequences is not None
        slot = sequences.take_slot()
        try:
            while True:
                sent = clock.now_ns()
                request, live = sequences.send(slot, sent)
                try:
                    outcome = await client.send(request)
                except asyncio.CancelledError:
                    self._cancelled(intended, sent, request, live.sequence_id)
                    raise
                done = clock.now_ns()
                buffer.record(intended, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                              outcome.send_ns, outcome.recv_ns, tokens=outcome.tokens,
                              sequence_id=live.sequence_id)  # fmt: skip
                sequences.answered(live, done, not outcome.error, buffer.record_session, outcome.text)
                if not live.remaining or self._stopping or not self._left:
                    return
                self._left -= 1
                intended = done + sequences.think_ns(live)
                if not await self._think(intended):
                    return
        finally:
            sequences.release_slot(slot)

    async def _closed_worker(self, index: int, concurrency: int) -> None:
        client, clock, record = self.client, self.clock, self.buffer.record
        prepared = self.prepared
        count = len(prepared)
        position = index
        while not self._stopping and self._left:
            self._left -= 1
            request = prepared[position % count]
            position += concurrency
            sent = clock.now_ns()
            try:
                outcome = await client.send(request)
            except asyncio.CancelledError:
                self._cancelled(sent, sent, request)
                raise
            done = clock.now_ns()
            if outcome.response_ns is None:
                record(sent, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                       outcome.send_ns, outcome.recv_ns, tokens=outcome.tokens)  # fmt: skip
            else:
                self.buffer.record_streamed(sent, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                                            outcome.send_ns, outcome.recv_ns, outcome.response_ns)  # fmt: skip

    async def _open_dispatcher(self, stream: ScheduleStream) -> None:
        clock, loop = self.clock, asyncio.get_running_loop()
        prepared, count = self.prepared, len(self.prepared)
        start = self.started_ns
        position = 0
        try:
            while not self._stopping:
                for offset in stream.next_chunk(CHUNK).tolist():
                    # The previous send's task was created (its stamp comes first) or it was not sent.
                    if self._passed:
                        self._send_passed()
                    intended = start + offset
                    self._due_ns = intended
                    if clock.now_ns() < intended:
                        await clock.sleep_until(intended)
                    elif position % 16 == 0:
                        # Behind schedule: send at once, but let responses and the measurement run.
                        await asyncio.sleep(0)
                    if self._stopping or not self._left:
                        return
                    self._left -= 1
                    if self.sequences is not None and self.sequences.chained:
                        self._start_open_session(intended)
                        continue
                    if self.sequences is not None:
                        if not await self._open_sequence_send(intended):
                            return
                        continue
                    request = prepared[position % count]
                    position += 1
                    if len(self._in_flight) >= self.max_outstanding:
                        # Open loop means never waiting for the server; past the limit the request is
                        # counted as not sent (k6's dropped iterations), never silently delayed.
                        now = clock.now_ns()
                        self.buffer.record(intended, now, now, NOT_SENT, 0, 0)
                        continue
                    task = loop.create_task(self._open_request(intended, request))
                    self._in_flight.add(task)
                    task.add_done_callback(self._in_flight.discard)
        finally:
            self._send_passed()

    def _start_open_session(self, intended: int) -> None:
        if len(self._in_flight) >= self.max_outstanding:
            now = self.clock.now_ns()
            self.buffer.record(intended, now, now, NOT_SENT, 0, 0)
            return
        task = asyncio.get_running_loop().create_task(self._open_session(intended))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _open_sequence_send(self, intended: int) -> bool:
        """Send the next request of a drawn slot (serial: of the first free one, waiting for one
        if need be, which makes the send late). False once the load is stopping."""
        sequences, clock = self.sequences, self.clock
        assert sequences is not None and self._slot_freed is not None
        if len(self._in_flight) >= self.max_outstanding:
            now = clock.now_ns()
            self.buffer.record(intended, now, now, NOT_SENT, 0, 0)
            return True
        if sequences.serial:
            slot = sequences.take_free()
            while slot is None:
                # Waiting for a slot may take an answer's time: `sync` must not wait for this send.
                self._send_passed()
                self._slot_freed.clear()
                await self._slot_freed.wait()
                if self._stopping:
                    return False
                slot = sequences.take_free()
        else:
            slot = sequences.draw_slot()
        sent = clock.now_ns()
        request, live = sequences.send(slot, sent)
        task = asyncio.get_running_loop().create_task(self._open_sequence_answer(intended, sent, request, live, slot))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return True

    async def _open_sequence_answer(
        self, intended: int, sent: int, request: Any, live: LiveSequence, slot: int
    ) -> None:
        try:
            await self._sequence_answer(intended, sent, request, live)
        finally:
            assert self.sequences is not None and self._slot_freed is not None
            if self.sequences.serial:
                self.sequences.release(slot)
                self._slot_freed.set()

    async def _open_request(self, intended: int, request: Any) -> None:
        clock = self.clock
        sent = clock.now_ns()
        try:
            outcome = await self.client.send(request)
        except asyncio.CancelledError:
            self._cancelled(intended, sent, request)
            raise
        done = clock.now_ns()
        if outcome.response_ns is None:
            self.buffer.record(intended, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                               outcome.send_ns, outcome.recv_ns, tokens=outcome.tokens)  # fmt: skip
        else:
            self.buffer.record_streamed(intended, sent, done, outcome.error, request.bytes_out, outcome.bytes_in,
                                        outcome.send_ns, outcome.recv_ns, outcome.response_ns)  # fmt: skip


async def _wait_cancelling_late(
    tasks: Sequence[asyncio.Future[Any]], timeout_s: float | None
) -> set[asyncio.Future[Any]]:
    """Wait up to `timeout_s` for `tasks`; cancel those still running and wait for them to end.
    The tasks that finished in time."""
    done, late = await asyncio.wait(tasks, timeout=timeout_s)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late)
    return done
