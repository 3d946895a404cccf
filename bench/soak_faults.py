"""The faults bench/soak.py throws at the reference server at random times, and what they cost.

Kinds (one at a time; the next waits until the last has recovered or was given up; in rounds, each
kind once a round in a random order):

- `stub-kill`: kill -9 the python-backend stub of the echo model. The server must fail the batch
  it held and start a new stub by itself.
- `stub-stall`: SIGSTOP that stub. The server must give its batch up after
  `execute-timeout-seconds`, kill it and start a new one; one still stopped after the timeout plus
  STALL_MARGIN_S is SIGKILLed here and counted as a server failure.
- `worker-kill`: kill -9 a front-end worker (with two or more) that has lived WORKER_MIN_AGE_S; the
  core must start it again. Recovered once a new connection lands on the new worker and is answered.
- `unload`: unload one of the two models under load, then load it again (explicit model control).
- `core-kill` (only at the end, with --kill-core-at-end): kill -9 the core; every request
  outstanding must end as a named error, and its workers and stubs must end by themselves.

Recovery time: from the fault to the first good answer from what replaced the thing hit (a new stub
pid in the echo model's answers, the new worker, the model loaded again). An error counts against the
fault whose window (from the fault to its recovery, plus ATTRIBUTION_GRACE_S) holds it; an error in
no window is unexplained, and fails the soak.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil

from v2kit import codec as v2

PY_MODEL = "pyecho"
KINDS = ("stub-kill", "stub-stall", "worker-kill", "unload")
#: The core does not restart a worker that dies within 5 s of its start (workers/process.py); only
#: workers older than this are killed, so that each kill has a restart to wait for.
WORKER_MIN_AGE_S = 6.0
#: How long past execute-timeout-seconds a stalled stub may stay stopped before it is the server's failure.
STALL_MARGIN_S = 5.0
RECOVERY_GIVE_UP_S = 30.0
ATTRIBUTION_GRACE_S = 2.0
#: How long the workers and stubs may take to end by themselves once the core is killed.
ORPHAN_GRACE_S = 10.0

_ECHO = """\
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pid = np.array([[os.getpid()]], dtype=np.int64)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            pids = np.repeat(pid, x.shape[0], axis=0)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PID", pids)]))
        return responses
"""

_ECHO_CONFIG = f"""\
name: "{PY_MODEL}"
backend: "python"
max_batch_size: 8
dynamic_batching {{}}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def soak_repository(demo: Path, root: Path) -> Path:
    """A repository at `root` with the demo `identity` (copied) and the python echo model, which
    answers each request with its input and its stub's pid (so a restarted stub is seen answering)."""
    shutil.copytree(demo / "identity", root / "identity")
    (root / PY_MODEL / "1").mkdir(parents=True)
    (root / PY_MODEL / "1" / "model.py").write_text(_ECHO)
    (root / PY_MODEL / "config.pbtxt").write_text(_ECHO_CONFIG)
    return root


# --- the server's processes ----------------------------------------------------------------------


