"""The event loop perfkit's commands run on: uvloop where it is installed (a dependency on Linux), else
asyncio's own.

uvloop's loop, transports and timers are in C: the load generator spends a third less CPU per
request on it. Ctrl-C works as with `asyncio.run`: `asyncio.Runner` turns the first SIGINT into
cancelling the main task, and KeyboardInterrupt is raised once it has unwound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run"]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop when it is importable."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
