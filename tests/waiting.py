"""Waiting in a test for a state to come about, not for a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Wait until `condition()` holds (checked every 5 ms), or fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.005)
