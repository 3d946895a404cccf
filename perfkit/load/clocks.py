"""The load generator's clocks: the real one (`time.perf_counter_ns`, sleeps that end on time) and
virtual time for tests. Interpreted on purpose: the generator is compiled (mypyc), and tests
subclass `FakeClock`, which an interpreted class could not do to a compiled one.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from typing import Protocol

from v2kit.runtime.timer import call_at_ns

__all__ = ["Clock", "FakeClock", "RealClock"]

# The last stretch of a sleep that the precise timer waits: longer than the loop's timers can be
# late (they round up to whole milliseconds, and a CPU waking from idle adds up to about 2 ms).
_PRECISE_SPAN_NS = 5_000_000


class Clock(Protocol):
    def now_ns(self) -> int: ...

    async def sleep_until(self, t_ns: int) -> None: ...


class RealClock:
    """time.perf_counter_ns, and sleeps that end on time to well under a millisecond.

    asyncio rounds selector timeouts up to whole milliseconds (epoll_wait takes milliseconds), so
    an `asyncio.sleep` ends up to about 1 ms late: kept with it alone, an open-loop schedule at
    20 req/s sent 25-50 % of its requests more than `delay_tolerance_ms` late (median lag 0.7 ms,
    2-core VM), and the latency from the intended send carried the generator's own lag. So the
    loop's timer sleeps until 5 ms before the deadline (it can be late by 1 ms of rounding and more
    of waking) and the precise timer (a timerfd the loop watches) ends the sleep.

    A precise timer is still late by however long the CPU takes to wake from idle: on a VM whose
    idle vCPUs halt, a timerfd 50 ms out woke 0.3 ms late at the median and 0.8-1.7 ms at p90, and
    an open-loop sweep at 20 req/s sent 20-45 % of its requests over 1 ms late (with both remedies
    2-5 %, or 9-25 % while the host woke its CPUs more slowly). So the clock learns its own
    lateness (the p90 of its last 32 wakes) and wakes that much early, then spends what is left
    passing through the event loop (`asyncio.sleep(0)`: answers that arrive meanwhile are read and
    stamped at once, never held behind a spin). On a machine that wakes on time the lead is tens of
    µs; it never exceeds MAX_LEAD_NS, nor a quarter of the sleep, which bounds the CPU it costs.
    """

    # The builtin itself, not a method calling it: read twice a request, and no Python frame.
    now_ns = staticmethod(time.perf_counter_ns)

    MAX_LEAD_NS = 1_500_000
    _LAGS_KEPT = 32

    def __init__(self) -> None:
        self._lags: deque[int] = deque(maxlen=self._LAGS_KEPT)  # the latest wakes' lateness, ns
        self._lead_ns = 0

    @property
    def lead_ns(self) -> int:
        """How early the precise timer is set: the p90 of its latest wakes' lateness."""
        return self._lead_ns

    async def sleep_until(self, t_ns: int) -> None:
        began = time.perf_counter_ns()
        coarse_ns = t_ns - _PRECISE_SPAN_NS - began
        if coarse_ns > 0:
            await asyncio.sleep(coarse_ns / 1e9)
        now = time.perf_counter_ns()
        if t_ns <= now:
            await asyncio.sleep(0)
            return
        wake_ns = t_ns - min(self._lead_ns, (t_ns - began) // 4)
        if wake_ns > now:
            loop = asyncio.get_running_loop()
            woken: asyncio.Future[None] = loop.create_future()
            handle = call_at_ns(
                loop, wake_ns, lambda: None if woken.done() else woken.set_result(None), precise_only=True
            )
            try:
                await woken
            finally:
                handle.cancel()
            self._learn(time.perf_counter_ns() - wake_ns)
        # The deadline is the event waited for; the loop runs meanwhile.
        while time.perf_counter_ns() < t_ns:  # noqa: ASYNC110
            await asyncio.sleep(0)

    def _learn(self, lag_ns: int) -> None:
        self._lags.append(lag_ns)
        self._lead_ns = min(self.MAX_LEAD_NS, sorted(self._lags)[(len(self._lags) * 9) // 10])


class FakeClock:
    """Virtual time for tests: time stands still while any task can run, then jumps to the next
    sleeper's deadline. Runs are exact and instant whatever the machine is doing."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now = start_ns
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._driver: asyncio.Task[None] | None = None

    def now_ns(self) -> int:
        return self._now

    async def sleep_until(self, t_ns: int) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        if t_ns <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (t_ns, next(self._seq), future))
        await future

    async def _drive(self) -> None:
        idle_rounds = 0
        while True:
            # Let every runnable task run to its next sleep before time moves.
            for _ in range(64):
                await asyncio.sleep(0)
            while self._sleepers and self._sleepers[0][2].cancelled():
                heapq.heappop(self._sleepers)
            if not self._sleepers:
                idle_rounds += 1
                if idle_rounds > 8:
                    return
                continue
            idle_rounds = 0
            t_ns, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, t_ns)
            future.set_result(None)
