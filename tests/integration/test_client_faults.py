"""perfkit sweep against a server that breaks mid-sweep: stalls, resets connections, closes them, or
answers garbage (perfkit.testing.faults between perfkit and the reference server).

Each run must count its failures by kind, keep every finished level on disk (the CSVs parse and
hold one row per level measured, the JSON says why it stopped), say so, exit non-zero, and finish
in bounded time thanks to --request-timeout. A server killed outright and Ctrl-C are covered by the
sweep's own tests (test_sweep_cli.py).
"""

from __future__ import annotations

import contextlib
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from perfkit.cli import build_parser
from perfkit.target import ServerProcess
from perfkit.testing.faults import FaultProxy, fault_proxy

pytestmark = pytest.mark.integration

#: Two levels: the fault strikes once the first is on disk. -p 200 ms windows, at most 3 a level,
#: and a 1 s request timeout keep each run to seconds. The HTML report (a second of CPU a run, for
#: its figures) is written by one run only, the one that ends with a level of errors and answers.
SWEEP_FLAGS = ["-m", "identity", "--shape", "INPUT0:16", "--concurrency-range", "1:2", "-p", "200", "-r", "3"]
REQUEST_TIMEOUT_S = 1.0
RUN_LIMIT_S = 60


@pytest.fixture
def server(demo_server_process: ServerProcess) -> ServerProcess:
    """The reference server in a process of its own, so that it never competes with the proxy; the
    faults are the proxy's, between perfkit and the server, which serves on unharmed."""
    return demo_server_process


