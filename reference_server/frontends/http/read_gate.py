"""Backpressure for the HTTP front end: stop reading new requests while too many are in flight.

An open-loop client above the server's capacity sends faster than the event loop can answer. If
the loop reads every request it is sent, it spends its time parsing and refusing them (HTTP 503
past `--max-inflight-requests`), each refusal costs about as much as serving a small model, and
goodput collapses: a receive livelock (measured: 85 answers/s under 8000 requests/s on the demo
identity, whose capacity is about 7500/s). `ReadGate` makes the kernel hold the overload instead.

Theory of operation. The gate closes when `high` inference requests are in flight: it pauses
reading on every HTTP connection that has no request in progress, on every new connection, and on
each connection whose request ends while it is closed. Paused connections queue, oldest first, and
their requests wait unread in the socket buffers. Once in flight has fallen to `high // 2`, every
change in the count resumes queued connections, oldest first, as far as there is room: `high`
minus what is in flight minus the connections resumed in the last `RESUMED_GRACE_S` whose request
has not arrived yet (each connection carries one request at a time; one that stays quiet longer
was idle, and stops holding room). So a thousand waiting connections never flood the loop at once,
and a connection served while others wait goes to the back of the queue. The gate opens when the
queue is empty and in flight is at most `high // 2`.

A connection whose request is being served is never paused: its request may still be reading its
body, and pausing it would hold up the very work that reopens the gate. Requests on a paused
connection wait whatever they are, health probes included, for about the time it takes to serve
the requests ahead of them. The client sees latency instead of errors.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["RESUMED_GRACE_S", "ReadGate"]

#: How long a resumed connection's request is expected, and counted, before it arrives.
RESUMED_GRACE_S = 0.05


class ReadGate:
    """Meters which HTTP connections are read while the server is full; owned by the event loop."""

    def __init__(self, high: int) -> None:
        if high < 2:
            raise ValueError(f"the read gate needs a high-water mark of at least 2, got {high}")
        self.high = high
        self.low = high // 2
        self.closed = False
        self.closings = 0  # how many times the gate has closed
        self._inflight = 0
        self._connections: dict[Any, None] = {}  # transports of open HTTP connections, oldest first
        self._serving: dict[Any, int] = {}  # transports with requests in progress, and how many
        self._queue: dict[Any, None] = {}  # paused transports, oldest first
        self._resumed: dict[Any, float] = {}  # taken off the queue, when; their request has not arrived yet

    # -- connections

    def connection_made(self, transport: Any) -> None:
        self._connections[transport] = None
        if self.closed:
            self._pause(transport)

    def connection_lost(self, transport: Any) -> None:
        self._connections.pop(transport, None)
        self._queue.pop(transport, None)
        self._resumed.pop(transport, None)
        self._serving.pop(transport, None)
        if self.closed:
            self._resume_some()

    @property
    def waiting(self) -> int:
        """Connections paused by the gate."""
        return len(self._queue)

    # -- requests (the infer route)

    @contextlib.contextmanager
    def serving(self, transport: Any) -> Iterator[None]:
        """The block serves a request read from `transport`: keep reading it until the block ends."""
        self.begin_serving(transport)
        try:
            yield
        finally:
            self.end_serving(transport)

    def begin_serving(self, transport: Any) -> None:
        """A request read from `transport` is admitted: keep reading it until `end_serving`."""
        if transport is None:  # the connection is already gone
            return
        self._serving[transport] = self._serving.get(transport, 0) + 1
        self._resumed.pop(transport, None)
        if self._queue.pop(transport, False) is None:  # read just before the gate paused it
            _resume(transport)

    def end_serving(self, transport: Any) -> None:
        if transport is None:
            return
        count = self._serving.pop(transport, 0) - 1
        if count > 0:
            self._serving[transport] = count
        elif self.closed and transport in self._connections:
            self._pause(transport)

    def inflight_changed(self, inflight: int) -> None:
        """Called by the data plane whenever its in-flight count changes."""
        self._inflight = inflight
        if not self.closed:
            if inflight >= self.high:
                self.closed = True
                self.closings += 1
                for transport in self._connections:
                    if transport not in self._serving:
                        self._pause(transport)
        elif inflight <= self.low:
            self._resume_some()

    def _resume_some(self) -> None:
        if self._inflight > self.low:
            return
        now = time.monotonic()
        resumed = self._resumed
        while resumed and now - next(iter(resumed.values())) > RESUMED_GRACE_S:
            del resumed[next(iter(resumed))]  # quiet since: idle, not on its way
        room = self.high - self._inflight - len(resumed)
        queue = self._queue
        while room > 0 and queue:
            transport = next(iter(queue))
            del queue[transport]
            resumed[transport] = now
            _resume(transport)
            room -= 1
        if not queue:
            self.closed = False
            self._resumed.clear()

    def _pause(self, transport: Any) -> None:
        if transport in self._queue:
            return
        with contextlib.suppress(RuntimeError, AttributeError):  # closing under us
            transport.pause_reading()
            self._queue[transport] = None


def _resume(transport: Any) -> None:
    with contextlib.suppress(RuntimeError, AttributeError):
        transport.resume_reading()
