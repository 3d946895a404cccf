"""bench/soak.py ends at once on SIGINT (Ctrl-C, or kill -INT of a run a shell started in the
background, which starts it with SIGINT ignored): the load, reloads and faults stop without waiting
for a fault's recovery, a stub a stall left stopped runs again, and the figures so far are printed
under an INTERRUPTED verdict with exit code 130. (By hand: a 60 s run interrupted after 4 s ends
within 0.2-1.2 s, exit 130, nothing left behind.)"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_sigint_sets_the_event_and_a_second_one_raises_as_usual(soak: ModuleType) -> None:
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
        interrupted = soak._on_sigint()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(interrupted.wait(), 5)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def _stalled_process() -> subprocess.Popen[bytes]:
    """A process stopped as the soak's stub-stall fault stops a stub (SIGSTOP)."""
    process = subprocess.Popen(["sleep", "30"])
    os.kill(process.pid, signal.SIGSTOP)
    os.waitpid(process.pid, os.WUNTRACED)  # until it has stopped (not reaped: it only stopped)
    return process


async def test_an_interrupted_run_stops_its_tasks_at_once_and_continues_a_stalled_stub(soak: ModuleType) -> None:
    stalled = _stalled_process()
    try:
        assert _state(stalled.pid) == "T"
        stops = (asyncio.Event(), asyncio.Event())
        recovering = asyncio.create_task(asyncio.sleep(3600))  # a fault waiting for its recovery
        await asyncio.wait_for(soak._end_at_once(SimpleNamespace(stub_pids={stalled.pid}), stops, [recovering]), 5)
        assert recovering.cancelled() and all(event.is_set() for event in stops)
        assert _state(stalled.pid) != "T"  # running again: the server can stop it
    finally:
        stalled.kill()
        stalled.wait()


def test_an_interrupted_runs_verdict_says_so_and_exits_130(soak: ModuleType) -> None:
    figures: dict[str, Any] = {
        "duration_s": 4.1, "interrupted": True, "lost": 0, "duplicated": 0, "mismatched": 0, "hung": 0,
        "unexplained_errors": {}, "faults_not_recovered": [], "faults": {},
        "server_memory_mb": {"warm_mb": 100.0, "end_mb": 100.0}, "client_memory_mb": {"warm_mb": 50.0, "end_mb": 50.0},
    }  # fmt: skip
    assert soak.judge(figures, 50.0) == 130
    assert figures["verdict"] == "INTERRUPTED after 4.1 s: the figures so far; PASS"
    del figures["interrupted"]
    assert soak.judge(figures, 50.0) == 0 and figures["verdict"] == "PASS"
