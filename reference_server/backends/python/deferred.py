"""Non-decoupled requests that a model's execute left open: it returned None for them (or returned
None) and kept their response senders, to send the response and the final flag later, from a
thread of its own. Triton's python backend holds such a request open until then (python_be.cc
leaves its response factory alone), and so do we, answering the rest of the batch at once.

The stub names the requests it left open in its execute answer (`deferred`: their tokens); each
becomes an `execute.Deferred` in place of its outputs, fed by a stream of the stub's
(`process.StubProcess.defer`), as a decoupled request's responses are. It is answered by the
first of: its response and final flag; the client going away (`cancel`: the model's
`is_cancelled()` turns True, the client hears CANCELLED); the stub's death; the execute timeout
(`execute-timeout-seconds`, counted from execute's return; the model is told as for a
cancellation). Its inputs stay in shared memory while the model may read them: until its final
flag, its sender is dropped (the stub then ends it, `stub._end_dropped`) or the stub dies.

Requests the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (the stub's `reschedule`
list in an execute answer; `pb/release.py` is the model's side) are not answered by it either.
Only a model with `sequence_batching { iterative_sequence: true }` may reschedule, as in Triton:
its request is answered `Rescheduled` and its sequence batcher runs it again; a decoupled request's
stream stays open for the next run's responses (its inputs are written again then, so this run's
are freed now). Any other model's request fails with core's words for the refused release.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from reference_server.backends.python.process import PythonModel, StubProcess
from reference_server.errors import Cancelled, InternalError, InvalidArgument
from reference_server.scheduling.cancel import CANCELLED_MESSAGE
from reference_server.scheduling.execute import RESCHEDULE_REFUSED, BatchItem, Deferred, Rescheduled, Tensors

__all__ = ["OpenRequests", "reschedule"]


class OpenRequests:
    """One instance's requests left open by execute, until each is answered."""

    def __init__(self, model: PythonModel, instance_name: str) -> None:
        self._model = model
        self._name = instance_name
        self._open: dict[BatchItem, tuple[StubProcess, int, Deferred]] = {}
        self._lock = threading.Lock()  # settled from the loop, the reader and timer threads

    def __len__(self) -> int:
        return len(self._open)

    def hold(
        self,
        stub: StubProcess,
        batch: Sequence[BatchItem],
        tokens: Sequence[int],
        per_request: list[list[tuple[int, int]]],
        open_tokens: list[int],
        results: list[Tensors | Exception],
    ) -> None:
        """Put a Deferred in `results` for each request the stub left open (`open_tokens`), and
        free the inputs of the others."""
        later = set(open_tokens)
        for index, (request, token, blocks) in enumerate(zip(batch, tokens, per_request)):
            if token not in later:
                if request.sink is None:
                    stub.release(blocks)
                continue
            deferred = Deferred()
            results[index] = deferred
            with self._lock:
                self._open[request] = (stub, token, deferred)
            cancel_timer = self._expire_later(stub, token, deferred)
            deferred.on_settled = partial(self._settled, request, cancel_timer)
            stub.defer(token, deferred.sink, blocks, request.output_names)

    def cancel(self, request: BatchItem) -> bool:
        """The client gave `request` up: the model is told, the client hears CANCELLED. Whether it was open here."""
        with self._lock:
            held = self._open.get(request)
        if held is None:
            return False
        stub, token, deferred = held
        stub.cancel_request(token)
        deferred.settle(Cancelled(CANCELLED_MESSAGE))
        return True

    def _settled(self, request: BatchItem, cancel_timer: Callable[[], None]) -> None:
        with self._lock:
            self._open.pop(request, None)
        cancel_timer()

    def _expire_later(self, stub: StubProcess, token: int, deferred: Deferred) -> Callable[[], None]:
        """Bound the wait by the execute timeout; returns what stops the timer."""
        timeout_s = self._model.execute_timeout_s
        if timeout_s <= 0:
            return _nothing

        def expire() -> None:
            error = InternalError(
                f"Failed to process the request(s) for model '{self._name}', message: the model left the request "
                f"open when execute returned and did not send its response within {timeout_s:g} s "
                "(--backend-config=python,execute-timeout-seconds=N)"
            )
            if deferred.settle(error):
                stub.cancel_request(token)  # the model may stop working for it

        loop = stub.loop
        if loop is None:  # no server loop (the backend used on its own)
            timer = threading.Timer(timeout_s, expire)
            timer.daemon = True
            timer.start()
            return timer.cancel
        handles: list[asyncio.TimerHandle] = []

        def start() -> None:
            handles.append(loop.call_later(timeout_s, expire))

        def stop() -> None:
            for handle in handles:
                handle.cancel()

        _on_loop(loop, start)
        return lambda: _on_loop(loop, stop)


def _nothing() -> None:
    pass


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
    if _running_loop() is loop:
        call()
        return
    try:
        loop.call_soon_threadsafe(call)
    except RuntimeError:
        pass  # the loop is closed: its timers are gone with it


def iterative(model: PythonModel) -> bool:
    """Whether the model's config has `sequence_batching { iterative_sequence: true }`."""
    config = json.loads(model.config_json or "{}")
    return bool(config.get("sequence_batching", {}).get("iterative_sequence", False))


def reschedule(
    model: PythonModel,
    stub: StubProcess,
    items: Sequence[tuple[Any, ...]],
    indices: Sequence[int],
    results: list[Tensors | Exception],
) -> None:
    """Answer the batch's requests at `indices` (of `items`, the execute message's requests, the
    token first) as rescheduled, in `results`."""
    again = iterative(model)
    for i in indices:
        stub.drop_stream(items[i][0])  # a decoupled request's next run opens its stream again
        results[i] = Rescheduled() if again else InvalidArgument(RESCHEDULE_REFUSED)