def _sweep(url: str, protocol: str, report_dir: Path, *, report: bool = False) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "perfkit", "sweep", "-u", url, "-i", protocol, *SWEEP_FLAGS]
    command += ["--request-timeout", str(REQUEST_TIMEOUT_S), "--report-dir", str(report_dir), "--quiet"]
    command += [] if report else ["--no-report"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _levels_on_disk(report_dir: Path) -> int:
    csvs = [p for p in report_dir.glob("*.csv") if not p.name.endswith("_long.csv")]
    return max(0, len(csvs[0].read_text().splitlines()) - 1) if csvs else 0


def _wait_for_levels(report_dir: Path, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + RUN_LIMIT_S
    while _levels_on_disk(report_dir) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the sweep never finished its first level"
        time.sleep(0.02)


def _finish(process: subprocess.Popen[str], started: float) -> tuple[int, str, float]:
    _, stderr = process.communicate(timeout=RUN_LIMIT_S)
    return process.returncode, stderr, time.monotonic() - started


def _results(report_dir: Path) -> dict:  # type: ignore[type-arg]
    (json_path,) = report_dir.glob("*.json")
    result = json.loads(json_path.read_text())
    levels = result["levels"]
    # Both CSVs parse, have one row per level in the JSON, and every row is complete.
    for path in report_dir.glob("*.csv"):
        rows = list(csv.reader(path.read_text().splitlines()))
        header, body = rows[0], rows[1:]
        assert len(body) == len(levels), (path, len(body), len(levels))
        assert all(len(row) == len(header) for row in body), path
    return result


def _kinds(result: dict) -> set[str]:  # type: ignore[type-arg]
    return {kind for level in result["levels"] for kind in level["errors"]}


FAULTS = [
    # (protocol, fault, error kinds one of which must be counted)
    ("http", "stall", {"timeout"}),
    ("http", "reset", {"connection reset", "connection failed", "connection error", "disconnected"}),
    ("http", "bad_body", {"bad response"}),
    ("grpc", "stall", {"timeout"}),
    ("grpc", "reset", {"connection reset", "grpc UNAVAILABLE"}),
]


@pytest.mark.parametrize(("protocol", "fault", "kinds"), FAULTS, ids=[f"{p}-{f}" for p, f, _ in FAULTS])
def test_a_fault_mid_sweep_is_counted_kept_and_ends_the_run(
    server: ServerProcess, tmp_path: Path, protocol: str, fault: str, kinds: set[str]
) -> None:
    target = server.http_url if protocol == "http" else server.grpc_url
    with fault_proxy(target) as proxy:
        started = time.monotonic()
        process = _sweep(proxy.address, protocol, tmp_path)
        _wait_for_levels(tmp_path, 1, process)
        proxy.set_fault(fault)
        returncode, stderr, elapsed = _finish(process, started)
    # Bounded: a short level, each failed request given up after the request timeout.
    assert elapsed < 40, elapsed
    result = _results(tmp_path)
    first, faulted = result["levels"]
    assert first["errors"] == {} and first["ok_count"] > 0
    assert kinds & set(faulted["errors"]), faulted["errors"]
    assert "wrote " in stderr
    if faulted["ok_count"] == 0 and fault != "bad_body":
        # Nothing but connection failures: the server is gone, and the sweep says so (exit 1).
        assert returncode == 1, stderr
        assert not result["completed"] and "stopped answering" in result["stop_reason"]
        assert "the sweep stopped early: the server stopped answering" in stderr
    else:
        # Some requests failed: the sweep finished, and exit code 4 says requests failed.
        assert returncode == 4, stderr
        assert result["completed"]


#: What a sweep may grow by while a hostile server streams replies without end at it: far below what
#: reading them would take (the proxy streams up to 256 MiB a connection, at loopback speed), far
#: above what the client's bounds let it hold (a 64 KiB head a connection; a 10 GB body refused unread).
HOSTILE_GROWTH_MIB = 150


@pytest.mark.parametrize("fault", ["endless_head", "huge_body"])
def test_a_hostile_server_mid_sweep_costs_counted_errors_not_memory(
    server: ServerProcess, tmp_path: Path, fault: str
) -> None:
    """Replies without end (a header line, a 10 GB body) after the first level: every request fails
    as a bad response, the sweep finishes with exit 4, and its memory stays bounded."""
    with fault_proxy(server.http_url) as proxy:
        started = time.monotonic()
        process = _sweep(proxy.address, "http", tmp_path)
        sweep = psutil.Process(process.pid)
        _wait_for_levels(tmp_path, 1, process)
        baseline = sweep.memory_info().rss
        proxy.set_fault(fault)
        peak = baseline
        while process.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                peak = max(peak, sweep.memory_info().rss)
            assert time.monotonic() - started < RUN_LIMIT_S, "the sweep hung"
            time.sleep(0.01)
        returncode, stderr, elapsed = _finish(process, started)
    assert elapsed < 40, elapsed
    result = _results(tmp_path)
    first, faulted = result["levels"]
    assert first["errors"] == {} and first["ok_count"] > 0
    assert set(faulted["errors"]) == {"bad response"}, faulted["errors"]
    assert returncode == 4 and result["completed"], stderr
    assert (peak - baseline) >> 20 < HOSTILE_GROWTH_MIB, (baseline >> 20, peak >> 20)


def test_a_server_that_drops_everyone_and_comes_back_only_costs_errors(server: ServerProcess, tmp_path: Path) -> None:
    """A restart, as the client sees it: every connection reset, then service as before."""
    with fault_proxy(server.http_url) as proxy:
        started = time.monotonic()
        process = _sweep(proxy.address, "http", tmp_path, report=True)
        _wait_for_levels(tmp_path, 1, process)
        proxy.set_fault("reset")
        time.sleep(0.1)
        proxy.set_fault("none")
        returncode, stderr, _ = _finish(process, started)
    result = _results(tmp_path)
    first, second = result["levels"]
    assert result["completed"]
    assert returncode == 4 and second["errors"], (returncode, stderr)
    assert second["ok_count"] > first["ok_count"] / 10  # served again once the reset was over
    (html,) = tmp_path.glob("*.html")  # the report draws a level of errors and answers
    assert f"wrote {html}" in stderr and "data:image/png;base64," in html.read_text()


@pytest.mark.parametrize("fault", ["stall", "garbage", "reset"])
def test_a_target_broken_from_the_start_is_reported_at_once(tmp_path: Path, fault: str) -> None:
    with fault_proxy(None, fault) as proxy:
        started = time.monotonic()
        process = _sweep(proxy.address, "http", tmp_path)
        returncode, stderr, elapsed = _finish(process, started)
    assert returncode == 1, stderr
    assert stderr.startswith("error: ") and proxy.address in stderr, stderr
    assert elapsed < 20
    assert list(tmp_path.glob("*")) == []  # nothing measured, nothing written


def test_the_request_timeout_has_a_sane_default() -> None:
    args = build_parser().parse_args(["sweep"])
    assert args.request_timeout == 30.0


def test_the_fault_proxy_refuses_unknown_faults() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        FaultProxy(None, "explode")
