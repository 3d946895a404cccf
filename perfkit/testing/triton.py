"""Run NVIDIA's real tritonserver (from the peers folder) on loopback, for tests and benchmarks.

`triton_server(peers, repository)` picks free loopback ports, starts `peers/bin/tritonserver` in a
new session (its own process group, with the python backend's stub processes), waits for
`/v2/health/ready`, yields a `TritonProcess`, and always stops it: SIGTERM to tritonserver, a
grace period, then SIGKILL to the whole process group, so that neither tritonserver nor a stub
outlives the `with` block, whether the body returns or raises; a killed stub's shared-memory
region, which only a stub that unloads in time removes, is removed from /dev/shm.

Free ports are found by binding port 0 and closing the sockets before tritonserver binds them, so
another process can take one in between; when tritonserver then fails to bind, the start is
retried once on fresh ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TritonProcess", "TritonStartError", "free_ports", "triton_server"]

HOST = "127.0.0.1"
# What tritonserver logs when a listener cannot bind: "failed to start HTTP service: Unavailable -
# Socket '127.0.0.1:PORT' already in use" (likewise GRPC and Metrics), then it exits with status 1.
_BIND_ERRORS = ("already in use",)
_STUB_REGION_PREFIX = "/dev/shm/triton_python_backend_shm_region_"


class TritonStartError(RuntimeError):
    """tritonserver exited or did not become ready during start; the message ends with its log tail."""


@dataclass(frozen=True, slots=True)
class TritonProcess:
    """A running tritonserver. URLs are in tritonclient's and perf_analyzer's `-u` form (`HOST:PORT`)."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The full Prometheus scrape URL."""
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def log_tail(self, max_lines: int = 20) -> str:
        """The log's error lines and its last lines, without the wide option and model tables."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            return f"(no log: {error})"
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("|", "+"))]
        # Triton's severity letter and date start a line: E1122 03:20:37.225953 ...; `error:` ends a failed start.
        errors = [line for line in lines if re.match(r"E\d{4} |error:|Error:", line)]
        return "errors:\n" + "\n".join(errors[-max_lines:]) + "\nlast lines:\n" + "\n".join(lines[-max_lines:])


@contextlib.contextmanager
def triton_server(
    peers: Path,
    repository: Path,
    *,
    extra_args: Sequence[str] = (),
    start_timeout_s: float = 120,
    exit_timeout_s: int = 5,
    stop_timeout_s: float = 30,
    log_path: Path | None = None,
) -> Iterator[TritonProcess]:
    """Start tritonserver on `repository` on free loopback ports; yield once it is ready; stop it.

    `extra_args` are appended to the command line (for example `--model-control-mode=explicit`),
    after ours, so they can override them.
    Output goes to `log_path`, or to a temporary file that is removed after a clean stop and kept
    (its path is in the error) when start fails or the body raises. Raises `TritonStartError` when
    tritonserver exits or is not ready within `start_timeout_s`.

    On exit, tritonserver gets SIGTERM and `stop_timeout_s` to stop before its process group is
    killed (0: killed at once, for a caller that does not need the graceful stop, which takes a
    second or more and about 2 s with python models). It is started with `--exit-timeout-secs=exit_timeout_s` (Triton's default is 30): on
    SIGTERM it gives open HTTP connections (even idle keep-alive ones that a client object still
    holds), then in-flight inferences, then model unloading (about 1-3 s for python models) that
    one budget in total, and exits at once when it runs out, leaving its stubs to our SIGKILL.
    """
    own_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    clean = False
    try:
        for attempt in (1, 2):
            args = [f"--exit-timeout-secs={exit_timeout_s}", *extra_args]
            server = _start(peers, repository, args, log_path)
            try:
                _wait_ready(server, start_timeout_s)
            except TritonStartError:
                exited = server.process.poll() is not None
                _stop(server.process, stop_timeout_s)
                if attempt == 1 and exited and _bind_failed(server):
                    continue  # a port we picked was taken before tritonserver bound it
                raise
            except BaseException:
                _stop(server.process, stop_timeout_s)
                raise
            break
        try:
            yield server
        finally:
            died = server.process.poll()  # exited by itself before it was stopped: keep its log
            _stop(server.process, stop_timeout_s)
        if died is not None:
            print(f"tritonserver exited with {died} before it was stopped; its log: {log_path}", file=sys.stderr)
        clean = died is None
    finally:
        if own_log and clean:
            log_path.unlink(missing_ok=True)


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (held together, so distinct)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _start(peers: Path, repository: Path, extra_args: Sequence[str], log_path: Path) -> TritonProcess:
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [
        str(Path(peers) / "bin" / "tritonserver"),
        f"--model-repository={Path(repository).resolve()}",
        f"--backend-directory={Path(peers).resolve() / 'backends'}",
        f"--http-address={HOST}",
        f"--http-port={http_port}",
        f"--grpc-address={HOST}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={HOST}",
        f"--metrics-port={metrics_port}",
        *extra_args,
    ]
    if not any("shm-region-prefix-name" in arg for arg in extra_args):
        # The python backend names its stubs' regions <prefix>1, <prefix>2, ... in every server, so
        # two tritonservers on one machine (a test's and a bench's) would open each other's regions
        # and abort (boost::interprocess::lock_exception); the python_backend README's remedy.
        prefix = f"{_STUB_REGION_PREFIX.removeprefix('/dev/shm/')}{os.getpid()}_{http_port}_"
        command.append(f"--backend-config=python,shm-region-prefix-name={prefix}")
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        # A new session: SIGINT from a terminal does not reach it (we stop it ourselves), and the
        # python backend's stubs share its process group, so one killpg reaches them all.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_stub_environment(),
        )
    return TritonProcess(process, http_port, grpc_port, metrics_port, log_path)


def _stub_environment() -> dict[str, str]:
    """Our environment without an activated virtual environment.

    The python backend's stub embeds Debian's Python 3.11, which finds a `python3` on PATH and, next
    to it, the venv's pyvenv.cfg: it would then import the venv's numpy 2 beside an onnxruntime
    built for numpy 1, and every model would answer with empty tensors.
    """
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONPATH", None)
    prefixes = [p for p in (venv, sys.prefix if sys.prefix != sys.base_prefix else None) if p]
    env["PATH"] = os.pathsep.join(
        part
        for part in env.get("PATH", "").split(os.pathsep)
        if not any(Path(part).resolve().is_relative_to(Path(prefix).resolve()) for prefix in prefixes)
    )
    return env


def _wait_ready(server: TritonProcess, timeout_s: float) -> None:
    url = f"http://{server.http_url}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while True:
        code = server.process.poll()
        if code is not None:
            raise TritonStartError(
                f"tritonserver exited with status {code} during start ({server.log_path}); {server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or listening but not ready (400)
        if time.monotonic() > deadline:
            raise TritonStartError(
                f"tritonserver was not ready after {timeout_s:g} s ({server.log_path}); {server.log_tail()}"
            )
        time.sleep(0.1)


def _bind_failed(server: TritonProcess) -> bool:
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    return any(marker in log for marker in _BIND_ERRORS)


def _stop(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL the process group; reap in any case; remove
    the shared-memory regions of the python backend's stubs that a kill left behind."""
    regions = _stub_regions(process.pid)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
    # Also after a clean exit: a stub that outlived tritonserver still holds the group id (the
    # kernel does not reuse it while the group has members), so this reaches only our processes.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    _await_group_gone(process.pid, timeout_s=10.0)
    # A stub unloaded in time removes its region; one killed leaves it (1 MiB or more) in /dev/shm.
    for region in regions:
        with contextlib.suppress(OSError):
            region.unlink(missing_ok=True)


def _await_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait (bounded) until no live process is left in the group: SIGKILL is delivered at once, but a
    stub takes a moment to die, and the caller is promised that nothing of the server outlives it."""
    deadline = time.monotonic() + timeout_s
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _stub_regions(pgid: int) -> set[Path]:
    """The python backend's shared-memory regions that the group's processes map: each stub maps its
    own (`triton_python_backend_stub MODEL.py REGION ...`), and tritonserver maps it until it removes
    it, so a region whose stub has exited during an unload is found too."""
    regions = set()
    for pid in _live_members(pgid):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue  # gone meanwhile
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith(_STUB_REGION_PREFIX) and not path.endswith(" (deleted)"):
                regions.add(Path(path))
    return regions


def _live_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # After the command's closing parenthesis: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members
