"""The server's startup line tells the truth: "Server ready" only once /v2/health/ready answers 200;
with --strict-readiness (the default) and a model that failed to load, "Server not ready", and the
log names the model that keeps it so and why, until it no longer does."""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

#: Wide: a server process on a busy 2-core machine may take several seconds to import and load.
LINE_TIMEOUT_S = 60.0


def _status(port: int, method: str, path: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_ready_line_and_the_ready_route_agree(demo_repository: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", models / "identity")
    (models / "broken" / "1").mkdir(parents=True)  # no model file: it fails to load
    (models / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "onnxruntime"\n')
    log_path = tmp_path / "server.log"
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(models), "--frontend-workers", "1",
        "--model-control-mode", "explicit", "--load-model", "identity", "--load-model", "broken",
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--allow-grpc", "false",
    ]  # fmt: skip
    with log_path.open("w") as log:
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in server.stdout or ():
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def next_line() -> str:
        try:
            return lines.get(timeout=LINE_TIMEOUT_S).rstrip("\n")
        except queue.Empty:
            raise AssertionError(
                f"no line from the server within {LINE_TIMEOUT_S:g} s:\n{log_path.read_text()}"
            ) from None

    try:
        started = [next_line() for _ in range(3)]
        port = int(re.fullmatch(r"Started HTTPService at 127\.0\.0\.1:(\d+)", started[0]).group(1))  # type: ignore[union-attr]
        assert started[1].startswith("Started Metrics Service at ")
        assert started[2] == "Server not ready: 'broken'"
        assert _status(port, "GET", "/v2/health/ready") == 400
        log_text = log_path.read_text()
        assert "model 'broken' is UNAVAILABLE (" in log_text and "it keeps the server not ready" in log_text
        assert "/v2/health/ready answers 400 until 'broken' is ready" in log_text
        assert "identity' is" not in log_text  # the model that serves is not named
        shutil.copytree(models / "identity", models / "broken", dirs_exist_ok=True)  # mended, then loaded
        config = (models / "identity" / "config.pbtxt").read_text().replace('"identity"', '"broken"')
        (models / "broken" / "config.pbtxt").write_text(config)
        assert _status(port, "POST", "/v2/repository/models/broken/load") == 200
        assert next_line() == "Server ready"  # once the route agrees, and not before
        assert _status(port, "GET", "/v2/health/ready") == 200
    finally:
        server.terminate()
        server.wait(30)
        reader.join(10)  # at the end of its output
        assert server.stdout is not None
        server.stdout.close()
