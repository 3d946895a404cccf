"""Server processes killed under load, nothing lost: the reference server runs as a real process with
two front-end workers, a python-backend model (its stub a child of the core) and an onnxruntime
model with an instance per worker (run in the workers, `--worker-instances`), while perfkit sweeps
one of them at concurrency 16 then 64 over HTTP or gRPC and the test kill -9s a front-end worker, or
the core itself.

A worker killed: the requests perfkit had on its connections fail as errors of a named kind, each
once (none is retried silently: the server counts no more requests than perfkit sent, and answered
every one perfkit has an answer for); perfkit opens new connections and the sweep goes on; the core
starts the worker again (however soon after its own start it died) and the new one serves within
seconds; the statistics extension, read over the wire, agrees with perfkit's per-request export.

The core killed: the workers and the python stub exit by themselves, no worker's statistics file is
left in /dev/shm, every request in flight or sent later fails as an error of a named kind (HTTP 503
"the server's core process is gone" from a worker not yet gone, a connection error), none past
--request-timeout, and perfkit stops with exit 1 saying the server stopped answering, the level it
finished on disk and loadable.

Bounded and self-stopping: 0.2 s windows, at most 3 a level, everything under timeouts; the killer
gives up when the load never comes. The two worker kills share one server (each kills whichever
worker holds perfkit's connections then); the core kill needs its own. About 3 s per sweep, and 2 s
per server start, on an idle 2-core machine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from perfkit.measure.level import CONNECTION_ERRORS
from perfkit.results.model import SweepResult, read_sweep
from reference_server.workers.local_models import COUNTERS_DIR
from tests.fault_sweeps import LEVELS, REQUEST_TIMEOUT_S, start_sweep
from tests.servers import write_identity_model

pytestmark = [pytest.mark.integration]

KILL_AFTER = 100  # requests answered before the worker is killed: early in the first level
#: How soon a worker killed must listen again: it is started again after 0.1 s; the rest is its start
#: (imports, the core's hello), 1-3 s on a 2-core machine, over 10 s when it is overloaded.
RESTART_WITHIN_S = 30.0
WORKER_MODULE = "reference_server.workers.process"

_ECHO = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.002)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""

#: model → perfkit's --shape for it. echo: python backend, run in the core (its stub the core's
#: child); pair: onnxruntime with an instance per worker, run in the workers.
SHAPES = {"echo": "IN:4", "pair": "INPUT0:4"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, demo_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("process_faults") / "models"
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(_ECHO)
    (root / "echo" / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "python"\nmax_batch_size: 8\ndynamic_batching {}\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    shutil.copytree(demo_repository / "identity", root / "identity")
    write_identity_model(root, "pair", "instance_group [ { count: 2 kind: KIND_CPU } ]\ndynamic_batching {}")
    shutil.rmtree(root / "identity")
    return root


@dataclass
class ServerProcess:
    """`python -m reference_server` with two front-end workers, as a child of the test."""

    process: subprocess.Popen[bytes]
    log: Path
    http_port: int = 0
    grpc_port: int = 0
    workers: list[psutil.Process] = field(default_factory=list)
    stubs: list[psutil.Process] = field(default_factory=list)

    def children(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """The core's front-end workers and its other children (the python stubs), now."""
        children = psutil.Process(self.process.pid).children()
        workers = [c for c in children if _is_worker(c)]
        return workers, [c for c in children if c not in workers]

    def stats(self, model: str) -> dict[str, int]:
        """The statistics extension's counts for `model`, over the wire."""
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            connection.request("GET", f"/v2/models/{model}/stats")
            answer = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        (stats,) = answer["model_stats"]
        inference = stats["inference_stats"]
        return {
            "success": int(inference["success"]["count"]),
            "fail": int(inference["fail"]["count"]),
            "inference_count": int(stats["inference_count"]),
        }


