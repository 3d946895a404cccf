"""Faults under load, nothing lost: perfkit sweeps a python-backend model on the reference server
(concurrency 16 then 64, over HTTP and gRPC) while the test kill -9s the model's stub
process in the middle of the first level.

What must hold: every request perfkit sent is answered or counted as an error of a named kind, once
(the statistics extension's success + failure counts, read over the wire as any client reads them,
equal the requests in perfkit's per-request export, and each level's ok + errors its request
count); none took longer than --request-timeout; the server starts a new stub by itself, which
serves the next level; the sweep's results on disk are complete and load; and once the server has
stopped, neither stub (the killed one, the new one) is left, nor a /dev/shm region (the stubs'
arenas are anonymous memfds; a named region left would be a leak).

A decoupled model (two responses a request, then the final flag) is swept over gRPC streams the
same way, its stub stopping itself between a batch's responses: each request caught there had its
first response and is one error ("1 response, then Stub process ... is not healthy"), not an
answer and an error; and a request whose final flag went out before its batch failed is an answer
on both sides.

The same holds, over HTTP and the decoupled model's streams, when the stub is stalled
(SIGSTOP) instead: the server gives its batches up after `execute-timeout-seconds` (0.3 s here),
kills it and starts a new one. And when the model is unloaded mid-sweep (explicit model control,
over HTTP and gRPC): the requests it took are answered, the later ones fail with the server's
"has no available versions" (HTTP 404, gRPC NOT_FOUND), none hangs, and the sweep exits 4 with
both levels on disk.

Bounded and self-stopping: perfkit runs with 0.2 s windows, at most 3 a level, under a timeout;
the killer gives up when the load never comes. About 2-3 s per case.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import tritonclient.grpc

from perfkit.results.model import SweepResult, read_sweep
from reference_server.backends.python.instance import PythonInstance
from reference_server.scheduling.scheduler import Scheduler
from reference_server.server import ReferenceServer, running_server
from tests.fault_sweeps import LEVELS, REQUEST_TIMEOUT_S, start_sweep
from tests.servers import loopback_config

pytestmark = [pytest.mark.integration]

KILL_AFTER = 200  # requests answered before the stub is killed: well inside the first level
DECOUPLED = "echo_twice"  # the decoupled model, swept over gRPC streams (transport "decoupled")
RESPONSES = {DECOUPLED: 2}  # responses to each request answered in full; 1 for the others

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


# Decoupled: two responses a request, 2 ms apart, then the final flag alone. The fault comes from
# the stub itself, at the one moment the case is about: between the responses of its third batch,
# the first ones sent, the rest never to come (a kill from outside finds that moment only by luck).
# Its note (pid, epoch ns) says when, and that it came: a new stub finds it and serves on.
_ECHO_TWICE = """\
import json
import os
import signal
import time

import triton_python_backend_utils as pb_utils

