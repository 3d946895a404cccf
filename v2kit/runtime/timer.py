"""Sub-millisecond timers for the event loop.

asyncio's selector rounds every timeout up to whole milliseconds (epoll_wait takes milliseconds), so
`call_later(100e-6, ...)` fires after about 1.1 ms. A dynamic batcher with max_queue_delay_microseconds
of 100 would then hold a lone request ten times longer than configured. On Linux, a timer set from
the loop's own thread goes into a `timerfd` that the loop watches (one per loop, set to the
earliest deadline, nanosecond precision): the loop wakes once, with no thread in between. Elsewhere
(no timerfd, or a timer set from another thread) one thread waits on a condition variable (futex
precision) and hands the callback to the loop with call_soon_threadsafe, which wakes the selector
at once; that costs two thread wake-ups and a GIL hand-off per timer, several times the timerfd's
cost on a small machine.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import struct
import sys
import threading
import time
import weakref
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


class _TimerFd:
    """One loop's timerfd: a heap of deadlines, the fd set to the earliest. Loop thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        # No reference to the loop (it holds us, through its reader): the fd closes when it goes.
        self._fd = fd
        self._heap: list[tuple[int, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._armed_ns = 0  # what the fd is set to; 0 = disarmed
        loop.add_reader(fd, self._fire)
        weakref.finalize(loop, os.close, fd)

    def schedule(self, when_ns: int, handle: TimerHandle) -> None:
        heapq.heappush(self._heap, (when_ns, next(self._seq), handle))
        if not self._armed_ns or when_ns < self._armed_ns:
            self._set(when_ns)

    def _set(self, when_ns: int) -> None:
        self._armed_ns = when_ns
        # perf_counter_ns is CLOCK_MONOTONIC on Linux, which the fd counts on; 1 ns, not 0 (disarms).
        spec = _ITIMERSPEC(0, 0, max(when_ns, 1) // 1_000_000_000, max(when_ns, 1) % 1_000_000_000)
        assert _libc is not None  # no _TimerFd without it
        if _libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            pass
        self._armed_ns = 0
        heap = self._heap
        now = time.perf_counter_ns()
        try:
            while heap and (heap[0][2].cancelled or heap[0][0] <= now):
                _, _, handle = heapq.heappop(heap)
                handle._run()
        finally:  # a callback that raised (the loop logs it) must not strand the timers after it
            if heap and (not self._armed_ns or heap[0][0] < self._armed_ns):
                self._set(heap[0][0])


class _ITIMERSPEC(ctypes.Structure):
    _fields_ = [("interval_s", ctypes.c_long), ("interval_ns", ctypes.c_long), ("value_s", ctypes.c_long),
                ("value_ns", ctypes.c_long)]  # fmt: skip


_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK, TFD_CLOEXEC
_libc: ctypes.CDLL | None = None
if sys.platform == "linux" and struct.calcsize("P") == 8:
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        _libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    except (OSError, AttributeError):
        _libc = None
# One timerfd per loop; False where the loop cannot have one (it has no add_reader, or no fd was made).
_timerfds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TimerFd | bool] = weakref.WeakKeyDictionary()


def _timerfd_of(loop: asyncio.AbstractEventLoop) -> _TimerFd | None:
    found: _TimerFd | bool | None = _timerfds.get(loop)
    if found is None:
        found = False
        if _libc is not None:
            fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_FLAGS)
            if fd >= 0:
                try:
                    found = _TimerFd(loop, fd)
                except (NotImplementedError, RuntimeError, OSError):
                    os.close(fd)
        _timerfds[loop] = found
    return found if isinstance(found, _TimerFd) else None


def _on_own_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def call_at_ns(
    loop: asyncio.AbstractEventLoop, when_ns: int, callback: Callable[[], None], *, precise_only: bool = False
) -> TimerHandle:
    """Run `callback` on `loop` at `when_ns` (time.perf_counter_ns), with sub-millisecond precision.
    `precise_only`: set the precise timer however far the deadline is (the loop's own timers are
    cheaper for long delays, but may wake the loop a millisecond or more after the CPU could)."""
    handle = TimerHandle(callback)
    delay_ns = when_ns - time.perf_counter_ns()
    if delay_ns >= PRECISE_BELOW_NS and not precise_only:
        handle._loop_timer = loop.call_later(delay_ns / 1e9, _run_on_time, loop, when_ns, handle)
    elif _libc is not None and _on_own_thread(loop) and (timerfd := _timerfd_of(loop)) is not None:
        timerfd.schedule(when_ns, handle)
    else:
        _precise.schedule(when_ns, loop, handle)
    return handle


def _run_on_time(loop: asyncio.AbstractEventLoop, when_ns: int, handle: TimerHandle) -> None:
    # uvloop's timers count from the loop's clock as cached at the start of the iteration, so they
    # fire up to about a millisecond early: the precise thread waits out what is left.
    if time.perf_counter_ns() < when_ns:
        timerfd = _timerfd_of(loop) if _libc is not None else None
        if timerfd is not None:
            timerfd.schedule(when_ns, handle)
        else:
            _precise.schedule(when_ns, loop, handle)
    else:
        handle._run()
