"""Triton's sequence batcher (`sequence_batching`), for one model version of a stateful model.

Theory of operation
-------------------
A request names its sequence with the `sequence_id` parameter (an unsigned 64-bit integer or a
string) and flags its first and last request with `sequence_start` and `sequence_end`. The data
plane leaves those three in `parameters` (for every model, as Triton's correlation id and flags go
with every request); this scheduler checks them and hands them on, and a python instance turns them
into the request's `correlation_id()` and `flags()`, so a model never sees them as parameters.

*Slots.* Each instance holds `slots_per_instance` sequences at once (`max_batch_size`, at least 1,
for the direct strategy; oldest's `max_candidate_sequences` when set). A START takes a free slot
(spread over the instances) and keeps it until its END has run, or until the sequence has been idle
for `max_sequence_idle_microseconds` (default 1 s), when the reaper releases it: a later request of
that sequence must START again. A START with no free slot waits in the backlog, in arrival order,
with the requests that follow it, and takes the next slot released: Triton backlogs too many
sequences rather than refusing them.

*Order.* A sequence's requests run one at a time, in the order they arrived: each waits for the one
before it to finish (success or failure). Requests of different sequences on one instance are
batched by that instance's own `scheduler.Scheduler`, configured from the strategy (direct:
`direct.max_queue_delay_microseconds`; oldest: its preferred sizes, delay and preserve_ordering), so
a batch never holds two requests of one sequence. Triton's direct strategy pins each sequence to a
batch index; here a slot is a place in the instance's batch, not a fixed index: the control tensors
and the state are per request, so no model this server runs can tell.

*Controls and state.* Before a request runs, the batcher adds its control tensors (READY true,
START/END as flagged, CORRID the id; `controls`) and each implicit state: its initial value at
START, else what the previous request's `output_name` returned. The client neither sends nor sees
them; a state output comes back only if the client asks for it by name.

*Iterative sequences* (`iterative_sequence: true`, core's IterativeSequencer): a request without an
id gets one of the batcher's own (1, 2, ...) and STARTs; each request's sequence ends with it. A
model that releases its request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (the instance answers
`Rescheduled`) has it run again on the same slot, neither START nor END, its inputs and (decoupled)
response stream as they were, until a run releases it.

*Errors*, as Triton words them (core `sequence_batch_scheduler.cc`): a request without an id, a
batch size above 1, a request that does not START an unknown sequence (never started, already
ended, or reaped) are INVALID_ARG. A START for a sequence that is still live is logged as a conflict
and restarts it, after the requests already queued for it, as in Triton.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Sequence
from time import perf_counter_ns
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import InvalidArgument, ServerError, Unavailable, Unsupported
from reference_server.scheduling.execute import (
    RESCHEDULE_REFUSED,
    ModelInstance,
    RequestsInstance,
    Rescheduled,
    Tensors,
)
from reference_server.scheduling.model_scheduler import ModelScheduler, SubmitsByTask
from reference_server.scheduling.policy import BatchingPolicy
from reference_server.scheduling.rate_limiter import RateGate
from reference_server.scheduling.scheduler import Scheduler
from reference_server.scheduling.sequence.config import SequenceId, SequencePolicy
from reference_server.scheduling.sequence.controls import check_sequence_id, control_tensors, initial_states
from reference_server.scheduling.stats import ModelStats

__all__ = ["SEQUENCE_PARAMETERS", "SequenceScheduler", "make_scheduler"]

log = logging.getLogger(__name__)

#: The request parameters this scheduler reads (and the model never sees).
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")

#: Triton's longest string sequence id (TRITONSERVER_InferenceRequestSetCorrelationIdString).
_MAX_ID_CHARS = 128

_STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"


def make_scheduler(
    config: mc.ModelConfig,
    instances: Sequence[ModelInstance | RequestsInstance],
    stats: ModelStats,
    gate: RateGate | None = None,
) -> ModelScheduler:
    """The scheduler a config asks for: the sequence batcher, else Triton's default or dynamic one.
    `gate`: the rate limiter's, which each instance's batcher asks before it runs a batch."""
    if config.HasField("sequence_batching"):
        return SequenceScheduler(SequencePolicy.from_config(config), instances, stats, config, gate)
    return Scheduler(BatchingPolicy.from_config(config), instances, stats, gate)


class _Sequence:
    """One live sequence: its slot, its state, and the tail of its chain of requests."""

    __slots__ = ("sequence_id", "slot", "slot_ready", "tail", "pending", "states", "last_ns", "ended")

    def __init__(self, sequence_id: SequenceId, slot_ready: asyncio.Future[int]) -> None:
        self.sequence_id = sequence_id
        self.slot: int | None = None  # instance index; None while in the backlog
        self.slot_ready = slot_ready
        self.tail: asyncio.Future[None] | None = None  # done when the last request admitted is done
        self.pending = 0  # requests admitted and not finished
        self.states: Tensors = {}
        self.last_ns = 0
        self.ended = False  # its END (or a reap) arrived: the slot goes once `pending` is 0


class _Ticket:
    """One admitted request: its sequence, flags, and the request before it in the sequence."""

    __slots__ = ("sequence", "start", "end", "previous", "done")

    def __init__(
        self, sequence: _Sequence, start: bool, end: bool, previous: asyncio.Future[None] | None,
        done: asyncio.Future[None],
    ) -> None:  # fmt: skip
        self.sequence = sequence
        self.start = start
        self.end = end
        self.previous = previous
        self.done = done


class SequenceScheduler(SubmitsByTask):
    """The sequence batcher of one model version (the `ModelScheduler` surface)."""

    def __init__(
        self,
        policy: SequencePolicy,
        instances: Sequence[ModelInstance | RequestsInstance],
        stats: ModelStats,
        config: mc.ModelConfig | None = None,
        gate: RateGate | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one model instance")
        self.policy = policy
        self._decoupled = bool(config and config.model_transaction_policy.decoupled)
        batching = policy.batching
        if self._decoupled:
            batching = dataclasses.replace(batching, decoupled=True)
        # One batcher per instance: a sequence stays on its instance, and batches form across the
        # sequences that instance holds.
        self._inner = [Scheduler(batching, [instance], stats, gate) for instance in instances]
        self._free: deque[int] = deque(i for _ in range(policy.slots_per_instance) for i in range(len(instances)))
        self._live: dict[SequenceId, _Sequence] = {}
        self._holding: set[_Sequence] = set()  # sequences holding a slot, live or draining
        self._backlog: deque[_Sequence] = deque()
        self._reaper: asyncio.TimerHandle | None = None
        self._closing = False
        # The ids an iterative sequence model gives the requests that come without one.
        self._iterative_ids = itertools.count(1)

    # -- admission ---------------------------------------------------------------------------------

    def _admit(self, inputs: Tensors, parameters: dict[str, Any] | None) -> tuple[_Ticket, dict[str, Any]]:
        """Check one request and queue it on its sequence, synchronously (so arrival order is
        sequence order); returns its ticket and the parameters the model may see."""
        params = dict(parameters or {})
        sequence_id = params.pop("sequence_id", 0)
        start = params.pop("sequence_start", False)
        end = params.pop("sequence_end", False)
        model = self.policy.model
        if (
            isinstance(sequence_id, bool)
            or not isinstance(sequence_id, (int, str))
            or (isinstance(sequence_id, int) and not 0 <= sequence_id < 1 << 64)
        ):
            raise InvalidArgument(
                f"Unable to parse 'sequence_id': it must be an unsigned 64-bit integer or a string, got "
                f"{sequence_id!r} (inference request to model '{model}')"
            )
        if isinstance(sequence_id, str) and len(sequence_id) > _MAX_ID_CHARS:
            raise Unsupported(f"string correlation ID cannot be longer than {_MAX_ID_CHARS} characters")
        for name, flag in (("sequence_start", start), ("sequence_end", end)):
            if not isinstance(flag, bool):
                raise InvalidArgument(
                    f"Unable to parse '{name}': it must be a boolean, got {flag!r} (inference request to "
                    f"model '{model}')"
                )
        if sequence_id in (0, "") and self.policy.iterative:
            sequence_id, start = next(self._iterative_ids), True
        if sequence_id in (0, ""):
            raise InvalidArgument(
                f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
            )
        check_sequence_id(self.policy, sequence_id)
        if self.policy.max_batch_size > 0 and any(a.ndim and a.shape[0] > 1 for a in inputs.values()):
            raise InvalidArgument(
                f"inference request to model '{model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        if self._closing and start:
            raise Unavailable(_STOPPING)
        sequence = self._live.get(sequence_id)
        if sequence is None and not start:
            raise InvalidArgument(
                f"inference request for sequence {sequence_id} to model '{model}' must specify the START flag "
                "on the first request of the sequence"
            )
        if sequence is None:
            sequence = self._begin(sequence_id)
        elif start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.", sequence_id, model,
            )  # fmt: skip
        sequence.last_ns = perf_counter_ns()
        if end or self.policy.iterative:
            # An iterative sequence also ends with its request (once no longer rescheduled).
            # Forget the id now: what comes after the END must START a new sequence.
            del self._live[sequence_id]
            sequence.ended = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Left on the request for a backend that shows them to the model (python: correlation_id, flags).
        params.update(sequence_id=sequence_id, sequence_start=start, sequence_end=end)
        ticket = _Ticket(sequence, start, end, sequence.tail, done)
        sequence.tail = done
        sequence.pending += 1
        self._arm_reaper()
        return ticket, params

    def _begin(self, sequence_id: SequenceId) -> _Sequence:
        sequence = _Sequence(sequence_id, asyncio.get_running_loop().create_future())
        self._live[sequence_id] = sequence
        if self._free:
            self._assign(sequence, self._free.popleft())
        else:
            self._backlog.append(sequence)
        return sequence

    def _assign(self, sequence: _Sequence, slot: int) -> None:
        sequence.slot = slot
        self._holding.add(sequence)
        sequence.slot_ready.set_result(slot)

    def _finish(self, ticket: _Ticket) -> None:
        """A request is done (answered, failed or cancelled): the next one of its sequence may run,
        and an ended sequence with nothing left gives its slot back."""
        if not ticket.done.done():
            ticket.done.set_result(None)
        sequence = ticket.sequence
        sequence.pending -= 1
        if sequence.ended and not sequence.pending:
            self._release(sequence)

    def _release(self, sequence: _Sequence) -> None:
        if sequence.slot is None:
            # Still in the backlog (a reap, or a close): nothing held.
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        if sequence not in self._holding:
            return
        self._holding.discard(sequence)
        slot, sequence.slot = sequence.slot, None
        if self._backlog:
            self._assign(self._backlog.popleft(), slot)
        else:
            self._free.append(slot)

    # -- the idle reaper ---------------------------------------------------------------------------

    def _arm_reaper(self) -> None:
        if self._reaper is None and self._live and not self._closing:
            loop = asyncio.get_running_loop()
            self._reaper = loop.call_later(self.policy.idle_ns / 1e9, self._reap)

    def _reap(self) -> None:
        """Release the slots of sequences idle past `max_sequence_idle_microseconds`: their next
        request must START again. A sequence with a request queued or running is not idle."""
        self._reaper = None
        now = perf_counter_ns()
        idle_ns = self.policy.idle_ns
        for sequence_id, sequence in list(self._live.items()):
            if sequence.pending or now - sequence.last_ns < idle_ns:
                continue
            log.info(
                "sequence %s of model '%s' idle for over %d us: releasing its slot",
                sequence_id, self.policy.model, idle_ns // 1000,
            )  # fmt: skip
            del self._live[sequence_id]
            sequence.ended = True
            self._release(sequence)
        if self._live and not self._closing:
            oldest = min(s.last_ns for s in self._live.values())
            delay = max(oldest + idle_ns - now, 1_000_000) / 1e9
            self._reaper = asyncio.get_running_loop().call_later(delay, self._reap)

    # -- running -----------------------------------------------------------------------------------

    async def _wait_turn(self, ticket: _Ticket, timeout_us: int | None) -> int:
        """Wait for the request before this one and for the sequence's slot; returns the instance.

        A request with a timeout that finds its sequence still in the backlog when it runs out
        fails the whole backlogged sequence, as Triton's reaper does."""
        if ticket.previous is not None:
            await asyncio.shield(ticket.previous)
        sequence = ticket.sequence
        ready = sequence.slot_ready
        if timeout_us and not ready.done():
            try:
                await asyncio.wait_for(asyncio.shield(ready), timeout_us / 1e6)
            except asyncio.TimeoutError:
                self._expire(sequence)
        slot = await asyncio.shield(ready)
        if self._closing and sequence.slot is None:
            raise Unavailable(_STOPPING)
        return slot

    def _expire(self, sequence: _Sequence) -> None:
        """A backlogged sequence's timeout ran out: it leaves the backlog and its requests fail."""
        if sequence.slot_ready.done():
            return  # it got a slot meanwhile
        if sequence in self._backlog:
            self._backlog.remove(sequence)
        if self._live.get(sequence.sequence_id) is sequence:
            del self._live[sequence.sequence_id]
        sequence.ended = True
        sequence.slot_ready.set_exception(Unavailable("timeout of the corresponding sequence has been expired"))

    def _inputs(self, ticket: _Ticket, inputs: Tensors) -> Tensors:
        sequence = ticket.sequence
        full = dict(inputs)
        full.update(control_tensors(self.policy, ticket.start, ticket.end, sequence.sequence_id))
        if self.policy.states:
            if ticket.start or not sequence.states:
                sequence.states = initial_states(self.policy)
            full.update(sequence.states)
        return full

    def _keep_states(self, ticket: _Ticket, outputs: Tensors, asked: Sequence[str]) -> Tensors:
        if not self.policy.states:
            return outputs
        sequence = ticket.sequence
        for state in self.policy.states:
            value = outputs.get(state.output_name)
            if value is not None:
                sequence.states[state.input_name] = value
        hidden = {s.output_name for s in self.policy.states} - set(asked)
        return {k: v for k, v in outputs.items() if k not in hidden}

    def _outputs(self, output_names: Sequence[str]) -> list[str]:
        names = list(output_names)
        if names:
            names += [s.output_name for s in self.policy.states if s.output_name not in names]
        return names

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
        """Run one request of a sequence, after the sequence's earlier ones; see the module doc."""
        received_ns = perf_counter_ns() if received_ns is None else received_ns
        ticket, params = self._admit(inputs, parameters)
        try:
            slot = await self._wait_turn(ticket, timeout_us)
            while True:
                outputs = await self._inner[slot].infer(
                    self._inputs(ticket, inputs), self._outputs(output_names), timeout_us=timeout_us,
                    received_ns=received_ns, request_id=request_id, parameters=params, secondary_stats=secondary_stats,
                )  # fmt: skip
                if not isinstance(outputs, Rescheduled):
                    return self._keep_states(ticket, outputs, output_names)
                self._again(ticket, params)
        finally:
            self._finish(ticket)

    @staticmethod
    def _again(ticket: _Ticket, params: dict[str, Any]) -> None:
        """The model released the request to run again: it goes on its slot once more, neither
        START nor END (core's IterativeSequencer::RescheduleRequest). A request that ENDs its
        sequence cannot be (core takes no such release; Triton 2.51's client then waits forever)."""
        if ticket.end:
            raise InvalidArgument(RESCHEDULE_REFUSED)
        ticket.start = ticket.end = False
        params.update(sequence_start=False, sequence_end=False)

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
        """`infer` for a stream: checked (and queued on its sequence) at once, then (outputs, final)
        per response; a decoupled model's responses as it sends them. (`secondary_stats`, a trace,
        is not recorded here: its trace has the request's start and end only.)"""
        received_ns = perf_counter_ns() if received_ns is None else received_ns
        ticket, params = self._admit(inputs, parameters)
        return self._stream(ticket, inputs, output_names, timeout_us, received_ns, request_id, params)

    async def _stream(
        self,
        ticket: _Ticket,
        inputs: Tensors,
        output_names: Sequence[str],
        timeout_us: int | None,
        received_ns: int,
        request_id: str,
        params: dict[str, Any],
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
        try:
            slot = await self._wait_turn(ticket, timeout_us)
            inner = self._inner[slot]
            names = self._outputs(output_names)
            rescheduled = True
            while rescheduled:
                rescheduled = False
                full = self._inputs(ticket, inputs)
                if not self._decoupled:
                    outputs = await inner.infer(
                        full, names, timeout_us=timeout_us, received_ns=received_ns, request_id=request_id,
                        parameters=params,
                    )  # fmt: skip
                    rescheduled = isinstance(outputs, Rescheduled)
                    outputs = self._keep_states(ticket, outputs, output_names)
                    if not rescheduled:
                        yield outputs, True
                        return
                    self._again(ticket, params)
                    continue
                stream = inner.infer_stream(
                    full, names, timeout_us=timeout_us, received_ns=received_ns, request_id=request_id,
                    parameters=params,
                )  # fmt: skip
                try:
                    async for response, final in stream:
                        if isinstance(response, Rescheduled):
                            rescheduled = True
                            break
                        if isinstance(response, dict):
                            response = self._keep_states(ticket, response, output_names)
                        yield response, final
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
                if rescheduled:
                    self._again(ticket, params)
        finally:
            self._finish(ticket)

    async def close(self, grace_s: float) -> None:
        """Refuse new sequences, let the instances' batchers drain (`Scheduler.close`), and fail the
        requests still waiting for a slot."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        await asyncio.gather(*(inner.close(grace_s) for inner in self._inner))
        for sequence in self._backlog:
            if not sequence.slot_ready.done():
                sequence.slot_ready.set_result(-1)
        self._backlog.clear()
