"""Faults under load, nothing lost: perfkit sweeps a python-backend model on the reference server
(concurrency 16 then 64, over HTTP, gRPC and gRPC streams) while the test kill -9s the model's stub
process in the middle of the first level.

What must hold: every request perfkit sent is answered or counted as an error of a named kind, once
(the server's success + failure counts equal the requests in perfkit's per-request export, and
each level's ok + errors its request count); none took longer than --request-timeout; the server
starts a new stub by itself, which serves the next level; the sweep's results on disk are complete
and load; and once the server has stopped, neither stub (the killed one, the new one) is left, nor a
/dev/shm region (the stubs' arenas are anonymous memfds; a named region left would be a leak).

Bounded and self-stopping: perfkit runs with 0.2 s windows, at most 3 a level, under a timeout;
the killer gives up when the load never comes. About 2-3 s per transport.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from perfkit.results.model import read_sweep
from reference_server.backends.python.instance import PythonInstance
from reference_server.scheduling.scheduler import Scheduler
from reference_server.server import running_server
from tests.servers import loopback_config

pytestmark = [pytest.mark.integration]

REQUEST_TIMEOUT_S = 5.0
KILL_AFTER = 200  # requests answered before the stub is killed: well inside the first level
LEVELS = (16, 64)

_ECHO = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.002)  # a batch is in the stub most of the time: the kill finds one there
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "models"
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(_ECHO)
    (root / "echo" / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 8\ndynamic_batching {}\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    return root


class Killer:
    """kill -9s the instance's stub once the scheduler has answered `after` requests (gives up
    after `give_up_s`); remembers the pid it killed, when (epoch ns), and the /dev/shm files the
    stub had mapped."""

    def __init__(self, instance: PythonInstance, scheduler: Scheduler, after: int, give_up_s: float) -> None:
        self.instance, self.scheduler, self.after, self.give_up_s = instance, scheduler, after, give_up_s
        self.pid = 0
        self.at_ns = 0
        self.shm: set[str] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.give_up_s
        while self.scheduler._stats.success_count < self.after:
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        stub = self.instance._stub
        assert stub is not None and stub.process is not None
        self.shm = _shm_mapped(stub.process.pid)
        self.pid = stub.process.pid
        self.at_ns = time.time_ns()
        os.kill(self.pid, signal.SIGKILL)


def _shm_mapped(pid: int) -> set[str]:
    try:
        return {m.path for m in psutil.Process(pid).memory_maps(grouped=False) if m.path.startswith("/dev/shm/")}
    except psutil.Error:
        return set()


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _sweep(url: str, transport: str, out: Path) -> subprocess.Popen[str]:
    protocol = "http" if transport == "http" else "grpc"
    streaming = ["--streaming"] if transport == "stream" else []
    command = [
        sys.executable, "-m", "perfkit", "sweep", "-u", url, "-i", protocol, *streaming, "-m", "echo", "--shape", "IN:4",
        "--concurrency-range", f"{LEVELS[0]}:{LEVELS[1]}:{LEVELS[1] - LEVELS[0]}",
        "-p", "200", "-r", "3", "-s", "50", "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--report-dir", str(out), "-f", str(out / "perfkit.csv"), "--profile-export-file", str(out / "requests.json"),
        "--quiet", "--no-report",
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("transport", ["http", "grpc", "stream"])
def test_a_stub_killed_under_load_loses_nothing(repository: Path, tmp_path: Path, transport: str) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    with running_server(loopback_config(repository)) as server:
        assert server.repository is not None
        version = server.repository.get("echo")
        (instance,) = version.instances
        scheduler = version.scheduler
        assert isinstance(instance, PythonInstance) and isinstance(scheduler, Scheduler)
        url = server.http_url if transport == "http" else f"127.0.0.1:{server.grpc_port}"
        sweep = _sweep(url, transport, tmp_path)
        killer = Killer(instance, scheduler, KILL_AFTER, give_up_s=30)
        try:
            stdout, stderr = sweep.communicate(timeout=90)
        finally:
            sweep.kill()
        killer.thread.join(1)
        # 3: a level did not stabilise (the kill sees to that); 4: requests failed in a reported
        # window (those the stub had when it died). Either way every level is measured and kept.
        assert sweep.returncode in (0, 3, 4), f"perfkit sweep exited {sweep.returncode}:\n{stdout}\n{stderr}"
        if sweep.returncode == 4:
            assert "is not healthy" in stderr, stderr  # the server's own words for the failures
        assert killer.pid, "the load never reached the server"
        stats = scheduler._stats
        server_counted = stats.success_count + stats.fail_count
        new_stub = instance._stub
        assert new_stub is not None and new_stub.process is not None
        new_pid = new_stub.process.pid
        shm_held = killer.shm | _shm_mapped(new_pid)

    # The stub was killed in the middle of the first level, and a new one started by itself.
    assert new_pid != killer.pid
    (sweep_json,) = tmp_path.glob("sweep-*.json")
    result = read_sweep(sweep_json)
    assert result.completed and result.stop_reason == ""
    assert [level.level for level in result.levels] == list(LEVELS)
    experiments = json.loads((tmp_path / "requests.json").read_text())["experiments"]
    assert [e["experiment"]["value"] for e in experiments] == list(LEVELS)
    first = experiments[0]["requests"]
    assert min(r["timestamp"] for r in first) < killer.at_ns < max(r["timestamp"] for r in first)

    # Every request sent is answered or failed with a named kind, once, and none outlived the timeout.
    requests = [r for e in experiments for r in e["requests"]]
    kinds = sorted({r["error"] for r in requests if r["error"]})
    print(f"{transport}: {len(requests)} requests, {stats.fail_count} failed {kinds}, stub {killer.pid} -> {new_pid}")
    assert len(requests) == server_counted, "requests perfkit recorded vs answered and failed on the server"
    assert stats.fail_count == sum(1 for r in requests if r["error"])
    for r in requests:
        (done,) = r["response_timestamps"]
        assert done - r["timestamp"] <= REQUEST_TIMEOUT_S * 1e9, r
    for level in result.levels:
        assert level.ok_count + level.error_count == level.request_count
        assert all(kind for kind in level.errors), level.errors
    # The new stub served the later level.
    assert result.levels[-1].ok_count > 0
    assert sum(1 for r in experiments[-1]["requests"] if not r["error"]) > 0

    # Nothing left behind once the server stopped: no stub, no shared memory.
    assert not _alive(killer.pid) and not _alive(new_pid)
    left = {name for name in set(os.listdir("/dev/shm")) - shm_before if _maybe_ours(name, sweep.pid)}
    assert not left, f"/dev/shm regions left behind: {sorted(left)}"
    assert not any(Path(p).exists() for p in shm_held - {f"/dev/shm/{n}" for n in shm_before})


def _maybe_ours(name: str, perfkit_pid: int) -> bool:
    """Whether a /dev/shm region may be this test's: not one of real tritonserver's python stubs
    (other tests' peers) nor another perfkit's (named perfkit_<pid>_...)."""
    if name.startswith("triton_python_backend_shm_region_"):
        return False
    return not name.startswith("perfkit_") or name.startswith(f"perfkit_{perfkit_pid}_")
