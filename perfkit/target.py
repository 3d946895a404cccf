"""The embedded default target: the bundled reference server, started as a child process on free
loopback ports for the duration of one command, on the demo model repository unless told otherwise.

A child process rather than a thread, so that the server's work never competes with the load
generator for the interpreter lock and a crash on one side is seen as such by the other.
"""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from perfkit.errors import TargetError

_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService|Metrics Service) at (\S+):(\d+)")


@dataclass(frozen=True, slots=True)
class ServerProcess:
    process: subprocess.Popen[str]
    host: str
    ports: dict[str, int]  # "HTTPService" / "GRPCInferenceService" / "Metrics Service" → bound port
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports['HTTPService']}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['GRPCInferenceService']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports['Metrics Service']}/metrics"


@contextlib.contextmanager
def reference_server_process(
    model_repository: Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    start_timeout_s: float = 180.0,
    stop_timeout_s: float = 60.0,
) -> Iterator[ServerProcess]:
    """Run `python -m reference_server` on 127.0.0.1 with free ports until the block ends.

    Waits until every listener has printed its bound port. The server's log goes to a temporary
    file whose tail is quoted if the server fails to start.
    """
    if model_repository is None:
        from v2kit.demo import ensure_demo_repository

        model_repository = ensure_demo_repository()
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(model_repository),
        "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *extra_args,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="perfkit-server-") as tmp:
        log_path = Path(tmp) / "server.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
            try:
                ports = _wait_for_listeners(process, log_path, start_timeout_s)
                yield ServerProcess(process, "127.0.0.1", ports, log_path)
            finally:
                _stop(process, stop_timeout_s)


def _wait_for_listeners(process: subprocess.Popen[str], log_path: Path, timeout_s: float) -> dict[str, int]:
    """Read the server's startup lines until "Server ready", the process exits, or time runs out."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
            if line.startswith("Server ready"):
                break
        else:
            lines.put(None)

    threading.Thread(target=read, name="reference-server-stdout", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    ports: dict[str, int] = {}
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TargetError(f"the reference server did not start within {timeout_s:.0f} s; log: {log_path}") from None
        if line is None:
            code = process.wait()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise TargetError(f"the reference server exited with code {code} before listening:\n{tail}")
        match = _STARTED.search(line)
        if match:
            ports[match.group(1)] = int(match.group(3))
        if line.startswith("Server ready"):
            return ports


def _stop(process: subprocess.Popen[str], timeout_s: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
