"""A front-end worker that dies is started again as a supervisor does: at once (0.1 s), then after
delays that double with each death in a short window, and never again once it dies in a loop; what
it left in /dev/shm is removed."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from reference_server.config import ServerConfig
from reference_server.errors import ServerError
from reference_server.workers import local_models, process
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


class _DeadWorker:
    """What `_watch` sees of a worker process that has exited (killed: -9)."""

    returncode = -9
    pid = 5_000_000  # above the largest pid_max (2**22): no process's

    class stdout:  # named as asyncio's Process names it
        @staticmethod
        async def read() -> bytes:
            return b""

    async def wait(self) -> int:
        return self.returncode


async def test_a_worker_that_cannot_start_again_is_given_up_as_a_crash_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process, "RESTART_DELAY_S", 0.001)
    workers = process.FrontendWorkers(ServerConfig(model_repository=tmp_path, frontend_workers=2), "unused")
    starts: list[int] = []

    async def fail_to_start(index: int) -> None:
        starts.append(index)
        raise ServerError(f"front-end worker {index} did not start (exit code 1; its error is above)")

    monkeypatch.setattr(workers, "_start", fail_to_start)
    with caplog.at_level(logging.ERROR, logger=process.__name__):
        await asyncio.wait_for(workers._watch(1, _DeadWorker()), 10)  # type: ignore[arg-type]
    # The death, then each start that failed, counts: the fifth death is the crash loop.
    assert starts == [1] * (CRASH_LOOP_DEATHS - 1) and workers.restarts == CRASH_LOOP_DEATHS - 1
    assert caplog.messages[0] == "front-end worker 1 exited with -9; starting it again in 0.0 s"
    assert caplog.messages[-1] == (
        f"front-end worker 1 did not start, its {CRASH_LOOP_DEATHS} exits within {CRASH_LOOP_WINDOW_S:.0f} s: a "
        "crash loop; not starting it again (the other workers serve on; restart the server once the cause is fixed)"
    )


async def test_the_statistics_files_a_dead_worker_left_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker killed between making a model's statistics file and the core mapping (and so
    # unlinking) it leaves the file behind: the core removes it once it sees the worker end.
    monkeypatch.setattr(local_models, "COUNTERS_DIR", tmp_path)
    dead = _DeadWorker()
    left = tmp_path / f"reference-server-stats-{dead.pid}-1"
    left.write_bytes(b"\0" * 64)
    other = tmp_path / f"reference-server-stats-{dead.pid}1-1"  # another worker's
    other.write_bytes(b"\0" * 64)
    workers = process.FrontendWorkers(ServerConfig(model_repository=tmp_path, frontend_workers=2), "unused")
    workers._stopping = True  # the server stops: the worker is not started again
    await asyncio.wait_for(workers._watch(0, dead), 10)  # type: ignore[arg-type]
    assert not left.exists() and other.exists()
