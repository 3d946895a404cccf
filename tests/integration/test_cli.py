"""The command lines as a person runs them: perfkit-server as a process, perfkit probe."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from perfkit.target import reference_server_process
from tests.servers import write_identity_model

pytestmark = pytest.mark.integration


def http(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(predicate, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_server_process_binds_free_ports_and_exits_cleanly_on_sigterm(demo_repository: Path) -> None:
    with reference_server_process(demo_repository) as server:
        assert set(server.ports) >= {"HTTPService", "Metrics Service"}
        assert all(port > 0 for port in server.ports.values())
        assert http(f"http://{server.http_url}/v2/health/ready")[0] == 200
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0


def test_sigterm_lets_in_flight_requests_finish(repository_copy: Path) -> None:
    # Requests wait 1.5 s in the batcher for a batch of 4 that never comes: they are in flight.
    write_identity_model(
        repository_copy,
        "slow",
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1500000 }",
    )
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    with reference_server_process(repository_copy, ["--exit-timeout-secs", "30"]) as server:
        results: list[tuple[int, bytes]] = []
        senders = [
            threading.Thread(
                target=lambda: results.append(http(f"http://{server.http_url}/v2/models/slow/infer", body))
            )
            for _ in range(2)
        ]
        for sender in senders:
            sender.start()

        def pending() -> int:
            _, metrics = http(server.metrics_url)
            for line in metrics.decode().splitlines():
                if line.startswith('nv_inference_pending_request_count{model="slow"'):
                    return int(float(line.rsplit(" ", 1)[1]))
            return 0

        wait_until(lambda: pending() == 2, "two requests queued in the batcher")
        server.process.send_signal(signal.SIGTERM)
        for sender in senders:
            sender.join(60)
        assert server.process.wait(60) == 0
    assert [status for status, _ in results] == [200, 200]
    assert all(json.loads(payload)["outputs"][0]["data"] == [1, 2] for _, payload in results)


def test_server_refuses_a_missing_repository_with_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reference_server", "--model-repository", str(tmp_path / "nope"), "--http-port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "nope" in result.stderr and "--model-repository" in result.stderr


def test_server_flags_follow_tritonserver() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reference_server", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port", "--model-control-mode",
                 "--load-model", "--log-verbose", "--strict-readiness", "--exit-timeout-secs"):  # fmt: skip
        assert flag in result.stdout


def test_perfkit_probe_on_the_embedded_default(tmp_path: Path) -> None:
    env = {"PERFKIT_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "perfkit", "probe", "-n", "5"], capture_output=True, text=True, timeout=300,
        check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for model in ("mlp", "convnet", "identity"):
        assert any(line.startswith(model) and "5/5" in line for line in result.stdout.splitlines()), result.stdout


def test_perfkit_probe_reports_an_unreachable_server() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "perfkit", "probe", "-u", "127.0.0.1:9"], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot reach http://127.0.0.1:9")
    assert "-u" in result.stderr
