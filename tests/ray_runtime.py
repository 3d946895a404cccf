"""A local Ray runtime for the tests that need one."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from typing import Any

import psutil


@contextlib.contextmanager
def local_ray(**options: Any) -> Iterator[None]:
    """`ray.init(**options)` on this machine for the block, then shut down and reap its processes.

    Ray waits a fixed 30 s for its raylet to register and, in a long test process on a 2-core
    machine, once in a while the raylet never does. That says nothing about perfkit, so a start
    that times out is tried once more on a fresh session; a second failure is raised.
    """
    import ray  # the callers skip when it is not installed

    before = {child.pid for child in psutil.Process().children()}
    try:
        ray.init(**options)
        timed_out = False
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
        timed_out = True  # retried below, once the exception and its frames are gone
    if timed_out:
        _abandon_failed_start(before)
        ray.init(**options)
    started = [child for child in psutil.Process().children() if child.pid not in before]
    try:
        yield
    finally:
        ray.shutdown()
        # Ray's own processes can outlive its shutdown's short wait; reap them here, or their Popen
        # objects warn "still running" in whichever test collects them.
        psutil.wait_procs(started, timeout=30)


def _abandon_failed_start(before: set[int]) -> None:
    """Kill what the failed start spawned. Its Popen objects died with the exception, so they are
    collected here, where their "still running" ResourceWarnings are known and expected."""
    import ray

    ray.shutdown()
    spawned = [child for child in psutil.Process().children() if child.pid not in before]
    for process in spawned:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(spawned, timeout=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
