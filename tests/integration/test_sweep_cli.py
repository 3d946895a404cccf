"""`perfkit sweep` as a person runs it: a subprocess against the embedded default or a reference
server on free loopback ports, checked through its exit code, its stderr and the files it leaves.
The flag and input errors call perfkit.cli.main in this process, as `python -m perfkit` calls it
(a subprocess spends most of a second importing perfkit before it refuses a flag); the report-dir
and unreachable-server errors check the same exit code and one-line stderr from a subprocess.

Stability on a real server depends on the machine, so levels may end unstable (exit code 3); the
tests accept 0 or 3 there and check the files, which is why their windows can be short (150 ms). Every subprocess has a bounded wait.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from perfkit.cli import main
from perfkit.report.tidy import tidy_header
from perfkit.results.model import read_sweep
from perfkit.target import ServerProcess, reference_server_process

pytestmark = pytest.mark.integration

PA_HEADER_START = "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of every sweep: one PERFKIT_CACHE_DIR for the module, with the demo models
    built into it once, here, rather than by the first sweep."""
    cache = tmp_path_factory.mktemp("perfkit-cache")
    subprocess.run(
        [sys.executable, "-c", "from v2kit.demo import ensure_demo_repository as e; e()"],
        env={**os.environ, "PERFKIT_CACHE_DIR": str(cache)}, check=True, timeout=120,
    )  # fmt: skip
    return {**os.environ, "PERFKIT_CACHE_DIR": str(cache), "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def demo_models(env: dict[str, str]) -> Path:
    [repository] = Path(env["PERFKIT_CACHE_DIR"]).glob("demo-models-v*")
    return repository


@pytest.fixture(scope="module")
def server(demo_models: Path) -> Iterator[ServerProcess]:
    """A reference server for the tests that only need one to be there (usage errors)."""
    with reference_server_process(demo_models) as running:
        yield running


def sweep(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfkit", "sweep", *args], capture_output=True, text=True, timeout=timeout,
        env=env, check=False,
    )  # fmt: skip


#: A sweep run in this process: its exit code and its stderr.
InProcess = Callable[..., tuple[int, str]]


@pytest.fixture
def sweep_in_process(
    env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> InProcess:
    """perfkit.cli.main as `python -m perfkit sweep ARGS` runs it, in the sweeps' environment: its
    exit code and what it wrote to stderr."""
    for name in ("PERFKIT_CACHE_DIR", "NO_COLOR"):
        monkeypatch.setenv(name, env[name])

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["sweep", *args])
        return code, capsys.readouterr().err

    return run


def start_sweep(*args: str, env: dict[str, str], stderr: Path, umask: int = -1) -> subprocess.Popen[str]:
    """The sweep in a process group of its own, as a shell runs a command (its pid is the group's)."""
    with stderr.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "perfkit", "sweep", *args], stdout=subprocess.DEVNULL, stderr=err, text=True,
            env=env, start_new_session=True, umask=umask,
        )  # fmt: skip


