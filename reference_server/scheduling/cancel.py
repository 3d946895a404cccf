"""A unary request's client going away reaches the model, as Triton's request cancellation does
(server docs/user_guide/request_cancellation.md): a closed HTTP connection, a gRPC RST_STREAM.

The front end starts each request inside a `CancelScope` (`with scope:` around the synchronous
`start_infer`); the scheduler that queues the request (`Scheduler._submit`) adds it to
the scope it finds there (`watch`), with nothing passed through the planes and wrappers between
them. Only what is queued during that call is watched that way; what carries the request on
later is watched as a call (`watch_call`): a front-end worker's request, run in the core
(`RemotePlane` sends the core a `cancel` for it, and the core cancels the scope it ran the request
in, `plane_server.py`); the task a wrapper (sequence batcher, response cache, an ensemble other
than a chain) runs the request in, cancelled (`model_scheduler.submit_by_task`); an ensemble's
chain of steps, which stops, cancelling the step that runs (`core/ensemble/scheduler.py`). When the client leaves, the front end calls
`scope.cancel()`: a request still queued leaves the queue and is answered CANCELLED; a running one's
instance is told (`Cancellable.cancel`), so the model's `request.is_cancelled()` turns True and the
BLS requests it made for it are cancelled too.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, Protocol, runtime_checkable

from reference_server.errors import Cancelled
from reference_server.scheduling.execute import BatchItem
from reference_server.scheduling.queued import QueuedRequest, Slot

__all__ = ["CancelScope", "Cancellable", "cancel_request", "watch", "watch_call"]

#: The message of a request cancelled before it ran or while it waited on a BLS call (core's
#: CANCELLED status carries none; the client that left reads neither).
CANCELLED_MESSAGE = "Request was cancelled"


@runtime_checkable
class Cancellable(Protocol):
    """An instance that can tell a running request's model that its client went away."""

    def cancel(self, request: BatchItem) -> bool:
        """Whether `request` (a decoupled one: the request feeding its sink) runs here, and is now told."""
        ...


Withdraw = Callable[[QueuedRequest], None]


class CancelScope:
    """The requests queued for one client request; `cancel` when the client goes away."""

    __slots__ = ("_watched", "_calls", "_open", "_token")

    def __init__(self) -> None:
        self._watched: list[tuple[QueuedRequest, Withdraw, list[Slot]]] = []
        self._calls: list[tuple[Callable[[Any], object], Any]] = []  # see `watch_call`
        self._open = False
        self._token: Token[CancelScope | None] | None = None

    def __enter__(self) -> CancelScope:
        """Requests queued inside the block belong to the scope, in place of those before it (and
        only those: a callback that copied the context meanwhile finds the scope closed). A class,
        not a generator context manager: it wraps every request."""
        self._watched.clear()
        if self._calls:
            self._calls.clear()
        self._open = True
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        self._open = False

    def release(self) -> None:
        """The client has its answer: nothing left to cancel, nor to hold on to."""
        self._watched.clear()
        if self._calls:
            self._calls.clear()

    def cancel(self) -> None:
        watched, self._watched = self._watched, []
        for request, withdraw, slots in watched:
            if not request.future.done():
                cancel_request(request, withdraw, slots)
        calls, self._calls = self._calls, []
        for cancel, call_id in calls:
            cancel(call_id)


_CURRENT: ContextVar[CancelScope | None] = ContextVar("cancel_scope", default=None)


def watch(request: QueuedRequest, withdraw: Withdraw, slots: list[Slot]) -> None:
    """Add a request being queued to the front end's scope, if one is open (`Scheduler._submit`)."""
    scope = _CURRENT.get()
    if scope is not None and scope._open:
        scope._watched.append((request, withdraw, slots))


def watch_call(cancel: Callable[[Any], object], call: Any) -> bool:
    """Add what carries the front end's request on beyond this call to its scope, if one is open
    (whether one was): cancelling the scope calls `cancel(call)`. A front-end worker's request run in
    the core (`RemotePlane`), the task a wrapper runs a request in (`submit_by_task`: the sequence
    batcher, the response cache), an ensemble's chain of steps."""
    scope = _CURRENT.get()
    if scope is not None and scope._open:
        scope._calls.append((cancel, call))
        return True
    return False


def cancel_request(request: QueuedRequest, withdraw: Withdraw, slots: list[Slot]) -> None:
    """The caller gave `request` up: withdrawn while queued (a caller waiting on `done` hears
    CANCELLED, so that what it holds for the answer is let go), else its instance is told."""
    if request.queued:
        withdraw(request)
        if request.done is not None:
            request.done(Cancelled(CANCELLED_MESSAGE))
        return
    for slot in slots:
        if isinstance(slot.instance, Cancellable) and slot.instance.cancel(request):
            return
