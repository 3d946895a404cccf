"""v2kit.runtime.eventloop: commands run on uvloop, Ctrl-C still unwinds them, and the precise timer the
open loop relies on keeps its promise there."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from functools import partial

import pytest

from perfkit.load.generator import RealClock
from v2kit.runtime import eventloop
from v2kit.runtime.timer import TimerHandle, call_at_ns


def test_run_returns_the_result_on_uvloop() -> None:
    async def main() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(main()).startswith("uvloop")


def test_sigint_cancels_the_main_task_then_raises_keyboard_interrupt() -> None:
    unwound: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            unwound.append("cancelled")  # the sweep records "interrupted" here and writes its results
            raise

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        eventloop.run(main())
    assert unwound == ["cancelled"]
    assert time.monotonic() - started < 10


def busy(ns: int) -> None:
    """A callback that keeps the loop for `ns`."""
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def stamp(fired: asyncio.Future[int]) -> None:
    fired.set_result(time.perf_counter_ns())


def test_timers_never_fire_early_on_uvloop() -> None:
    """uvloop's own timers count from the loop's clock cached at the start of an iteration, so a
    callback that ran for a while makes them fire early; the open loop's sends must not."""

    async def main() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        clock = RealClock()
        timer_lags, sleep_lags = [], []
        for delay_ns in (2_300_000, 2_700_000, 3_100_000) * 5:
            busy(1_000_000)  # the cached clock is now 1 ms stale
            fired: asyncio.Future[int] = loop.create_future()
            due = time.perf_counter_ns() + delay_ns
            call_at_ns(loop, due, partial(stamp, fired))
            timer_lags.append(await fired - due)
            busy(1_000_000)
            due = time.perf_counter_ns() + delay_ns
            await clock.sleep_until(due)
            sleep_lags.append(time.perf_counter_ns() - due)
        return timer_lags, sleep_lags

    timer_lags, sleep_lags = eventloop.run(main())
    assert min(timer_lags) >= 0 and min(sleep_lags) >= 0, (timer_lags, sleep_lags)


def late_timers(monkeypatch: pytest.MonkeyPatch, late_ns: int) -> None:
    """The precise timer the clock uses fires `late_ns` late, as on a VM whose idle CPUs take that
    long to wake."""
    from perfkit.load import clocks

    def late(loop: asyncio.AbstractEventLoop, when_ns: int, callback: Callable[[], None], **how: bool) -> TimerHandle:
        return call_at_ns(loop, when_ns + late_ns, callback, **how)

    monkeypatch.setattr(clocks, "call_at_ns", late)


def test_the_clock_learns_how_late_its_timer_wakes_and_ends_sleeps_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    late_ns = 1_000_000
    late_timers(monkeypatch, late_ns)

    async def main() -> tuple[list[int], int]:
        clock = RealClock()
        lags = []
        for _ in range(40):
            due = time.perf_counter_ns() + 10_000_000
            await clock.sleep_until(due)
            lags.append(time.perf_counter_ns() - due)
        return lags, clock.lead_ns

    lags, lead_ns = eventloop.run(main())
    assert lags[0] >= late_ns, lags  # nothing learned yet: the timer's whole lateness
    assert late_ns <= lead_ns <= RealClock.MAX_LEAD_NS, lead_ns
    learned = sorted(lags[-20:])
    assert learned[10] < late_ns // 2, learned


def test_the_clock_keeps_the_loop_running_while_it_waits_out_its_lead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last stretch before a deadline passes through the loop, never in a spin that holds it:
    a timer due within that stretch fires before the sleep ends."""
    late_timers(monkeypatch, 1_000_000)

    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        clock = RealClock()
        for _ in range(10):  # learn the lead
            await clock.sleep_until(time.perf_counter_ns() + 10_000_000)
        due = time.perf_counter_ns() + 20_000_000
        fired: asyncio.Future[int] = loop.create_future()
        # The real precise timer, not the late one: due halfway through the clock's lead.
        call_at_ns(loop, due - clock.lead_ns // 2, partial(stamp, fired))
        await clock.sleep_until(due)
        ended = time.perf_counter_ns()
        assert fired.done(), "the timer due during the clock's lead had not fired when the sleep ended"
        return fired.result(), ended, clock.lead_ns

    fired_ns, ended_ns, lead_ns = eventloop.run(main())
    assert lead_ns >= 500_000
    assert fired_ns < ended_ns


def test_the_clock_leads_a_short_sleep_by_a_quarter_of_it_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lead's CPU is bounded: a dense schedule (sleeps of 2 ms) passes through the loop for a
    quarter of each sleep at most, whatever the lead learned on long sleeps."""
    late_timers(monkeypatch, 1_200_000)
    from perfkit.load import clocks

    leads: list[int] = []
    real_call_at_ns = call_at_ns

    def recording(
        loop: asyncio.AbstractEventLoop, when_ns: int, callback: Callable[[], None], **how: bool
    ) -> TimerHandle:
        leads.append(deadline[0] - when_ns)
        return real_call_at_ns(loop, when_ns, callback, **how)

    deadline = [0]

    async def main() -> None:
        clock = RealClock()
        for _ in range(10):
            await clock.sleep_until(time.perf_counter_ns() + 10_000_000)
        assert clock.lead_ns >= 1_000_000
        monkeypatch.setattr(clocks, "call_at_ns", recording)
        for _ in range(10):
            began = time.perf_counter_ns()
            deadline[0] = began + 2_000_000
            await clock.sleep_until(deadline[0])

    eventloop.run(main())
    assert leads and max(leads) <= 2_000_000 // 4, leads
