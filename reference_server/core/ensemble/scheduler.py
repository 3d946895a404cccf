"""Triton's ensemble scheduler: one request through a graph of composing models.

An ensemble version's `scheduler` is an `EnsembleScheduler` (the `ModelScheduler` surface of
`scheduling/scheduler.py`), so the data plane serves it like any model. A request:

- *Prunes* the steps that no requested output depends on, as Triton's `EnsembleContext` does (an
  empty request for outputs asks for all of them).
- *Runs each step when all its inputs exist*, through the composing model's own scheduler
  (`ModelRepository.get(...).scheduler.infer`), so a composing model's dynamic batcher gathers the
  steps of concurrent ensemble requests, and its queue policy and statistics apply. Steps whose
  inputs are ready together run concurrently; a lone ready step is awaited directly (no task).
  `submit` (the HTTP front end's way in) runs a request whose steps form a chain, each the only
  one ready when the one before it ends, as a chain of the composing schedulers' `submit`
  callbacks (`chain.SubmitChain`): no task and no loop pass per step; any other graph runs `infer` in a task.
  The composing model is looked up per request, as Triton takes its model handles per request: a
  reload is seen at once, and an unloaded composing model fails the request as UNAVAILABLE.
- *Passes tensors as they are*: a step's output arrays (views of its batch's outputs) become the
  next step's inputs without a copy. The request's timeout, id and parameters go to every step.
  A python step may answer with another datatype than its config says (as on Triton): a step
  input whose datatype is not the composing model's fails the request in Triton's words.
- *Fails with the first failing step's error*, its message prefixed with "in ensemble 'NAME', " as
  Triton's; the steps still running are cancelled.
- *Streams with a decoupled step* (`infer_stream`): each response of the decoupled step starts a
  pass over the steps after it, on its own copy of the tensors, and each pass answers once. The
  final flag rides on the response that leaves nothing in flight, else comes alone, as Triton's
  `EnsembleContext` sends it. Load refuses a step whose inputs come from two decoupled steps'
  responses (Triton's check), so a pass never mixes them.

Statistics as Triton keeps them (core `ensemble_scheduler.cc`, `RequestTracker`): each request
passes a per-request `ModelStats` to its steps as their secondary statistics, and the ensemble
records the request's time in the server, a queue time (receipt to start), and as its compute
times the sum of its steps' compute times; one execution per request, of the request's batch
size. Composing models record their own requests as usual, so the statistics extension lists the
ensemble beside each composing model, and perf_analyzer's composing-model breakdown reads them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from time import perf_counter_ns
from typing import Any

from reference_server.core.ensemble.chain import SubmitChain
from reference_server.core.ensemble.config import EnsemblePlan, Step
from reference_server.core.ensemble.steps import Composing, StepCall, merge_next, merge_outputs, step_inputs
from reference_server.errors import InvalidArgument, ServerError, Unavailable
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.model_scheduler import Done, submit_by_task
from reference_server.scheduling.stats import ModelStats

__all__ = ["Composing", "EnsembleScheduler"]

#: How many distinct sets of requested outputs keep their pruned step lists.
_PRUNED_CACHE = 64


class EnsembleScheduler:
    """Run ensemble requests step by step on the composing models' schedulers."""

    def __init__(
        self,
        plan: EnsemblePlan,
        max_batch_size: int,
        stats: ModelStats,
        lookup: Callable[[str, str], Composing],
        decoupled: frozenset[str] = frozenset(),
    ) -> None:
        self._plan = plan
        #: The composing models that are decoupled: their steps stream, and the steps after them
        #: run once per response.
        self._decoupled = decoupled
        self._batching = max_batch_size > 0
        self._stats = stats
        self._lookup = lookup
        self._pruned: dict[tuple[str, ...], tuple[Step, ...]] = {}
        # (requested outputs, request's input names) -> the steps as a chain, or None (see submit).
        self._chains: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Step, ...] | None] = {}
        self._closing = False
        self._inflight = 0
        self._drained: asyncio.Event | None = None

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
        """Run one ensemble request; returns the requested outputs (all of them when none are named)."""
        self._admit()
        start = perf_counter_ns()
        received = start if received_ns is None else received_ns
        wanted = tuple(output_names) or self._plan.outputs
        steps_stats = ModelStats()
        self._inflight += 1
        try:
            call = StepCall(timeout_us, request_id, parameters, steps_stats)
            tensors = await self._run(dict(inputs), self._steps_for(wanted), call)
        except BaseException as error:
            self._failed(error, received, secondary_stats)
            raise self._named(error) from None
        finally:
            self._left()
        self._succeeded(inputs, received, start, steps_stats, secondary_stats)
        return {name: tensors[name] for name in wanted}

    def submit(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        done: Done,
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> None:
        """`infer` with a callback (`ModelScheduler.submit`): a chain of steps by callbacks, any
        other graph in a task."""
        wanted = tuple(output_names) or self._plan.outputs
        chain = None if self._decoupled else self._chain_for(wanted, inputs)
        if chain is None:
            submit_by_task(
                self.infer(
                    inputs, output_names, timeout_us=timeout_us, received_ns=received_ns, request_id=request_id,
                    parameters=parameters, secondary_stats=secondary_stats,
                ),
                done,
            )  # fmt: skip
            return
        self._admit()
        start = perf_counter_ns()
        call = StepCall(timeout_us, request_id, parameters, ModelStats())
        self._inflight += 1
        running = SubmitChain(self, chain, wanted, dict(inputs), call, done, start if received_ns is None else received_ns,
                         start, secondary_stats)  # fmt: skip
        running.watch()
        running.next(first=True)

    def _chain_for(self, wanted: tuple[str, ...], inputs: Tensors) -> tuple[Step, ...] | None:
        """The steps for `wanted` in the order they run, when each is the only one ready after the
        one before it (given the tensors the request carries); None for any other graph."""
        key = (wanted, tuple(inputs))
        if key in self._chains:
            return self._chains[key]
        available = set(inputs)
        waiting = list(self._steps_for(wanted))
        order: list[Step] | None = []
        while waiting and order is not None:
            ready = [s for s in waiting if all(tensor in available for _, tensor in s.inputs)]
            if len(ready) != 1:
                order = None  # steps to run together, or one that would starve: `infer` handles both
                break
            order.append(ready[0])
            waiting.remove(ready[0])
            available.update(tensor for _, tensor in ready[0].outputs)
        chain = None if order is None else tuple(order)
        if len(self._chains) < _PRUNED_CACHE:
            self._chains[key] = chain
        return chain

    def _admit(self) -> None:
        if self._closing:
            raise Unavailable(f"Server is stopping, ensemble '{self._plan.name}' has stopped accepting new requests")

    def _left(self) -> None:
        self._inflight -= 1
        if self._drained is not None and not self._inflight:
            self._drained.set()

    def _named(self, error: BaseException) -> BaseException:
        """A step's error as Triton's ensemble reports it: "in ensemble 'NAME', " and its message."""
        if isinstance(error, ServerError) and not error.message.startswith("in ensemble '"):
            named = type(error)(f"in ensemble '{self._plan.name}', {error.message}")
            named.__cause__ = error
            return named
        return error

    def _failed(self, error: BaseException, received: int, secondary_stats: ModelStats | None) -> None:
        reason = "CANCELED" if isinstance(error, asyncio.CancelledError) else "OTHER"
        self._record_failure(perf_counter_ns() - received, reason, secondary_stats)

    def _succeeded(
        self, inputs: Tensors, received: int, start: int, steps_stats: ModelStats, secondary_stats: ModelStats | None
    ) -> None:
        done = perf_counter_ns()
        times = (
            done - received,
            start - received,
            steps_stats.compute_input_ns_total,
            steps_stats.compute_infer_ns_total,
            steps_stats.compute_output_ns_total,
        )
        self._stats.record_success(*times)
        self._stats.record_execution(self._batch_size(inputs), *times[2:])
        if secondary_stats is not None:
            secondary_stats.record_success(*times)

    async def infer_stream(
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
        """The ensemble's responses. Without a decoupled step: one, final. With one: a response per
        completed pass through the steps after it, each pass started by one of its responses, as
        Triton's ensemble does; the last carries the final flag when nothing is left in flight
        then, else the flag comes alone (also when the decoupled step sent no response). The first
        error ends the stream, raised from the iteration after the responses already completed."""
        if not self._decoupled:
            outputs = await self.infer(
                inputs,
                output_names,
                timeout_us=timeout_us,
                received_ns=received_ns,
                request_id=request_id,
                parameters=parameters,
                secondary_stats=secondary_stats,
            )
            yield outputs, True
            return
        self._admit()
        start = perf_counter_ns()
        received = start if received_ns is None else received_ns
        wanted = tuple(output_names) or self._plan.outputs
        steps_stats = ModelStats()
        fanout = _Fanout(wanted)
        self._inflight += 1
        try:
            call = StepCall(timeout_us, request_id, parameters, steps_stats)
            fanout.live = 1
            root = asyncio.ensure_future(self._branch(dict(inputs), list(self._steps_for(wanted)), call, fanout))
            try:
                while True:
                    if fanout.ready.empty():
                        if root.done():
                            root.result()  # raises the error that ended the request
                            break  # unreachable: a finished request has put its final flag
                        get = asyncio.ensure_future(fanout.ready.get())
                        try:
                            await asyncio.wait((get, root), return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            if not get.done():
                                get.cancel()
                        if not get.done() or get.cancelled():
                            continue
                        response, final = get.result()
                    else:
                        response, final = fanout.ready.get_nowait()
                    yield response, final
                    if final:
                        break
            finally:
                # Closed early (the client went away) or failed: the passes still running end too.
                root.cancel()
                await asyncio.gather(root, return_exceptions=True)
        except BaseException as error:
            self._failed(error, received, None)
            raise self._named(error) from None
        finally:
            self._left()
        self._succeeded(inputs, received, start, steps_stats, None)

    async def close(self, grace_s: float) -> None:
        """Refuse new requests and give those in flight up to `grace_s` to finish.

        Their steps run on the composing models' schedulers, which close on their own.
        """
        self._closing = True
        if self._inflight and grace_s > 0:
            self._drained = asyncio.Event()
            try:
                await asyncio.wait_for(self._drained.wait(), grace_s)
            except asyncio.TimeoutError:
                pass

    # -- one request -------------------------------------------------------------------------------

    def _steps_for(self, wanted: tuple[str, ...]) -> tuple[Step, ...]:
        steps = self._pruned.get(wanted)
        if steps is None:
            steps = self._plan.needed_steps(wanted)
            if len(self._pruned) < _PRUNED_CACHE:
                self._pruned[wanted] = steps
        return steps

    async def _run(self, tensors: Tensors, steps: tuple[Step, ...], call: StepCall) -> Tensors:
        waiting = list(steps)
        running: set[asyncio.Future[tuple[Step, Tensors]]] = set()
        try:
            while True:
                ready = [s for s in waiting if all(tensor in tensors for _, tensor in s.inputs)]
                if ready:
                    waiting = [s for s in waiting if s not in ready]
                if len(ready) == 1 and not running:
                    # The common chain: no task, no wait set.
                    step = ready[0]
                    merge_outputs(tensors, step, await self._step(step, tensors, call))
                    continue
                for step in ready:
                    running.add(asyncio.ensure_future(self._step_task(step, tensors, call)))
                if not running:
                    if waiting:
                        raise self._starved(waiting, tensors)
                    return tensors
                running = await merge_next(running, tensors)
        finally:
            for task in running:
                task.cancel()

    async def _branch(self, tensors: Tensors, waiting: list[Step], call: StepCall, fanout: _Fanout) -> None:
        """`_run` for an ensemble with a decoupled step: when that step is ready, the steps still
        waiting run on in one branch per response it sends (`_fan_out`); a finished branch puts its
        outputs on `fanout`. A branch counts in `fanout.live` until it finishes or hands over."""
        running: set[asyncio.Future[tuple[Step, Tensors]]] = set()
        try:
            while True:
                ready = [s for s in waiting if all(tensor in tensors for _, tensor in s.inputs)]
                waiting = [s for s in waiting if s not in ready]
                streaming = [s for s in ready if s.model_name in self._decoupled]
                if streaming:
                    # Each response starts a pass over the steps left, from the same tensors: the
                    # steps in flight finish first, and the other ready steps run in every pass.
                    waiting.extend(s for s in ready if s is not streaming[0])
                    if running:
                        for step, outputs in await asyncio.gather(*running):
                            merge_outputs(tensors, step, outputs)
                        running.clear()
                    await self._fan_out(streaming[0], tensors, waiting, call, fanout)
                    return
                for step in ready:
                    running.add(asyncio.ensure_future(self._step_task(step, tensors, call)))
                if not running:
                    if waiting:
                        raise self._starved(waiting, tensors)
                    fanout.done({name: tensors[name] for name in fanout.wanted})
                    return
                running = await merge_next(running, tensors)
        finally:
            for task in running:
                task.cancel()

    def _starved(self, waiting: list[Step], tensors: Tensors) -> InvalidArgument:
        """The error for steps that can never run: only an optional ensemble input left out of the
        request can starve a step (the load-time checks rule out every other cause)."""
        missing = sorted({t for s in waiting for _, t in s.inputs if t not in tensors})
        return InvalidArgument(
            f"ensemble '{self._plan.name}': {waiting[0].label} needs tensor(s) {missing}, "
            "which the request does not carry"
        )

    async def _fan_out(
        self, step: Step, tensors: Tensors, waiting: list[Step], call: StepCall, fanout: _Fanout
    ) -> None:
        """Run decoupled `step`; each of its responses starts a branch over `waiting`."""
        served = self._lookup(step.model_name, step.version)
        stream = served.scheduler.infer_stream(
            step_inputs(served, step, tensors),
            [model_output for model_output, _ in step.outputs],
            timeout_us=call.timeout_us,
            request_id=call.request_id,
            parameters=call.parameters,
        )
        branches: set[asyncio.Future[None]] = set()
        try:
            async for outputs, _final in stream:
                if isinstance(outputs, ServerError):
                    raise outputs  # Triton's ensemble ends the request at a step's first error
                failed = [b.exception() for b in branches if b.done() and b.exception() is not None]
                if failed:
                    raise failed[0]  # type: ignore[misc]  # an Exception: branches are not cancelled but by us
                if outputs is None:
                    continue
                branch_tensors = dict(tensors)
                merge_outputs(branch_tensors, step, outputs)
                fanout.live += 1
                branches.add(asyncio.ensure_future(self._branch(branch_tensors, list(waiting), call, fanout)))
            # The step's stream is over: this branch hands over to those it started.
            fanout.left()
            if branches:
                await asyncio.gather(*branches)
        finally:
            for branch in branches:
                branch.cancel()
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _step(self, step: Step, tensors: Tensors, call: StepCall) -> Tensors:
        served = self._lookup(step.model_name, step.version)
        outputs = [model_output for model_output, _ in step.outputs]
        return await served.scheduler.infer(
            step_inputs(served, step, tensors),
            outputs,
            timeout_us=call.timeout_us,
            request_id=call.request_id,
            parameters=call.parameters,
            secondary_stats=call.steps_stats,
        )

    async def _step_task(self, step: Step, tensors: Tensors, call: StepCall) -> tuple[Step, Tensors]:
        return step, await self._step(step, tensors, call)

    def _batch_size(self, inputs: Tensors) -> int:
        if self._batching:
            for array in inputs.values():
                return int(array.shape[0]) if array.ndim else 1
        return 1

    def _record_failure(self, request_ns: int, reason: str, secondary_stats: ModelStats | None) -> None:
        self._stats.record_failure(request_ns, reason)
        if secondary_stats is not None:
            secondary_stats.record_failure(request_ns, reason)


class _Fanout:
    """The responses of one streaming ensemble request, and how many branches are still live (a
    branch running steps, or the stream of the decoupled step it handed over to)."""

    __slots__ = ("wanted", "live", "ready")

    def __init__(self, wanted: tuple[str, ...]) -> None:
        self.wanted = wanted
        self.live = 0
        self.ready: asyncio.Queue[tuple[Tensors | None, bool]] = asyncio.Queue()

    def done(self, outputs: Tensors) -> None:
        """A branch finished with `outputs`: final when no other branch is live (Triton's rule)."""
        self.live -= 1
        self.ready.put_nowait((outputs, self.live == 0))

    def left(self) -> None:
        """A branch ended without outputs: the final flag alone when it was the last."""
        self.live -= 1
        if self.live == 0:
            self.ready.put_nowait((None, True))
