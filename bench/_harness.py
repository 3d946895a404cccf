"""Shared bench plumbing: runs of NVIDIA's perf_analyzer, and the repository load API."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import psutil

from perfkit.target import reference_server_process
from perfkit.testing.triton import triton_server


def peers_dir() -> Path:
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        sys.exit("PERFKIT_PEERS is not set: run `bash peers/install.sh DIR` and export PERFKIT_PEERS=DIR")
    return Path(value)


def load_model(url: str, name: str, config: dict[str, object]) -> None:
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    request = urllib.request.Request(f"http://{url}/v2/repository/models/{name}/load", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def perf_analyzer(
    peers: Path, model: str, url: str, out_csv: Path, args: Sequence[str], attempts: int = 1
) -> list[dict[str, str]]:
    """perf_analyzer's CSV rows; with `attempts` > 1 it runs again when it found no stable
    measurement (exit 2), which a shared, loaded machine causes now and then."""
    command = [str(peers / "bin" / "perf_analyzer"), "-m", model, "-u", url, "-f", str(out_csv), *args]
    for attempt in range(1, attempts + 1):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode == 0:
            with out_csv.open() as handle:
                return list(csv.DictReader(handle))
        if result.returncode != 2 or attempt == attempts:
            break
        print(f"perf_analyzer found no stable measurement, again ({attempt}/{attempts})", file=sys.stderr)
    raise RuntimeError(f"perf_analyzer failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")


@dataclass(frozen=True, slots=True)
class TimedRun:
    result: subprocess.CompletedProcess[str]
    cpu_s: float  # user + system CPU of the command and of every process it waited for
    wall_s: float


def run_timed(command: Sequence[str], timeout_s: float) -> TimedRun:
    """Run `command` to its end and measure its CPU from RUSAGE_CHILDREN deltas.

    RUSAGE_CHILDREN counts only children that have ended and been waited for, so a server that this
    process started and that is still running (reference_server_process) is not counted. Run one
    command at a time: a child that ends meanwhile would be counted too.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return TimedRun(result, cpu_s, wall_s)


@dataclass(frozen=True, slots=True)
class ServerTimes:
    """Cumulative figures of one model's statistics extension, summed over its versions (ns)."""

    success_count: int
    request_ns: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int

    def __sub__(self, other: ServerTimes) -> ServerTimes:
        return ServerTimes(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(ServerTimes)))

    def per_request_us(self, field: str) -> float:
        return getattr(self, field) / self.success_count / 1000 if self.success_count else float("nan")

    @property
    def overhead_us(self) -> float:
        """perf_analyzer's "overhead": request time minus queue and the three compute phases, per request."""
        if not self.success_count:
            return float("nan")
        unaccounted = self.request_ns - self.queue_ns - self.compute_input_ns - self.compute_infer_ns
        return max(0.0, (unaccounted - self.compute_output_ns) / self.success_count / 1000)


def server_times(http_url: str, model: str) -> ServerTimes:
    stats = get_json(f"http://{http_url}/v2/models/{model}/stats")
    assert isinstance(stats, dict)
    totals = [0] * 6
    for entry in stats["model_stats"]:
        inference = entry["inference_stats"]
        phases = ("success", "queue", "compute_input", "compute_infer", "compute_output")
        totals[0] += int(inference["success"]["count"])
        for index, phase in enumerate(phases, start=1):
            totals[index] += int(inference[phase]["ns"])
    return ServerTimes(*totals)


def success_count(http_url: str, model: str) -> int:
    """The server's cumulative count of successful requests for `model` (statistics extension)."""
    return server_times(http_url, model).success_count


def process_cpu_s(pid: int) -> float:
    """User + system CPU of one process (a server without its stubs)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def tree_cpu_s(pid: int) -> float:
    """User + system CPU of a process and its live descendants (Triton's python stubs, for one)."""
    total = 0.0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def machine(peers: Path | None = None) -> str:
    """nproc, CPU model, OS, Python, perf_analyzer's version and the load average, for table headers."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python {platform.python_version()}"
    if peers is not None:
        result = subprocess.run(
            [str(peers / "bin" / "perf_analyzer"), "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        version = result.stdout.strip().splitlines()[0] if result.stdout.strip() else "perf_analyzer ?"
        text += f", {version}"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{text}; load average {load}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b and a == a and b == b else "n/a"


def perfkit_command(url: str, model: str, protocol: str, args: Sequence[str], out: Path) -> list[str]:
    """`python -m perfkit sweep` writing its CSV and JSON result into `out`, without the HTML report."""
    return [
        sys.executable, "-m", "perfkit", "sweep", "-m", model, "-u", url, "-i", protocol, *args,
        "-f", str(out / "perfkit.csv"), "--report-dir", str(out / "reports"), "--quiet", "--no-report",
    ]  # fmt: skip


def perfkit_levels(out: Path) -> list[dict[str, object]]:
    """The levels of the JSON result a `perfkit_command` run wrote into `out` (empty if none)."""
    paths = sorted((out / "reports").glob("sweep-*.json"))
    if not paths:
        return []
    levels = json.loads(paths[-1].read_text())["levels"]
    assert isinstance(levels, list)
    return levels


@dataclass(frozen=True, slots=True)
class ServedRun:
    """A client run against a server we started: the client's own CPU and what the server did meanwhile."""

    timed: TimedRun
    server_requests: int
    server_cpu_s: float


def served_run(command: Sequence[str], http_url: str, model: str, server_pid: int, timeout_s: float) -> ServedRun:
    requests_before = success_count(http_url, model)
    cpu_before = tree_cpu_s(server_pid)
    timed = run_timed(command, timeout_s)
    cpu_s = tree_cpu_s(server_pid) - cpu_before
    return ServedRun(timed, success_count(http_url, model) - requests_before, cpu_s)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One running server: its HTTP and gRPC addresses and its process (children included in CPU)."""

    http_url: str
    grpc_url: str
    pid: int


@contextlib.contextmanager
def both_servers(
    peers: Path, ours: Path, triton: Path, *, our_args: Sequence[str] = (), cpus: Sequence[int] | None = None
) -> Iterator[dict[str, Endpoint]]:
    """The reference server on `ours` (with `our_args`) and real tritonserver on `triton` (the same
    folder, or one written for each), on free loopback ports, both stopped when the block ends;
    with `cpus`, each server's processes (its workers, Triton's stubs) may run on those CPUs only."""
    with reference_server_process(ours, our_args) as our_server, triton_server(peers, triton) as triton_process:
        endpoints = {
            "ours": Endpoint(our_server.http_url, our_server.grpc_url, our_server.process.pid),
            "triton": Endpoint(triton_process.http_url, triton_process.grpc_url, triton_process.process.pid),
        }
        if cpus is not None:
            for endpoint in endpoints.values():
                pin_tree(endpoint.pid, cpus)
        yield endpoints


def pin_tree(pid: int, cpus: Sequence[int]) -> None:
    """Restrict a process, its children and every thread of theirs to `cpus` (what they start
    later inherits it)."""
    process = psutil.Process(pid)
    for member in [process, *process.children(recursive=True)]:
        for thread in member.threads():
            os.sched_setaffinity(thread.id, set(cpus))
