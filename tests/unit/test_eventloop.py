"""v2kit.runtime.eventloop: commands run on uvloop, Ctrl-C still unwinds them, and the precise timer the
open loop relies on keeps its promise there."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from functools import partial

import pytest

from perfkit.load.generator import RealClock
from v2kit.runtime import eventloop
from v2kit.runtime.timer import call_at_ns


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
