"""A front-end worker that dies is started again as a supervisor does: at once (0.1 s), then after
delays that double with each death in a short window, and never again once it dies in a loop; what
it left in /dev/shm is removed. A worker that would run other code than its core's (the package was
upgraded while the server ran) says so once and is not started again."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import pickle
from pathlib import Path

import pytest

from reference_server.config import ServerConfig
from reference_server.errors import ServerError
from reference_server.workers import local_models, process
from reference_server.workers.process import (
    CODE_CHANGED_EXIT,
    CRASH_LOOP_DEATHS,
    CRASH_LOOP_WINDOW_S,
    RESTART_DELAY_MAX_S,
    RESTART_DELAY_S,
    CodeChanged,
    Restarts,
    code_changed_text,
    code_changes,
    code_files,
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


def test_the_code_files_are_both_packages_sources_by_content() -> None:
    files = code_files()
    assert {"reference_server/workers/process.py", "v2kit/codec.py", "reference_server/__init__.py"} <= files.keys()
    assert not any("__pycache__" in path for path in files)
    assert code_files() == files  # the same code: nothing changed


def test_the_changed_files_are_named_changed_added_or_removed() -> None:
    then = {"reference_server/config.py": "a", "v2kit/codec.py": "b", "v2kit/gone.py": "c"}
    now = {"reference_server/config.py": "A", "v2kit/codec.py": "b", "v2kit/new.py": "d"}
    changed = code_changes(then, now)
    assert changed == ["reference_server/config.py", "v2kit/gone.py", "v2kit/new.py"]
    assert code_changed_text(changed) == (
        "reference_server changed since the server started (reference_server/config.py, v2kit/gone.py, v2kit/new.py "
        "differ); restart the server"
    )
    assert code_changed_text([f"v2kit/{n}.py" for n in range(5)]).endswith(
        "v2kit/2.py and 2 more differ); restart the server"
    )


def _worker_main_reading(payload: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(payload)))
    return process.main()


def test_a_worker_whose_code_differs_from_its_cores_exits_before_it_reads_the_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The core's config pickled by other code may not load, or load into other fields: never unpickled.
    core_code = {**code_files(), "reference_server/renamed.py": "0"}
    payload = process._CODE_LINE + json.dumps(core_code).encode() + b"\n" + b"not a pickle"
    assert _worker_main_reading(payload, monkeypatch) == CODE_CHANGED_EXIT
    # A core from before the check sends its pickle alone: its code is not this one either.
    assert _worker_main_reading(pickle.dumps(("config", "plane", 0)), monkeypatch) == CODE_CHANGED_EXIT
    assert capsys.readouterr().err == (
        "error: front-end worker: reference_server changed since the server started (its code files differ); "
        "restart the server\n"
    )


async def test_the_core_names_the_changed_files_when_a_worker_refuses_to_start(tmp_path: Path) -> None:
    # A real worker process: it reads what the core sends and finds a file the core had and it has not.
    workers = process.FrontendWorkers(ServerConfig(model_repository=tmp_path, frontend_workers=1), "unused")
    workers._code = {**workers._code, "reference_server/removed.py": "0"}
    with pytest.raises(CodeChanged) as raised:
        await asyncio.wait_for(workers._start(0), 30)
    assert str(raised.value) == (
        "front-end worker 0: reference_server changed since the server started (reference_server/removed.py differs); "
        "restart the server"
    )


async def test_a_worker_whose_code_changed_is_not_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(process, "RESTART_DELAY_S", 0.001)
    workers = process.FrontendWorkers(ServerConfig(model_repository=tmp_path, frontend_workers=2), "unused")
    starts: list[int] = []

    async def refuse(index: int) -> None:
        starts.append(index)
        raise CodeChanged(f"front-end worker {index}: {code_changed_text(['v2kit/codec.py'])}")

    monkeypatch.setattr(workers, "_start", refuse)
    with caplog.at_level(logging.ERROR, logger=process.__name__):
        await asyncio.wait_for(workers._watch(1, _DeadWorker()), 10)  # type: ignore[arg-type]
    assert starts == [1]  # one try, one error: no crash loop
    assert caplog.messages[-1] == (
        "front-end worker 1: reference_server changed since the server started (v2kit/codec.py differs); restart the "
        "server; not starting it again (the other workers serve on)"
    )