FAULT_AT_BATCH = 3


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.signal = int(parameters["fault_signal"]["string_value"])
        self.note = parameters["fault_note"]["string_value"]
        self.batches = 0

    def execute(self, requests):
        answers = [(r.get_response_sender(), pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()) for r in requests]
        for sender, value in answers:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        self.batches += 1
        if self.batches == FAULT_AT_BATCH and not os.path.exists(self.note):
            with open(self.note + ".part", "w") as note:
                note.write(f"{os.getpid()} {time.time_ns()}")
            os.replace(self.note + ".part", self.note)
            os.kill(os.getpid(), self.signal)
        time.sleep(0.002)
        for sender, value in answers:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _write_model(root: Path, name: str, source: str, extra_config: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\ndynamic_batching {{}}\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + extra_config
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults") / "models"
    _write_model(root, "echo", _ECHO)
    return root


def _decoupled_repository(out: Path, sig: int) -> tuple[Path, Path]:
    """A repository of the decoupled model alone, whose stub signals itself `sig` (see
    _ECHO_TWICE), and the path of its note."""
    root, note = out / "decoupled-models", out / "fault"
    parameters = {"fault_signal": str(int(sig)), "fault_note": str(note)}
    config = (
        "model_transaction_policy { decoupled: true }\nparameters [ "
        + ", ".join(f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}' for key, value in parameters.items())
        + " ]\n"
    )
    _write_model(root, DECOUPLED, _ECHO_TWICE, config)
    return root, note


class StubFault:
    """The decoupled model's own fault (see _ECHO_TWICE): waits for its note (gives up after
    `give_up_s`); then, as Killer, has the pid signalled, when (epoch ns), and the /dev/shm files
    the stub had mapped (read at the start: its arenas are mapped for its life)."""

    def __init__(self, instance: PythonInstance, note: Path, give_up_s: float, sig: int = signal.SIGKILL) -> None:
        self.note, self.give_up_s, self.sig = note, give_up_s, sig
        stub = instance._stub
        assert stub is not None and stub.process is not None
        self.shm = _shm_mapped(stub.process.pid)
        self.pid = 0
        self.at_ns = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.pid, self.at_ns = map(int, self.note.read_text().split())
                return
            time.sleep(0.005)


class Killer:
    """kill -9s (or signals `sig`, e.g. SIGSTOP) the instance's stub once the scheduler has answered
    `after` requests (gives up after `give_up_s`); remembers the pid it signalled, when (epoch ns),
    and the /dev/shm files the stub had mapped."""

    def __init__(
        self, instance: PythonInstance, scheduler: Scheduler, after: int, give_up_s: float, sig: int = signal.SIGKILL
    ) -> None:
        self.instance, self.scheduler, self.after, self.give_up_s, self.sig = instance, scheduler, after, give_up_s, sig
        self.pid = 0
        self.at_ns = 0
        self.shm: set[str] = set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if not _answered(self.scheduler, self.after, self.give_up_s):
            return
        stub = self.instance._stub
        assert stub is not None and stub.process is not None
        self.shm = _shm_mapped(stub.process.pid)
        self.pid = stub.process.pid
        self.at_ns = time.time_ns()
        os.kill(self.pid, self.sig)


def _answered(scheduler: Scheduler, count: int, give_up_s: float) -> bool:
    """Wait until the scheduler has answered `count` requests; False when that takes over `give_up_s`
    (the load never came: the fault is not thrown, and the test's own checks say why)."""
    deadline = time.monotonic() + give_up_s
    while scheduler._stats.success_count < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


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


def _sweep(url: str, transport: str, out: Path, model: str = "echo") -> subprocess.Popen[str]:
    return start_sweep(url, transport, out, model, "IN:4")


def _fault(
    transport: str, instance: PythonInstance, scheduler: Scheduler, after: int, note: Path, sig: int
) -> Killer | StubFault:
    """The fault a case throws: the decoupled model's own, else the Killer's after `after` answers."""
    if transport == "decoupled":
        return StubFault(instance, note, give_up_s=30, sig=sig)
    return Killer(instance, scheduler, after, give_up_s=30, sig=sig)


def _url(server: ReferenceServer, transport: str) -> str:
    return server.http_url if transport == "http" else f"127.0.0.1:{server.grpc_port}"


def _statistics(server: ReferenceServer, model: str, transport: str) -> tuple[int, int]:
    """The statistics extension's success and failure counts for `model`, read over the wire as a
    client would (GET /v2/models/<model>/stats; ModelStatistics too for a gRPC case, which must agree)."""
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        (stats,) = json.loads(answer.read())["model_stats"]
    counts = (stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"])
    if transport != "http":
        with tritonclient.grpc.InferenceServerClient(_url(server, "grpc")) as client:
            (over_grpc,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
        inference = over_grpc["inference_stats"]
        assert (int(inference["success"].get("count", 0)), int(inference["fail"].get("count", 0))) == counts
    return counts


# gRPC streams through the decoupled model only: its case is the non-decoupled one's and more.
@pytest.mark.parametrize("transport", ["http", "grpc", "decoupled"])
def test_a_stub_killed_under_load_loses_nothing(repository: Path, tmp_path: Path, transport: str) -> None:
    """Over "decoupled" (gRPC streams, two responses a request), a request whose first response came
    before the kill and whose rest never comes is one error, counted once by both sides."""
    model, root, note = "echo", repository, tmp_path / "fault"
    if transport == "decoupled":
        model, (root, note) = DECOUPLED, _decoupled_repository(tmp_path, signal.SIGKILL)
    shm_before = set(os.listdir("/dev/shm"))
    with running_server(loopback_config(root)) as server:
        instance, scheduler = _served(server, model)
        sweep = _sweep(_url(server, transport), transport, tmp_path, model)
        killer = _fault(transport, instance, scheduler, KILL_AFTER, note, signal.SIGKILL)
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
        answered, failed = _statistics(server, model, transport)
        assert (answered, failed) == (scheduler._stats.success_count, scheduler._stats.fail_count)
        new_stub = instance._stub
        assert new_stub is not None and new_stub.process is not None
        new_pid = new_stub.process.pid
        shm_held = killer.shm | _shm_mapped(new_pid)

    # The stub was killed in the middle of the first level, and a new one started by itself.
    assert new_pid != killer.pid
    print(f"{transport}: stub {killer.pid} -> {new_pid}")
    result, experiments = _nothing_lost(tmp_path, answered + failed, failed, RESPONSES.get(model, 1))
    assert result.completed and result.stop_reason == ""
    assert [level.level for level in result.levels] == list(LEVELS)
    first = experiments[0]["requests"]
    assert min(r["timestamp"] for r in first) < killer.at_ns < max(r["timestamp"] for r in first)
    if model == DECOUPLED:  # its batch's requests each had their first response, then failed
        assert f"1 response, then Stub process '{DECOUPLED}_0_0' is not healthy" in stderr, stderr
    # The new stub served the later level.
    assert result.levels[-1].ok_count > 0
    assert sum(1 for r in experiments[-1]["requests"] if not r["error"]) > 0

    # Nothing left behind once the server stopped: no stub, no shared memory.
    assert not _alive(killer.pid) and not _alive(new_pid)
    left = {name for name in set(os.listdir("/dev/shm")) - shm_before if _maybe_ours(name, sweep.pid)}
    assert not left, f"/dev/shm regions left behind: {sorted(left)}"
    assert not any(Path(p).exists() for p in shm_held - {f"/dev/shm/{n}" for n in shm_before})


def _served(server: ReferenceServer, model: str) -> tuple[PythonInstance, Scheduler]:
    """The model's one python instance and its scheduler, in an embedded server."""
    assert server.repository is not None
    version = server.repository.get(model)
    (instance,) = version.instances
    scheduler = version.scheduler
    assert isinstance(instance, PythonInstance) and isinstance(scheduler, Scheduler)
    return instance, scheduler


def _maybe_ours(name: str, perfkit_pid: int) -> bool:
    """Whether a /dev/shm region may be this test's: not one of real tritonserver's python stubs
    (other tests' peers), nor another perfkit's (named perfkit_<pid>_...), nor one that a process
    other than this one holds open or mapped (perf_analyzer's regions, INPUT0_0_0 and the like, of
    a test running at the same time in another worker: everything this test started has stopped)."""
    if name.startswith("triton_python_backend_shm_region_"):
        return False
    if name.startswith("perfkit_") and not name.startswith(f"perfkit_{perfkit_pid}_"):
        return False
    return not _held_elsewhere(f"/dev/shm/{name}")


def _held_elsewhere(path: str) -> bool:
    """Whether a process other than this one has `path` open or mapped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if path in Path(f"/proc/{entry}/maps").read_text():
                return True
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == path for fd in os.listdir(f"/proc/{entry}/fd")):
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


# The stalled stub's batches fail this long after they were sent: short, and the stall comes early
# in the first level (0.6 s of windows), so that their failures land inside its windows and are
# counted there (a request that ends after a level's last window is in the export only).
EXECUTE_TIMEOUT_S = 0.3
STALL_AFTER = 20


# gRPC through the decoupled model's streams only: each case costs ~2 s of the suite's budget.
@pytest.mark.parametrize("transport", ["http", "decoupled"])
def test_a_stub_stalled_past_its_execute_timeout_loses_nothing(
    repository: Path, tmp_path: Path, transport: str
) -> None:
    """SIGSTOP, not kill: the stub stays alive but never answers. The server must give its batches
    up after `execute-timeout-seconds`, kill it and start a new one, as for a dead stub. The
    decoupled model stalls between a batch's responses: those requests fail once, after their first."""
    model, root, note = "echo", repository, tmp_path / "fault"
    if transport == "decoupled":
        model, (root, note) = DECOUPLED, _decoupled_repository(tmp_path, signal.SIGSTOP)
    shm_before = set(os.listdir("/dev/shm"))
    config = loopback_config(root, backend_config={"execute-timeout-seconds": str(EXECUTE_TIMEOUT_S)})
    with running_server(config) as server:
        instance, scheduler = _served(server, model)
        sweep = _sweep(_url(server, transport), transport, tmp_path, model)
        staller = _fault(transport, instance, scheduler, STALL_AFTER, note, signal.SIGSTOP)
        try:
            stdout, stderr = sweep.communicate(timeout=90)
        finally:
            sweep.kill()
            staller.thread.join(1)
            stalled_alive = bool(staller.pid) and _alive(staller.pid)
            if stalled_alive:  # the server did not kill it: the test does, so nothing is left stopped
                with contextlib.suppress(ProcessLookupError):
                    os.kill(staller.pid, signal.SIGKILL)
        assert staller.pid, "the load never reached the server"
        # 4: requests failed (the stalled stub's batches); every level is measured and kept.
        assert sweep.returncode == 4, f"perfkit sweep exited {sweep.returncode}:\n{stdout}\n{stderr}"
        assert "execute() did not return within" in stderr, stderr  # the server's words for the stalled batches
        answered, failed = _statistics(server, model, transport)
        assert (answered, failed) == (scheduler._stats.success_count, scheduler._stats.fail_count)
        new_stub = instance._stub
        assert new_stub is not None and new_stub.process is not None
        new_pid = new_stub.process.pid
        shm_held = staller.shm | _shm_mapped(new_pid)

    # The server killed the stalled stub by itself (not the test's clean-up) and started a new one.
    assert not stalled_alive, "the stalled stub outlived the sweep: the server never gave it up"
    assert new_pid != staller.pid
    result, experiments = _nothing_lost(tmp_path, answered + failed, failed, RESPONSES.get(model, 1))
    first = experiments[0]["requests"]
    assert min(r["timestamp"] for r in first) < staller.at_ns < max(r["timestamp"] for r in first)
    if model == DECOUPLED:
        assert "1 response, then " in stderr, stderr
    assert result.completed and result.stop_reason == ""
    assert [level.level for level in result.levels] == list(LEVELS)
    assert result.levels[-1].ok_count > 0  # the new stub serves
    assert not _alive(new_pid)
    left = {name for name in set(os.listdir("/dev/shm")) - shm_before if _maybe_ours(name, sweep.pid)}
    assert not left, f"/dev/shm regions left behind: {sorted(left)}"
    assert not any(Path(p).exists() for p in shm_held - {f"/dev/shm/{n}" for n in shm_before})


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_model_unloaded_mid_sweep_ends_it_with_its_levels_on_disk(
    repository: Path, tmp_path: Path, transport: str
) -> None:
    """Explicit model control: the model is unloaded while perfkit sweeps it. The requests the model
    holds are answered (the old version drains), later ones fail with the server's named error, none
    hangs, and the sweep ends non-zero with the levels it measured on disk."""
    with running_server(loopback_config(repository, load=("echo",))) as server:
        assert server.repository is not None
        scheduler = server.repository.get("echo").scheduler
        assert isinstance(scheduler, Scheduler)
        sweep = _sweep(_url(server, transport), transport, tmp_path)
        unloader = Unloader(f"http://{server.http_url}", "echo", scheduler, KILL_AFTER, give_up_s=30)
        try:
            stdout, stderr = sweep.communicate(timeout=90)
        finally:
            sweep.kill()
            unloader.thread.join(5)
        assert unloader.status == 200, f"unload answered {unloader.status}"
        stats = scheduler._stats
        server_counted = stats.success_count + stats.fail_count
    # 4: requests failed (every one after the unload); the levels measured are kept.
    assert sweep.returncode == 4, f"perfkit sweep exited {sweep.returncode}:\n{stdout}\n{stderr}"
    unloaded = "HTTP 404" if transport == "http" else "grpc NOT_FOUND"  # Triton's status for it on each
    assert f"{unloaded}: Request for unknown model: 'echo' has no available versions" in stderr, stderr
    (sweep_json,) = tmp_path.glob("sweep-*.json")
    result = read_sweep(sweep_json)
    experiments = json.loads((tmp_path / "requests.json").read_text())["experiments"]
    assert [level.level for level in result.levels] == [e["experiment"]["value"] for e in experiments] == list(LEVELS)
    requests = [r for e in experiments for r in e["requests"]]
    print(f"{len(requests)} requests, {stats.success_count} answered, then {sorted({r['error'] for r in requests})}")
    after = [r for r in requests if r["timestamp"] > unloader.done_ns]
    assert after and all(r["error"] == unloaded for r in after), "a request sent after the unload was answered"
    # The model answered each request it took before the unload, once (those in flight included:
    # the old version drains); the others failed with the server's named error, which never reached it.
    answered = sum(1 for r in requests if not r["error"])
    assert answered == server_counted == stats.success_count
    assert {r["error"] for r in requests if r["error"]} == {unloaded}
    assert result.levels[0].ok_count > 0 and result.levels[-1].ok_count == 0
    for r in requests:
        (done,) = r["response_timestamps"]
        assert done - r["timestamp"] <= REQUEST_TIMEOUT_S * 1e9, r
    for level in result.levels:
        assert level.ok_count + level.error_count == level.request_count
        assert all(kind for kind in level.errors), level.errors


class Unloader:
    """POSTs the model's unload once the scheduler has answered `after` requests (gives up after
    `give_up_s`); remembers the answer's status and when it came (epoch ns)."""

    def __init__(self, url: str, model: str, scheduler: Scheduler, after: int, give_up_s: float) -> None:
        self.url, self.model, self.scheduler, self.after, self.give_up_s = url, model, scheduler, after, give_up_s
        self.status = 0
        self.done_ns = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if not _answered(self.scheduler, self.after, self.give_up_s):
            return
        unload = f"{self.url}/v2/repository/models/{self.model}/unload"
        request = urllib.request.Request(unload, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            self.status = answer.status
        self.done_ns = time.time_ns()


def _nothing_lost(
    out: Path, server_counted: int, server_failed: int, responses: int = 1
) -> tuple[SweepResult, list[dict[str, Any]]]:
    """The sweep's results load, and every request perfkit recorded was answered (with its
    `responses` responses) or failed with a named kind, once (as many as the server counted), none
    past --request-timeout."""
    (sweep_json,) = out.glob("sweep-*.json")
    result = read_sweep(sweep_json)
    experiments: list[dict[str, Any]] = json.loads((out / "requests.json").read_text())["experiments"]
    assert [e["experiment"]["value"] for e in experiments] == [level.level for level in result.levels]
    requests = [r for e in experiments for r in e["requests"]]
    kinds = sorted({r["error"] for r in requests if r["error"]})
    print(f"{len(requests)} requests, {server_failed} failed {kinds}")
    assert len(requests) == server_counted, "requests perfkit recorded vs answered and failed on the server"
    assert server_failed == sum(1 for r in requests if r["error"])
    for r in requests:
        # An answer's every response; a failure's responses before it, or its end when none came.
        times = r["response_timestamps"]
        assert len(times) == responses if not r["error"] else 1 <= len(times) <= responses, r
        assert times[-1] - r["timestamp"] <= REQUEST_TIMEOUT_S * 1e9, r
    for level in result.levels:
        assert level.ok_count + level.error_count == level.request_count
        assert all(kind for kind in level.errors), level.errors
    return result, experiments
