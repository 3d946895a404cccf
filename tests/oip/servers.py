"""Start the real MLServer and KServe model servers from PERFKIT_PEERS on free loopback ports.

`running_mlserver(peers, workdir)` and `running_kserve(peers, workdir)` start one server serving
`addone` (this folder's fixtures), wait until it is ready on HTTP and listening on gRPC, yield an
`OipServer`, and kill its whole process group when the block ends: no test that uses them is
about a graceful stop. Free ports are found by binding port 0 and closing the socket, so another
process can take one before the server binds it; a server that exits during start is started once
more on fresh ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfkit.testing.triton import free_ports

HOST = "127.0.0.1"
FIXTURES = Path(__file__).parent
# MLServer and KServe are ready in about 1 s on an idle machine; a 2-core machine running the suite
# and other servers can take many times that.
START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class OipServer:
    """A running server: its name ("mlserver", "kserve") and its addresses in `-u` form (HOST:PORT)."""

    name: str
    http_url: str
    grpc_url: str
    log_path: Path

    def url(self, protocol: str) -> str:
        return self.http_url if protocol == "http" else self.grpc_url


class OipStartError(RuntimeError):
    """The server exited or was not ready in time; the message ends with its log's tail."""


def oip_peer(tool: str) -> Path:
    """PERFKIT_PEERS/bin/`tool` (mlserver, kserve-python); the test skips when PERFKIT_PEERS is unset
    and fails when the peers there lack it (peers/install.sh installs them; CI must not skip)."""
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        pytest.skip(
            f"PERFKIT_PEERS is not set: install the peers ({tool} among them) with `bash peers/install.sh DIR` "
            "and set PERFKIT_PEERS=DIR to run the tests against MLServer and KServe"
        )
    executable = Path(value) / "bin" / tool
    if not executable.exists():
        pytest.fail(f"PERFKIT_PEERS={value} has no bin/{tool}; rerun `bash peers/install.sh {value}`")
    return executable


@contextlib.contextmanager
def running_mlserver(mlserver: Path, workdir: Path, *, triton_config: bool = False) -> Iterator[OipServer]:
    """MLServer (`mlserver`: PERFKIT_PEERS/bin/mlserver) serving mlserver_addone/ from a copy in
    `workdir`. `triton_config=True` serves AddOneWithTritonConfig instead, which also answers
    GET /v2/models/addone/config, for perf_analyzer."""

    def command(http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        folder = workdir / f"mlserver-{http_port}"
        shutil.copytree(FIXTURES / "mlserver_addone", folder)
        settings = json.loads((folder / "settings.json").read_text())
        settings.update(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
        (folder / "settings.json").write_text(json.dumps(settings))
        if triton_config:
            model = folder / "addone" / "model-settings.json"
            model_settings = json.loads(model.read_text())
            model_settings["implementation"] = "addone.AddOneWithTritonConfig"
            model.write_text(json.dumps(model_settings))
        return [str(mlserver), "start", str(folder)]

    with _running("mlserver", command, workdir) as server:
        yield server


@contextlib.contextmanager
def running_kserve(kserve_python: Path, workdir: Path) -> Iterator[OipServer]:
    """KServe's ModelServer (`kserve_python`: PERFKIT_PEERS/bin/kserve-python) running kserve_addone.py."""

    def command(http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        script = str(FIXTURES / "kserve_addone.py")
        return [str(kserve_python), script, "--http_port", str(http_port), "--grpc_port", str(grpc_port)]

    with _running("kserve", command, workdir) as server:
        yield server


@contextlib.contextmanager
def _running(name: str, command: Callable[[int, int, int], Sequence[str]], workdir: Path) -> Iterator[OipServer]:
    for attempt in (1, 2):
        http_port, grpc_port, metrics_port = free_ports(3)
        log_path = workdir / f"{name}-{http_port}.log"
        with log_path.open("wb") as log:
            # A new session: one killpg reaches the server and any worker process it starts.
            process = subprocess.Popen(
                command(http_port, grpc_port, metrics_port),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
        server = OipServer(name, f"{HOST}:{http_port}", f"{HOST}:{grpc_port}", log_path)
        try:
            _wait_ready(process, server, grpc_port)
        except OipStartError:
            exited = process.poll() is not None
            _kill(process)
            if attempt == 1 and exited:
                continue  # most likely a port we picked was taken before the server bound it
            raise
        except BaseException:
            _kill(process)
            raise
        try:
            yield server
        finally:
            _kill(process)
        return


def _wait_ready(process: subprocess.Popen[bytes], server: OipServer, grpc_port: int) -> None:
    """Until /v2/health/ready answers 200 and the gRPC port accepts a connection: both servers
    start their gRPC listener apart from the HTTP one."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (_http_ready(server.http_url) and _listening(grpc_port)):
        code = process.poll()
        if code is not None:
            raise OipStartError(f"{server.name} exited with status {code} during start; {_tail(server.log_path)}")
        if time.monotonic() > deadline:
            raise OipStartError(f"{server.name} was not ready after {START_TIMEOUT_S:g} s; {_tail(server.log_path)}")
        time.sleep(0.1)


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False  # not listening yet, or not ready


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex((HOST, port)) == 0


def _tail(log_path: Path, lines: int = 20) -> str:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return f"its log ({log_path}) ends:\n" + "\n".join(text.splitlines()[-lines:])


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
