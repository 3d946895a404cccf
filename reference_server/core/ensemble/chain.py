"""`EnsembleScheduler.submit`'s way of running a request: its steps as a chain of callbacks.

Where an ensemble request's steps form a chain (each the only one ready when the one before it
ends), each step is submitted to its composing model's scheduler from the callback of the step
before it: no task and no loop pass per step. The client going away cancels the running step and
starts no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reference_server.core.ensemble.config import Step
from reference_server.core.ensemble.steps import StepCall, merge_outputs, step_inputs
from reference_server.errors import Cancelled
from reference_server.scheduling.cancel import CANCELLED_MESSAGE, CancelScope, watch_call
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.model_scheduler import Done
from reference_server.scheduling.stats import ModelStats

if TYPE_CHECKING:
    from reference_server.core.ensemble.scheduler import EnsembleScheduler


class SubmitChain:
    """One ensemble request run by `EnsembleScheduler.submit`: each step submitted from the
    callback of the step before it."""

    __slots__ = (
        "owner", "steps", "position", "wanted", "tensors", "call", "done", "received", "start", "secondary", "scope",
        "cancelled",
    )  # fmt: skip

    def __init__(
        self,
        owner: EnsembleScheduler,
        steps: tuple[Step, ...],
        wanted: tuple[str, ...],
        tensors: Tensors,
        call: StepCall,
        done: Done,
        received: int,
        start: int,
        secondary: ModelStats | None,
    ) -> None:
        self.owner = owner
        self.steps = steps
        self.position = 0
        self.wanted = wanted
        self.tensors = tensors
        self.call = call
        self.done = done
        self.received = received
        self.start = start
        self.secondary = secondary
        # Where the front end's client can go away (`cancel.watch_call`): the steps are queued in a
        # scope of the chain's own, which `cancel` cancels, and no step starts after it.
        self.scope: CancelScope | None = None
        self.cancelled = False

    def watch(self) -> None:
        if watch_call(SubmitChain.cancel, self):
            self.scope = CancelScope()

    def cancel(self) -> None:
        """The client went away: the running step is cancelled, and none starts after it."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    def next(self, first: bool = False) -> None:
        """Submit the next step, or answer when none is left. The `first` step's refusal raises
        (from within `submit`, as `infer` would); a later one's is the request's answer."""
        if self.cancelled:
            self._fail(Cancelled(CANCELLED_MESSAGE))
            return
        if self.position == len(self.steps):
            self._release()
            owner = self.owner
            owner._left()
            owner._succeeded(self.tensors, self.received, self.start, self.call.steps_stats, self.secondary)
            self.done({name: self.tensors[name] for name in self.wanted})
            return
        step = self.steps[self.position]
        call, tensors = self.call, self.tensors
        try:
            served = self.owner._lookup(step.model_name, step.version)
            scope = self.scope
            if scope is not None:
                scope.__enter__()
            try:
                served.scheduler.submit(
                    step_inputs(served, step, tensors),
                    [model_output for model_output, _ in step.outputs],
                    self._stepped, timeout_us=call.timeout_us, request_id=call.request_id, parameters=call.parameters,
                    secondary_stats=call.steps_stats,
                )  # fmt: skip
            finally:
                if scope is not None:
                    scope.__exit__()
        except Exception as error:  # refused before it was queued: the request fails as a step's error would
            if not first:
                self._fail(error)
                return
            owner = self.owner
            owner._left()
            owner._failed(error, self.received, self.secondary)
            raise owner._named(error) from None

    def _stepped(self, outputs: Tensors | Exception) -> None:
        if isinstance(outputs, Exception):
            self._fail(outputs)
            return
        merge_outputs(self.tensors, self.steps[self.position], outputs)
        self.position += 1
        self.next()

    def _release(self) -> None:
        # The scope holds the last step's queued request, whose callback is this chain's
        # `_stepped`: let it go, or the three would hold each other until the garbage collector
        # found them (a cycle per request).
        if self.scope is not None:
            self.scope.release()

    def _fail(self, error: Exception) -> None:
        self._release()
        owner = self.owner
        owner._left()
        owner._failed(error, self.received, self.secondary)
        named = owner._named(error)
        self.done(named if isinstance(named, Exception) else error)
