"""Fixtures for the unit tests that run a protocol on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Runner[Any]]:
    """Runs a coroutine to its end on a new event loop: asyncio's, and uvloop's (the one perfkit's
    commands and the server run on); a hang fails the test after 20 s, not the suite."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def run_(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(asyncio.wait_for(coro, 20))

    yield run_