def is_stub(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("backends.python" in part or "python_backend_stub" in part for part in process.cmdline())
    return False


def is_worker(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return "reference_server.workers.process" in process.cmdline()
    return False


def children(core: psutil.Process, which: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    try:
        return [p for p in core.children(recursive=True) if which(p) and alive(p.pid)]
    except psutil.Error:
        return []


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _listens(process: psutil.Process, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in process.net_connections("tcp"))
    except psutil.Error:
        return False


def stats_files(pids: set[int]) -> list[str]:
    """The front-end workers' statistics files in /dev/shm (named after the worker's pid)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    prefixes = tuple(f"reference-server-stats-{pid}-" for pid in pids)
    return sorted(name for name in names if name.startswith(prefixes)) if prefixes else []


# --- recoveries and attribution ------------------------------------------------------------------

#: (model, stub pid or None, monotonic send time) of a good answer → whether it shows recovery.
Predicate = Callable[[str, int | None, float], bool]


class Recoveries:
    """Futures that resolve (to the monotonic time) at the first good answer that satisfies their
    predicate; the load calls `seen` for every good answer."""

    def __init__(self) -> None:
        self._watches: list[tuple[Predicate, asyncio.Future[float]]] = []

    def watch(self, predicate: Predicate) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._watches.append((predicate, future))
        return future

    def seen(self, model: str, pid: int | None, sent_at: float) -> None:
        if not self._watches:
            return
        now = time.monotonic()
        for predicate, future in list(self._watches):
            if future.done():
                self._watches.remove((predicate, future))
            elif predicate(model, pid, sent_at):
                future.set_result(now)
                self._watches.remove((predicate, future))


@dataclass(slots=True)
class Fault:
    kind: str
    at: float  # monotonic
    target: str
    recovered_at: float | None = None
    ended_at: float | None = None  # recovered or given up
    server_failure: str = ""
    failures: Counter[str] = field(default_factory=Counter)
    #: Seconds from the fault to the steps of a recovery (a worker's: its process seen, listening).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


def attribute(faults: list[Fault], errors: list[tuple[float, str]]) -> Counter[str]:
    """Count each error against the latest fault whose window holds it; the unexplained ones back."""
    unexplained: Counter[str] = Counter()
    for at, kind in errors:
        for fault in reversed(faults):
            end = (fault.ended_at if fault.ended_at is not None else float("inf")) + ATTRIBUTION_GRACE_S
            if fault.at <= at <= end:
                fault.failures[kind] += 1
                break
        else:
            unexplained[kind] += 1
    return unexplained


def fault_figures(faults: list[Fault]) -> dict[str, Any]:
    by_kind: dict[str, Any] = {}
    for kind in dict.fromkeys(f.kind for f in faults):
        thrown = [f for f in faults if f.kind == kind]
        recoveries = [f.recovery_s for f in thrown if f.recovery_s is not None]
        failures: Counter[str] = sum((f.failures for f in thrown), Counter())
        by_kind[kind] = {
            "thrown": len(thrown),
            "requests_failed": sum(failures.values()),
            "failed_by_kind": dict(failures.most_common()),
            "recovered": len(recoveries),
            "recovery_s_median": round(statistics.median(recoveries), 3) if recoveries else None,
            "recovery_s_max": round(max(recoveries), 3) if recoveries else None,
            "server_failures": [f.server_failure for f in thrown if f.server_failure],
        }
        for phase in dict.fromkeys(name for f in thrown for name in f.phases):
            seconds = [f.phases[phase] for f in thrown if phase in f.phases]
            by_kind[kind][f"{phase}_s_median"] = round(statistics.median(seconds), 3)
            by_kind[kind][f"{phase}_s_max"] = round(max(seconds), 3)
    return by_kind


# --- the injector --------------------------------------------------------------------------------


class FaultInjector:
    """Throws the faults of `kinds` at random times (gaps uniform in 0.5-1.5 x `every_s`, from `rng`)
    at the server whose core is `core_pid`, until `stop`; remembers every server process it saw."""

    def __init__(
        self,
        core_pid: int,
        http_url: str,
        kinds: list[str],
        every_s: float,
        rng: random.Random,
        stall_timeout_s: float,
        recoveries: Recoveries,
        repository_lock: asyncio.Lock,
        probe: Callable[[], tuple[bytes, dict[str, str], np.ndarray]],
    ) -> None:
        self.core = psutil.Process(core_pid)
        self.http_url, self.kinds, self.every_s, self.rng = http_url, kinds, every_s, rng
        self.stall_timeout_s, self.recoveries, self.repository_lock = stall_timeout_s, recoveries, repository_lock
        self.probe = probe  # () -> an identity request's (body, headers, expected payload)
        self.faults: list[Fault] = []
        self.skipped: Counter[str] = Counter()
        self.pids: set[int] = {core_pid}  # every server process seen, for the check that none is left
        self.stub_pids: set[int] = set()
        self.worker_pids: set[int] = set()

    def note_processes(self) -> None:
        for process in children(self.core, is_stub):
            self.stub_pids.add(process.pid)
        for process in children(self.core, is_worker):
            self.worker_pids.add(process.pid)
        self.pids |= self.stub_pids | self.worker_pids

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds of faults, each kind once a round in a random order, a random gap before each, until
        `stop`; then the round in progress is finished without gaps (so that a short run throws every
        kind). A kind that cannot be thrown when its turn comes (no worker old enough) waits for the next."""
        timeout = aiohttp.ClientTimeout(total=60)
        round_: list[str] = []
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set() or round_:
                self.note_processes()
                if not stop.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.every_s * self.rng.uniform(0.5, 1.5))
                if not round_:
                    if stop.is_set() or not self.kinds:
                        continue  # the round is done (or there are no faults: processes noted alone)
                    round_ = self.rng.sample(self.kinds, len(self.kinds))
                for kind in list(round_):
                    if await self.throw(kind, session):
                        round_.remove(kind)
                        break
                    self.skipped[kind] += 1
                else:
                    if stop.is_set():
                        round_.clear()  # none of the rest can be thrown now: not worth waiting for

    async def throw(self, kind: str, session: aiohttp.ClientSession) -> bool:
        if kind in ("stub-kill", "stub-stall"):
            return await self._stub(kind)
        if kind == "worker-kill":
            return await self._worker()
        if kind == "unload":
            return await self._unload(session)
        raise ValueError(f"unknown fault kind {kind!r}: choose from {', '.join(KINDS)}")

    async def _stub(self, kind: str) -> bool:
        stubs = children(self.core, is_stub)
        if not stubs:
            return False  # between a stub's death and its successor
        stub = self.rng.choice(stubs)
        fault = Fault(kind, time.monotonic(), f"stub {stub.pid}")
        recovered = self.recoveries.watch(lambda model, pid, _: model == PY_MODEL and pid not in (None, stub.pid))
        self.faults.append(fault)
        os.kill(stub.pid, signal.SIGSTOP if kind == "stub-stall" else signal.SIGKILL)
        self.stub_pids.add(stub.pid)
        if kind == "stub-stall":
            deadline = fault.at + self.stall_timeout_s + STALL_MARGIN_S
            # Polled: a process's end in another's hands sets no event here.
            while alive(stub.pid) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if alive(stub.pid):
                fault.server_failure = f"stub {stub.pid} still stopped {deadline - fault.at:.1f} s after SIGSTOP"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stub.pid, signal.SIGKILL)
        await self._recovered(fault, recovered)
        return True

    async def _worker(self) -> bool:
        now = time.time()
        workers = [w for w in children(self.core, is_worker) if now - w.create_time() >= WORKER_MIN_AGE_S]
        if not workers:
            return False
        worker = self.rng.choice(workers)
        before = {w.pid for w in children(self.core, is_worker)}
        fault = Fault("worker-kill", time.monotonic(), f"worker {worker.pid}")
        self.faults.append(fault)
        os.kill(worker.pid, signal.SIGKILL)
        deadline = fault.at + RECOVERY_GIVE_UP_S
        new: psutil.Process | None = None
        while new is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            new = next((w for w in children(self.core, is_worker) if w.pid not in before), None)
        if new is not None:
            self.worker_pids.add(new.pid)
            self.pids.add(new.pid)
            fault.target += f" -> {new.pid}"
            fault.phases["spawned"] = time.monotonic() - fault.at
            port = int(self.http_url.rsplit(":", 1)[1])
            while not _listens(new, port) and time.monotonic() < deadline:  # noqa: ASYNC110 (polled, as above)
                await asyncio.sleep(0.05)
            fault.phases["listening"] = time.monotonic() - fault.at
            # New connections until one lands on the new worker (SO_REUSEPORT spreads them) and is answered.
            while fault.recovered_at is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError, EOFError, v2.CodecError, psutil.Error):
                    if await asyncio.wait_for(self._answered_by(new), 10):
                        fault.recovered_at = time.monotonic()
                await asyncio.sleep(0.02)
        fault.ended_at = time.monotonic()
        return True

    async def _answered_by(self, worker: psutil.Process) -> bool:
        """One identity request on a new connection: whether `worker` took it and answered it right.
        Plain HTTP/1.1 on a stream of its own, so that the connection's port is known while it is open."""
        body, headers, expected = self.probe()
        host, port = self.http_url.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            # Kept alive (no "Connection: close"): the worker holds the connection until it is seen holding it.
            head = ["POST /v2/models/identity/infer HTTP/1.1", f"Host: {self.http_url}"]
            head += [f"{name}: {value}" for name, value in headers.items()] + [f"Content-Length: {len(body)}"]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            local_port = writer.get_extra_info("sockname")[1]
            mine = any(c.raddr and c.raddr.port == local_port for c in worker.net_connections("tcp"))
            fields = dict(line.split(": ", 1) for line in lines if ": " in line)
            fields = {name.lower(): value for name, value in fields.items()}
            payload = await reader.readexactly(int(fields.get("content-length", "0")))
        finally:
            writer.close()
        if not mine or status_line.split(" ")[1:2] != ["200"]:
            return False
        header = fields.get("inference-header-content-length")
        decoded = v2.decode_infer_response(payload, int(header) if header else None)
        output = next((t for t in decoded.outputs if t.name == "OUTPUT0"), None)
        return output is not None and np.array_equal(np.asarray(output.data).reshape(-1), expected)

    async def _unload(self, session: aiohttp.ClientSession) -> bool:
        model = self.rng.choice(["identity", PY_MODEL])
        async with self.repository_lock:  # not in the middle of a reload of identity
            fault = Fault("unload", time.monotonic(), model)
            self.faults.append(fault)
            base = f"http://{self.http_url}/v2/repository/models/{model}"
            async with session.post(f"{base}/unload", json={}) as response:
                unloaded = response.status
            async with session.post(f"{base}/load", json={}) as response:
                loaded = response.status
            loaded_at = time.monotonic()
        if (unloaded, loaded) != (200, 200):
            fault.server_failure = f"unload answered {unloaded}, load {loaded}"
        recovered = self.recoveries.watch(lambda m, _, sent_at: m == model and sent_at >= loaded_at)
        await self._recovered(fault, recovered)
        self.note_processes()  # the echo model's new stub
        return True

    async def _recovered(self, fault: Fault, recovered: asyncio.Future[float]) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            fault.recovered_at = await asyncio.wait_for(
                asyncio.shield(recovered), max(0.0, fault.at + RECOVERY_GIVE_UP_S - time.monotonic())
            )
        recovered.cancel()
        fault.ended_at = time.monotonic()

    def kill_core(self) -> Fault:
        """kill -9 the core (the run's last fault): its workers and stubs must end by themselves."""
        self.note_processes()
        fault = Fault("core-kill", time.monotonic(), f"core {self.core.pid}")
        self.faults.append(fault)
        os.kill(self.core.pid, signal.SIGKILL)
        return fault

    async def orphans(self, fault: Fault) -> list[int]:
        """After the core's kill: the server processes still alive after ORPHAN_GRACE_S (SIGKILLed
        here, and counted as the server's failure)."""
        deadline = time.monotonic() + ORPHAN_GRACE_S
        left = [pid for pid in self.pids if pid != self.core.pid and alive(pid)]
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            left = [pid for pid in left if alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if left:
            fault.server_failure = f"{len(left)} processes outlived the core by {ORPHAN_GRACE_S:.0f} s: {left}"
        fault.recovered_at = None
        fault.ended_at = time.monotonic()
        return left


def leftovers(injector: FaultInjector) -> dict[str, list[Any]]:
    """Once the server has stopped: its processes still alive, and its workers' /dev/shm files."""
    return {
        "processes": sorted(pid for pid in injector.pids if alive(pid)),
        "shm_files": stats_files(injector.worker_pids),
    }
