"""A front-end worker that dies is started again as a supervisor does: at once (0.1 s), then after
delays that double with each death in a short window, and never again once it dies in a loop."""

from __future__ import annotations

from reference_server.workers.process import (
    CRASH_LOOP_DEATHS,
    CRASH_LOOP_WINDOW_S,
    RESTART_DELAY_MAX_S,
    RESTART_DELAY_S,
    Restarts,
)


def test_a_worker_that_dies_right_after_its_start_is_started_again() -> None:
    # The first death, however soon after the start, is a restart after the shortest delay.
    assert Restarts().delay_after_death(now=0.5) == RESTART_DELAY_S


def test_deaths_close_together_double_the_delay_then_stop_the_restarts() -> None:
    restarts = Restarts()
    delays = [restarts.delay_after_death(now=float(t)) for t in range(CRASH_LOOP_DEATHS)]
    assert delays[:-1] == [min(RESTART_DELAY_S * 2**n, RESTART_DELAY_MAX_S) for n in range(CRASH_LOOP_DEATHS - 1)]
    assert delays[-1] is None  # a crash loop: not started again


def test_deaths_far_apart_are_each_a_first_death() -> None:
    restarts = Restarts()
    delays = [restarts.delay_after_death(now=n * CRASH_LOOP_WINDOW_S) for n in range(2 * CRASH_LOOP_DEATHS)]
    assert delays == [RESTART_DELAY_S] * (2 * CRASH_LOOP_DEATHS)