def _is_worker(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return WORKER_MODULE in process.cmdline()
    return False


@contextlib.contextmanager
def _server(repository: Path, log: Path) -> Iterator[ServerProcess]:
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(repository),
        "--model-control-mode", "explicit", "--load-model", "echo", "--load-model", "pair",
        "--frontend-workers", "2", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = ServerProcess(process, log)
    try:
        deadline = time.monotonic() + 60
        while "Server ready" not in (text := log.read_text()):
            assert process.poll() is None, f"the server exited with {process.returncode}:\n{text}"
            assert time.monotonic() < deadline, f"the server did not start:\n{text}"
            time.sleep(0.05)
        server.http_port = int(re.search(r"Started HTTPService at \S+:(\d+)", text)[1])  # type: ignore[index]
        server.grpc_port = int(re.search(r"Started GRPCInferenceService at \S+:(\d+)", text)[1])  # type: ignore[index]
        server.workers, server.stubs = server.children()
        assert len(server.workers) == 2 and server.stubs, "expected two workers and a python stub"
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _sweep(url: str, protocol: str, model: str, out: Path, levels: tuple[int, ...] = LEVELS) -> subprocess.Popen[str]:
    return start_sweep(url, protocol, out, model, SHAPES[model], levels)


class WorkerKiller:
    """kill -9s the worker holding most of perfkit's connections once the server has answered
    `after` requests of `model` (gives up after `give_up_s`), then waits for the core to start a
    worker in its place: remembers the pid killed, when (epoch ns), the new pid and how long it
    took, from the kill, until the new worker listened."""

    def __init__(self, server: ServerProcess, client: int, model: str, after: int, give_up_s: float) -> None:
        self.server, self.client, self.model, self.after, self.give_up_s = server, client, model, after, give_up_s
        self.pid = 0
        self.at_ns = 0
        self.new_pid = 0
        self.listening_after_s = -1.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.give_up_s
        while self.server.stats(self.model)["success"] < self.after:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        ports = (self.server.http_port, self.server.grpc_port)
        # The worker serving most of perfkit's connections; looked for again until one serves any
        # (on a busy machine the first look can fall between a level's connections).
        while True:
            victim = self._busiest(ports)
            if victim is not None:
                break
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        workers = self.server.children()[0]
        self.pid, self.at_ns = victim.pid, time.time_ns()
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        before = {w.pid for w in workers}
        while time.monotonic() < killed + RESTART_WITHIN_S:
            new = [w.pid for w in self.server.children()[0] if w.pid not in before]
            if new and _connections(new[0], ports, psutil.CONN_LISTEN) == len(ports):
                self.new_pid, self.listening_after_s = new[0], time.monotonic() - killed
                return
            time.sleep(0.02)

    def _busiest(self, ports: tuple[int, int]) -> psutil.Process | None:
        try:
            client = psutil.Process(self.client)  # perfkit, and its load workers if it starts any
            processes = (client, *client.children(recursive=True))
        except psutil.Error:
            return None
        clients = {c.laddr.port for p in processes for c in _tcp(p) if c.raddr}
        serving = [w for w in self.server.children()[0] if _connections(w.pid, ports, psutil.CONN_ESTABLISHED, clients)]
        # Of the workers holding perfkit's connections, the one that works: a worker may hold only
        # the idle connection perfkit reads metadata and statistics on, and its death fails nothing.
        before = {w: _cpu_s(w) for w in serving}
        time.sleep(0.1)
        return max(serving, key=lambda w: _cpu_s(w) - before[w], default=None)


def _cpu_s(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _tcp(process: psutil.Process) -> list[Any]:
    try:
        return list(process.net_connections(kind="tcp"))
    except psutil.Error:
        return []


def _connections(pid: int, ports: tuple[int, ...], status: str, clients: set[int] | None = None) -> int:
    """Connections of process `pid` on the server's `ports` in `status` (LISTEN: its listeners;
    ESTABLISHED: the clients' connections it serves, only from the ports in `clients` if given)."""
    try:
        held = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(
        1
        for c in held
        if c.status == status and c.laddr.port in ports and (clients is None or (c.raddr and c.raddr.port in clients))
    )


def _infer_on_worker(server: ServerProcess, pid: int, model: str) -> int:
    """Open connections until the kernel gives one to worker `pid`, and infer `model` on it: the
    answer's HTTP status (0 when no connection of 64 reached that worker)."""
    name = SHAPES[model].split(":")[0]
    body = json.dumps({"inputs": [{"name": name, "datatype": "INT32" if model == "echo" else "FP32",
                                   "shape": [1, 4], "data": [1, 2, 3, 4]}]})  # fmt: skip
    opened = []
    try:
        for _ in range(64):
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
            connection.connect()
            opened.append(connection)
            ours = connection.sock.getsockname()[1]
            held = psutil.Process(pid).net_connections(kind="tcp")
            if any(c.raddr and c.raddr.port == ours for c in held):
                connection.request("POST", f"/v2/models/{model}/infer", body)
                response = connection.getresponse()
                response.read()
                return response.status
        return 0
    finally:
        for connection in opened:
            connection.close()


def _requests(out: Path) -> tuple[SweepResult, list[dict[str, Any]]]:
    """The sweep's results and every request in its per-request export; each
    level's counts add up, every error is of a named kind, none outlived --request-timeout."""
    (sweep_json,) = out.glob("sweep-*.json")
    result = read_sweep(sweep_json)
    experiments: list[dict[str, Any]] = json.loads((out / "requests.json").read_text())["experiments"]
    assert [e["experiment"]["value"] for e in experiments] == [level.level for level in result.levels]
    requests = [r for e in experiments for r in e["requests"]]
    for r in requests:
        (done,) = r["response_timestamps"]
        assert done - r["timestamp"] <= REQUEST_TIMEOUT_S * 1e9, r
    for level in result.levels:
        assert level.ok_count + level.error_count == level.request_count
        assert all(kind for kind in level.errors), level.errors
    return result, requests


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the worker kills (each kills whichever worker holds perfkit's connections);
    once it stopped, no worker it ever had and no stub is left."""
    seen: list[psutil.Process] = []
    with _server(repository, tmp_path_factory.mktemp("server") / "server.log") as running:
        yield running
        seen.extend(running.children()[0] + running.workers + running.stubs)
    gone, alive = psutil.wait_procs(seen, timeout=15)
    assert not alive, f"still running after the server stopped: {alive}"


@pytest.mark.parametrize(
    ("protocol", "model"),
    [("http", "echo"), ("grpc", "pair")],
    ids=["http-python-model-in-the-core", "grpc-model-in-the-workers"],
)
def test_a_worker_killed_under_load_is_started_again_and_loses_nothing(
    server: ServerProcess, tmp_path: Path, protocol: str, model: str
) -> None:
    logged = len(server.log.read_text())
    before = server.stats(model)
    url = f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}"
    sweep = _sweep(url, protocol, model, tmp_path)
    killer = WorkerKiller(server, sweep.pid, model, before["success"] + KILL_AFTER, give_up_s=30)
    try:
        stdout, stderr = sweep.communicate(timeout=90)
    finally:
        sweep.kill()
    killer.thread.join(RESTART_WITHIN_S + 5)
    assert killer.pid, "the load never reached the server"
    counted = {key: value - before[key] for key, value in server.stats(model).items()}
    new_answers = _infer_on_worker(server, killer.new_pid, model) if killer.new_pid else 0
    log = server.log.read_text()[logged:]
    # 4: the dead worker's requests failed in a reported window; 3: a level did not stabilise.
    assert sweep.returncode in (0, 3, 4), f"perfkit sweep exited {sweep.returncode}:\n{stdout}\n{stderr}"
    # The core started the worker again (it died a few seconds after its start, or after the
    # server's) and it serves.
    assert re.search(r"front-end worker \d exited with -9; starting it again in 0\.[12] s", log), log
    assert killer.new_pid, f"no worker listened in place of {killer.pid} within {RESTART_WITHIN_S} s:\n{log}"
    assert new_answers == 200, f"the worker started again answered {new_answers}"
    print(
        f"{protocol} {model}: worker {killer.pid} -> {killer.new_pid}, listening {killer.listening_after_s:.2f} s later"
    )

    result, requests = _requests(tmp_path)
    assert result.completed and result.stop_reason == ""
    assert [level.level for level in result.levels] == list(LEVELS)
    # The kill came under load (in the first level, or the second on a slow machine).
    assert min(r["timestamp"] for r in requests) < killer.at_ns < max(r["timestamp"] for r in requests)
    errors = [r for r in requests if r["error"]]
    answered = len(requests) - len(errors)
    kinds = sorted({r["error"] for r in errors})
    print(f"{len(requests)} requests, {len(errors)} failed {kinds}; server counted {counted}")
    # The requests on the dead worker's connections failed as connection errors, each once: at most
    # one level's concurrency of them, in flight at the kill or sent on its connections before
    # perfkit saw them closed (those never reached the server).
    assert errors, "no request failed: the killed worker held none of perfkit's connections"
    assert len(errors) <= LEVELS[-1]
    assert all(r["error"].startswith(CONNECTION_ERRORS) for r in errors), kinds
    assert all(r["timestamp"] < killer.at_ns + REQUEST_TIMEOUT_S * 1e9 for r in errors)
    # perfkit opened new connections: requests sent after the kill were answered.
    assert any(not r["error"] for r in requests if r["timestamp"] > killer.at_ns)
    assert result.levels[-1].ok_count > 0
    # The statistics extension agrees: every answer perfkit has was counted once by the server; the
    # server counted no request perfkit did not send once (none retried silently); what it ran but
    # whose answer was lost with the worker, and what it withdrew from its queue when the worker
    # went (CANCELED), are among perfkit's errors.
    assert answered <= counted["success"]
    assert counted["success"] + counted["fail"] <= len(requests)
    assert counted["success"] - answered + counted["fail"] <= len(errors)
    # A batch the dead worker ran counted its inferences, though not all its answers left.
    assert counted["success"] <= counted["inference_count"] <= counted["success"] + len(errors)


def test_a_core_killed_under_load_leaves_nothing_behind(repository: Path, tmp_path: Path) -> None:
    """kill -9 of the core during the second level: its workers and its stub exit by themselves,
    no worker's statistics file stays in /dev/shm, every later request fails as a named error,
    and perfkit stops (exit 1, the server stopped answering) with the first level on disk."""
    with _server(repository, tmp_path / "server.log") as server:
        workers, stubs = server.workers, server.stubs
        sweep = _sweep(f"127.0.0.1:{server.http_port}", "http", "echo", tmp_path, levels=(16, 40, 64))
        try:
            deadline = time.monotonic() + 30
            while not _levels_on_disk(tmp_path):
                assert sweep.poll() is None and time.monotonic() < deadline, "the first level never finished"
                time.sleep(0.01)
            killed_ns = time.time_ns()
            server.process.kill()
            server.process.wait(10)
            stdout, stderr = sweep.communicate(timeout=60)
        finally:
            sweep.kill()
        gone, alive = psutil.wait_procs([*workers, *stubs], timeout=15)
    assert not alive, f"still running after their core was killed: {alive}"
    left = {f.name for w in workers for f in COUNTERS_DIR.glob(f"reference-server-stats-{w.pid}-*")}
    assert not left, f"statistics files left in /dev/shm by the workers of a dead core: {sorted(left)}"

    assert sweep.returncode == 1, f"perfkit sweep exited {sweep.returncode}:\n{stdout}\n{stderr}"
    result, requests = _requests(tmp_path)
    assert not result.completed and result.stop_reason.startswith("the server stopped answering")
    assert result.levels[0].level == 16 and result.levels[0].error_count == 0
    later = [r for r in requests if r["timestamp"] > killed_ns]
    print(f"{len(requests)} requests, {len(later)} after the kill: {sorted({r['error'] for r in later})}")
    assert later and all(r["error"] for r in later), "a request sent after the core died was answered"
    # In flight when the core died: the workers answer 503 in the server's words until they exit;
    # later ones find no listener.
    assert all(r["error"].startswith(CONNECTION_ERRORS) or r["error"] == "HTTP 503" for r in later), later
    assert "the sweep stopped early: the server stopped answering (connection refused" in stderr, stderr


def _levels_on_disk(out: Path) -> int:
    """How many levels the sweep's results on disk hold (they are written atomically)."""
    found = list(out.glob("sweep-*.json"))
    return len(read_sweep(found[0]).levels) if found else 0
