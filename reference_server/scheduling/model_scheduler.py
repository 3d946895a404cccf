"""What the data plane and an ensemble call on a model version's scheduler, whichever it is.

`scheduler.Scheduler` (Triton's default scheduler and dynamic batcher) and the ensemble's
`core.ensemble.scheduler.EnsembleScheduler` both have this surface, and so do the wrappers around
them (response cache, reshape, sequence batcher); `ModelVersion.scheduler` holds any of them.

`submit` is `infer` for a caller that is no coroutine: the HTTP front end's requests and an
ensemble's chained steps. A scheduler that answers from a callback of its own (`Scheduler`, an
ensemble's chain of steps, the reshape) passes it through, no task and no loop pass per request;
the others run `infer` in a task (`submit_by_task`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from functools import partial
from typing import Any, Protocol

from reference_server.errors import Cancelled, ServerError, Unavailable
from reference_server.scheduling.cancel import CANCELLED_MESSAGE, watch_call
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.stats import ModelStats

__all__ = ["Done", "ModelScheduler", "submit_by_task"]

#: What `submit` calls once with a request's outputs or the error that failed it.
Done = Callable[[Tensors | Exception], None]


class ModelScheduler(Protocol):
    """A model version's scheduler: `Scheduler`, or an ensemble's. `secondary_stats` also counts the
    request (Triton's secondary stats aggregator): an ensemble sums its steps' compute times in it.

    `infer_stream` yields (outputs, final) per response: a `ServerError` in place of the outputs is
    an error response the model sent (the stream goes on), None a final flag sent on its own."""

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
    ) -> Tensors: ...

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
        """`infer` with a callback: may raise what `infer` raises before the request is queued;
        after that `done` gets the outputs or the error, once, on the loop, never from within
        `submit` itself. `done` must not raise; the request cannot be withdrawn."""

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
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]: ...

    async def close(self, grace_s: float) -> None: ...


class SubmitsByTask:
    """`submit` for a scheduler whose requests await (the response cache, the sequence batcher):
    its `infer` runs in a task, whose end calls `done`."""

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
        raise NotImplementedError

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
        submit_by_task(
            self.infer(
                inputs, output_names, timeout_us=timeout_us, received_ns=received_ns, request_id=request_id,
                parameters=parameters, secondary_stats=secondary_stats,
            ),
            done,
        )  # fmt: skip


def submit_by_task(infer: Coroutine[Any, Any, Tensors], done: Done) -> None:
    """`submit` for a scheduler whose requests await: `infer` (the request's `infer(...)`) runs in a
    task, whose end calls `done`. The task is cancelled when the front end's client goes away
    (`cancel.watch_call`: its request is withdrawn or its model told) and answers Cancelled; a
    task cancelled otherwise (the server stopping) answers Unavailable."""
    task = asyncio.ensure_future(infer)
    task.add_done_callback(partial(_task_done, done))
    watch_call(_client_gone, task)


def _client_gone(task: asyncio.Task[Tensors]) -> None:
    task.cancel(CANCELLED_MESSAGE)


def _task_done(done: Done, task: asyncio.Task[Tensors]) -> None:
    if task.cancelled():
        try:
            task.result()
        except asyncio.CancelledError as cancelled:
            if cancelled.args == (CANCELLED_MESSAGE,):
                done(Cancelled(CANCELLED_MESSAGE))
                return
        done(Unavailable("Server is stopping: request was cancelled"))
        return
    error = task.exception()
    if error is None:
        done(task.result())
    elif isinstance(error, Exception):
        done(error)
    else:
        raise error