def wait_until(
    predicate: Callable[[], bool], what: str, process: subprocess.Popen[str], stderr: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the sweep exited with {process.returncode} before {what}:\n{stderr.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{stderr.read_text()}")
        time.sleep(0.05)


def pa_csv_rows(report_dir: Path) -> list[list[str]]:
    """Data rows of the perf_analyzer-format CSV in `report_dir` (none until it is written)."""
    paths = [p for p in report_dir.glob("sweep-*.csv") if not p.name.endswith("_long.csv")]
    if not paths:
        return []
    [path] = paths
    rows = list(csv.reader(path.read_text().splitlines()))
    assert rows[0][0] == "Concurrency"
    return rows[1:]


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


def refuses_connections(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_sweep_of_the_embedded_default_writes_every_output(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    profile = tmp_path / "p.json"
    result = sweep(
        "--concurrency-range", "1:2", "-p", "150", "-r", "6", "-s", "50", "--report-dir", str(tmp_path),
        "-f", str(out), "--profile-export-file", str(profile), env=env,
    )  # fmt: skip
    assert result.returncode in (0, 3), result.stderr
    assert "measuring the embedded reference server at 127.0.0.1:" in result.stderr
    # The perf_analyzer CSV: its header and row order, one row per level.
    lines = out.read_text().splitlines()
    assert lines[0].startswith(PA_HEADER_START), lines[0]
    rows = list(csv.DictReader(lines))
    # perf_analyzer's row order: by increasing throughput, whichever level that puts first.
    assert sorted(row["Concurrency"] for row in rows) == ["1", "2"]
    assert [float(row["Inferences/Second"]) for row in rows] == sorted(float(row["Inferences/Second"]) for row in rows)
    assert all(float(row["Inferences/Second"]) > 0 for row in rows)
    assert all(int(row["p99 latency"]) >= int(row["p50 latency"]) > 0 for row in rows)  # µs
    # The tidy CSV beside it, with the documented columns.
    tidy = pd.read_csv(tmp_path / "out_long.csv")
    assert list(tidy.columns) == tidy_header()
    assert tidy["level"].tolist() == [1.0, 2.0]
    assert (tidy["error_count"] == 0).all() and (tidy["throughput_infer_per_s"] > 0).all()
    assert tidy["model"].tolist() == ["mlp", "mlp"]
    # The JSON result, with provenance.
    saved = read_sweep(only(sorted(tmp_path.glob("sweep-mlp-concurrency-*.json"))))
    assert saved.completed and saved.model == "mlp" and saved.protocol == "http"
    assert [level.level for level in saved.levels] == [1.0, 2.0]
    assert saved.provenance["server"]["embedded"] is True
    assert result.returncode == (0 if all(level.valid for level in saved.levels) else 3)
    # Every request, per level, in perf_analyzer's profile export.
    export = json.loads(profile.read_text())
    experiments = export["experiments"]
    assert [e["experiment"]["value"] for e in experiments] == [1, 2]
    assert all(len(e["requests"]) > 0 for e in experiments)
    assert all(f"wrote {path}" in result.stderr for path in (out, tmp_path / "out_long.csv", profile))


def test_a_grpc_sweep_of_the_embedded_default(env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "grpc.csv"
    result = sweep("-i", "grpc", "-p", "150", "-r", "6", "-s", "50", "--report-dir", str(tmp_path), "-f", str(out),
                   "--no-report", env=env)  # fmt: skip
    assert result.returncode in (0, 3), result.stderr
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert [row["Concurrency"] for row in rows] == ["1"]
    # Server columns come from the statistics extension over gRPC.
    assert int(rows[0]["Server Compute Infer"]) > 0
    tidy = pd.read_csv(tmp_path / "grpc_long.csv")
    assert tidy["protocol"].tolist() == ["grpc"]
    assert tidy["server_inference_count"].iloc[0] > 0
    (result_json,) = tmp_path.glob("*.json")  # the files perfkit names say the protocol
    assert result_json.name.startswith("sweep-mlp-concurrency-grpc-")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--concurrency-range", "8:2"], "--concurrency-range"),
        (["--concurrency-range", "1:8", "--binary-search"], "-l/--latency-threshold"),
        (["-p", "0"], "-p/--measurement-interval"),
        (["--max-connections", "-1"], "--max-connections"),
        (["--max-connections", "2", "-i", "grpc"], "--max-connections is for -i http"),
    ],
)
def test_usage_errors_exit_2_with_one_line_naming_the_flag(
    args: list[str], needle: str, sweep_in_process: InProcess, tmp_path: Path
) -> None:
    code, stderr = sweep_in_process(*args, "--report-dir", str(tmp_path))
    assert code == 2, stderr
    [line] = stderr.splitlines()
    assert line.startswith("error: ") and needle in line
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-m", "mlp", "-b", "1000"], "-b 1000 exceeds the max_batch_size 64 of model 'mlp'"),
        (["-m", "nope"], "-m"),
        (["-m", "nope", "-i", "grpc"], "-m"),
        (["-m", "mlp", "-f", "/nonexistent-folder/out.csv"], "-f/--latency-report-file /nonexistent-folder/out.csv"),
        (["-m", "mlp", "--profile-export-file", "/nonexistent-folder/p.json"], "--profile-export-file"),
    ],
)
def test_input_errors_found_on_the_server_exit_2_naming_the_flag(
    args: list[str], needle: str, server: ServerProcess, sweep_in_process: InProcess, tmp_path: Path
) -> None:
    url = server.grpc_url if "grpc" in args else server.http_url
    code, stderr = sweep_in_process("-u", url, *args, "--report-dir", str(tmp_path))
    assert code == 2, stderr
    [line] = stderr.splitlines()
    assert line.startswith("error: ") and needle in line
    if "nope" in args:
        assert "'nope'" in line and "mlp" in line  # the model asked for, and those there are
    assert list(tmp_path.glob("*.csv")) == []


def test_a_report_dir_that_cannot_be_created_is_a_usage_error(
    server: ServerProcess, env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    result = sweep(
        "-u", server.http_url, "-m", "mlp", "--report-dir", str(tmp_path / "file" / "reports"), env=env, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: --report-dir {tmp_path}/file/reports: cannot create it (Not a directory)"
    ]


def server_http_connections(server: ServerProcess) -> int:
    """Established connections to the server's HTTP port, as the server's processes see them (its
    front-end workers too, on a machine where `--frontend-workers auto` starts them)."""
    port = server.ports["HTTPService"]
    core = psutil.Process(server.process.pid)
    connections = [c for p in (core, *core.children()) for c in p.net_connections(kind="tcp")]
    return sum(1 for c in connections if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)


@pytest.mark.parametrize(("cap", "most"), [(0, 6), (2, 2)])
def test_max_connections_caps_the_http_connections_a_sweep_opens(
    cap: int, most: int, server: ServerProcess, env: dict[str, str], tmp_path: Path
) -> None:
    stderr = tmp_path / "stderr.txt"
    process = start_sweep(
        "-u", server.http_url, "-m", "identity", "--shape", "INPUT0:16", "--concurrency-range", "6", "-p", "500",
        "-r", "4", "-s", "1000", "--max-connections", str(cap), "--report-dir", str(tmp_path), "--no-report",
        env=env, stderr=stderr,
    )  # fmt: skip
    seen = 0
    try:
        wait_until(lambda: "window 1/" in stderr.read_text(), "the first window", process, stderr, 60)
        while process.poll() is None:  # the level's connections stay open until it ends
            seen = max(seen, server_http_connections(server))
            time.sleep(0.02)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
    assert process.returncode == 0, stderr.read_text()
    # The control plane (metadata, statistics) has a connection of its own beside the load's.
    assert most <= seen <= most + 1
    [level] = read_sweep(only(sorted(tmp_path.glob("*.json")))).levels
    assert level.error_count == 0 and level.ok_count > 0


def test_an_unstable_level_is_kept_flagged_and_gives_exit_code_3(
    server: ServerProcess, env: dict[str, str], tmp_path: Path
) -> None:
    # No real server keeps three windows within 0.001 % of each other.
    out = tmp_path / "out.csv"
    result = sweep(
        "-u", server.http_url, "-m", "mlp", "-p", "200", "-r", "3", "-s", "0.001", "--report-dir", str(tmp_path),
        "-f", str(out), "--no-report", env=env,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "concurrency 1: " in result.stderr and "UNSTABLE" in result.stderr
    # The last line says why and what to change; -r alone keeps perf_analyzer's windows, not lengthened.
    assert result.stderr.strip().splitlines()[-1].startswith("concurrency 1 never stabilised (throughput varied ")
    assert "-s 0.001% over the last 3 windows of 0.2 s): raise -p" in result.stderr
    assert "lengthening the windows" not in result.stderr
    assert len(out.read_text().splitlines()) == 2  # kept: the header and its row
    tidy = pd.read_csv(tmp_path / "out_long.csv")
    assert tidy["stable"].tolist() == [False] and "stable" in tidy["failed_checks"].iloc[0].split(";")
    [level] = read_sweep(only(sorted(tmp_path.glob("*.json")))).levels
    assert not level.stable and len(level.windows) == 3


def test_an_unreachable_server_exits_1_naming_the_flag(env: dict[str, str], tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = sweep("-u", f"127.0.0.1:{port}", "--report-dir", str(tmp_path), env=env, timeout=60)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: cannot reach http://127.0.0.1:{port}") and "-u" in line
    assert line.count("cannot reach") == 1


def test_a_server_killed_mid_sweep_leaves_the_finished_levels_and_exit_code_1(
    demo_models: Path, env: dict[str, str], tmp_path: Path
) -> None:
    report_dir = tmp_path / "reports"
    stderr = tmp_path / "stderr.txt"
    with reference_server_process(demo_models) as server:
        process = start_sweep(
            "-u", server.http_url, "-m", "mlp", "--concurrency-range", "1:20", "-p", "150", "-r", "4", "-s", "100",
            "--request-timeout", "5", "--report-dir", str(report_dir), env=env, stderr=stderr,
        )  # fmt: skip
        try:
            wait_until(lambda: len(pa_csv_rows(report_dir)) >= 1, "the first level on disk", process, stderr, 60)
            killed_at = time.monotonic()
            server.process.kill()
            server.process.wait(10)
            code = process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    took = time.monotonic() - killed_at
    assert code == 1, stderr.read_text()
    assert took < 30
    err = stderr.read_text()
    assert re.search(r"error: the sweep stopped early: the server stopped answering \((connection refused|"
                     r"connection reset|disconnected|connection error) ×\d+", err), err  # fmt: skip
    # The levels finished before the kill are on disk, in files that parse.
    rows = pa_csv_rows(report_dir)
    assert len(rows) >= 2  # at least one served level, and the one that found the server gone
    assert all(len(row) == len(rows[0]) for row in rows)
    # perf_analyzer's row order is by throughput, so the level that found nobody comes first.
    throughput = {int(row[0]): float(row[1]) for row in rows}
    assert sorted(throughput) == list(range(1, len(rows) + 1))
    assert throughput[1] > 0  # the first level was served
    assert throughput[len(rows)] == 0  # the last found nobody
    tidy = pd.read_csv(only(sorted(report_dir.glob("*_long.csv"))))
    assert len(tidy) == len(rows)
    saved = read_sweep(only(sorted(report_dir.glob("*.json"))))
    assert not saved.completed and saved.stop_reason.startswith("the server stopped answering")
    assert len(saved.levels) == len(rows)


@pytest.mark.parametrize(
    "after_a_level", [True, False], ids=["after-a-level-to-the-group", "before-any-level-to-the-sweep"]
)
def test_sigint_ends_a_sweep_with_results_so_far_and_the_embedded_server_stopped(
    after_a_level: bool, env: dict[str, str], tmp_path: Path
) -> None:
    """Ctrl-C in a terminal sends SIGINT to the process group (the server gets it too): here once
    the first level is on disk, which then has its CSV, JSON and an HTML report marked interrupted.
    SIGINT to the sweep alone (it must stop the server itself): here before any level finished,
    which leaves no file and says so. Either way exit 130, and every file named as written exists,
    with the mode the umask gives."""
    report_dir = tmp_path / "reports"
    stderr = tmp_path / "stderr.txt"
    window_ms = "150" if after_a_level else "60000"  # the latter: no level can finish before the signal
    process = start_sweep(
        "--concurrency-range", "1:50", "-p", window_ms, "-r", "4", "-s", "100", "--report-dir", str(report_dir),
        env=env, stderr=stderr, umask=0o022,
    )  # fmt: skip
    try:
        if after_a_level:
            wait_until(lambda: len(pa_csv_rows(report_dir)) >= 1, "the first level on disk", process, stderr, 90)
        else:
            wait_until(lambda: ": measuring" in stderr.read_text(), "the first level started", process, stderr, 90)
        [server] = [c for c in psutil.Process(process.pid).children() if "reference_server" in c.cmdline()]
        port = int(re.findall(r"embedded reference server at 127\.0\.0\.1:(\d+)", stderr.read_text())[0])
        assert not refuses_connections(port)
        if after_a_level:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        code = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = stderr.read_text()
    assert code == 130, err
    assert "Traceback" not in err
    # The embedded server was stopped by the sweep, not left behind.
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert refuses_connections(port)
    # Every file said to be written is there, readable by others as umask 022 asks.
    written = [Path(line) for line in re.findall(r"^wrote (.+)$", err, re.MULTILINE)]
    assert all(path.is_file() and path.stat().st_mode & 0o777 == 0o644 for path in written), err
    if not after_a_level:
        assert written == [] and list(report_dir.glob("*")) == [], err
        assert "interrupted before any level finished: no results written" in err
        return
    assert "interrupted: the levels finished so far are in the files above" in err
    # What was measured is on disk, and says it was interrupted: the report too.
    (html,) = report_dir.glob("sweep-mlp-concurrency-http-*.html")
    assert html in written and "(interrupted after" in html.read_text()
    rows = pa_csv_rows(report_dir)
    assert len(rows) >= 1 and sorted(int(row[0]) for row in rows) == list(range(1, len(rows) + 1))
    assert all(float(row[1]) > 0 for row in rows)
    saved = read_sweep(only(sorted(report_dir.glob("*.json"))))
    assert not saved.completed and saved.stop_reason == "interrupted"
    assert len(saved.levels) == len(rows)
    assert set(report_dir.iterdir()) <= set(written)
