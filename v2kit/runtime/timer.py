"""Sub-millisecond timers for the event loop.

asyncio's selector rounds every timeout up to whole milliseconds (epoll_wait takes milliseconds), so
`call_later(100e-6, ...)` fires after about 1.1 ms. A dynamic batcher with max_queue_delay_microseconds
of 100 would then hold a lone request ten times longer than configured. This timer waits in one
thread on a condition variable (futex precision) and hands the callback to the loop with
call_soon_threadsafe, which wakes the selector at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable

# Shorter delays than this go to the precise thread; longer ones to the loop's own timers.
PRECISE_BELOW_NS = 2_000_000


class TimerHandle:
    __slots__ = ("_callback", "_loop_timer", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._loop_timer: asyncio.TimerHandle | None = None
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        if self._loop_timer is not None:
            self._loop_timer.cancel()

    def _run(self) -> None:
        # On the loop thread: a cancel that raced with the timer thread still wins.
        if not self.cancelled:
            self._callback()


class _PreciseTimerThread:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, asyncio.AbstractEventLoop, TimerHandle]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, when_ns: int, loop: asyncio.AbstractEventLoop, handle: TimerHandle) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when_ns, next(self._seq), loop, handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="precise-timer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][3].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                when_ns, _, loop, handle = self._heap[0]
                wait_ns = when_ns - time.perf_counter_ns()
                if wait_ns > 0:
                    self._cond.wait(wait_ns / 1e9)
                    continue
                heapq.heappop(self._heap)
                try:
                    loop.call_soon_threadsafe(handle._run)
                except RuntimeError:  # the loop was closed meanwhile
                    pass


_precise = _PreciseTimerThread()


def call_at_ns(loop: asyncio.AbstractEventLoop, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
    """Run `callback` on `loop` at `when_ns` (time.perf_counter_ns), with sub-millisecond precision."""
    handle = TimerHandle(callback)
    delay_ns = when_ns - time.perf_counter_ns()
    if delay_ns >= PRECISE_BELOW_NS:
        handle._loop_timer = loop.call_later(delay_ns / 1e9, _run_on_time, loop, when_ns, handle)
    else:
        _precise.schedule(when_ns, loop, handle)
    return handle


def _run_on_time(loop: asyncio.AbstractEventLoop, when_ns: int, handle: TimerHandle) -> None:
    # uvloop's timers count from the loop's clock as cached at the start of the iteration, so they
    # fire up to about a millisecond early: the precise thread waits out what is left.
    if time.perf_counter_ns() < when_ns:
        _precise.schedule(when_ns, loop, handle)
    else:
        handle._run()
