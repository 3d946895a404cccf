"""`perfkit sweep -u A,B` against two reference servers on loopback, with its metrics read from one
of them and from a canned DCGM exporter: each endpoint's share and the total at every level, the
statistics extension summed over both servers, an ensemble's composing models beside it (CSV files
in perf_analyzer's layout, read back by `perfkit compare`), a dead endpoint named."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.results.model import SweepResult, read_sweep
from perfkit.target import ServerProcess, reference_server_process
from tests.unit.test_resources import DCGM_TEXT

pytestmark = pytest.mark.integration

WINDOWS = ("-p", "150", "-s", "60", "-r", "4", "--no-report")  # the tests accept an unstable level


@pytest.fixture(scope="module")
def servers(demo_repository: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with reference_server_process(demo_repository) as a, reference_server_process(demo_repository) as b:
        yield a, b


@pytest.fixture(scope="module")
def dcgm() -> Iterator[str]:
    """A DCGM exporter's /metrics, canned: two GPUs of a node with no server of ours on it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = DCGM_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="canned-dcgm", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def sweep(tmp_path: Path, *args: str) -> tuple[int, SweepResult]:
    code = main(["sweep", *args, *WINDOWS, "--report-dir", str(tmp_path), "-f", str(tmp_path / "out.csv")])
    (path,) = tmp_path.glob("sweep-*.json")
    return code, read_sweep(path)


def test_an_ensemble_over_two_http_endpoints_with_dcgm_metrics(
    servers: tuple[ServerProcess, ServerProcess], dcgm: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = servers
    code, result = sweep(
        tmp_path, "-m", "mlp_pipeline", "-u", f"{a.http_url},{b.http_url}", "--concurrency-range", "4",
        "--collect-metrics", "--metrics-url", dcgm, "--metrics-url", a.metrics_url, "--metrics-interval", "100",
    )  # fmt: skip
    assert code in (0, 3), capsys.readouterr().err
    (level,) = result.levels
    assert result.url == f"{a.http_url},{b.http_url}"
    # Round-robin: each endpoint took half the requests (the other's connections keep the same pace).
    assert [e.url for e in level.endpoints] == [a.http_url, b.http_url]
    assert abs(sum(e.request_count for e in level.endpoints) - level.request_count) <= 4
    assert all(0.35 * level.ok_count <= e.ok_count <= 0.65 * level.ok_count for e in level.endpoints)
    assert sum(e.throughput_infer_per_s for e in level.endpoints) == pytest.approx(level.throughput_infer_per_s, 0.02)
    # The server statistics add up both servers': one alone would hold about half the requests.
    server = level.server
    assert server is not None and 0.9 * level.ok_count <= server.success_count <= 1.1 * level.ok_count + 8
    steps = {c.model: c.server for c in server.composing}
    assert sorted(steps) == ["mlp", "preprocess"]
    assert all(abs(s.success_count - server.success_count) <= 8 for s in steps.values())
    # The DCGM exporter's GPUs, in Triton's units; the reference server has none, and says so.
    assert level.resources.gpu_utilization == pytest.approx({"GPU-aaaa": 0.87, "GPU-dddd": 0.03})
    assert level.resources.gpu_memory_used_bytes["GPU-aaaa"] == 10000 << 20
    assert f"no GPU metrics at {a.metrics_url}" in level.resources.notes
    out = capsys.readouterr().out
    assert "composing model" in out and f"{b.http_url}" in out and "total" in out
    for step in ("mlp", "preprocess"):
        rows = (tmp_path / f"{step}_v1.out.csv").read_text().splitlines()
        assert rows[0] == ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                           "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv")  # fmt: skip
        assert rows[1].startswith("4,")
    tidy = (tmp_path / "out_long.csv").read_text()
    assert tidy.count(",mlp_pipeline\n") == 2 and tidy.count(f",{a.http_url},") == 1
    # compare reads the CSV with its composing models' files beside it, and says how each changed.
    assert main(["compare", str(tmp_path / "out.csv"), str(tmp_path / "out.csv")]) == 0
    compared = capsys.readouterr().out
    assert "concurrency 4, composing model mlp v1: queue" in compared
    assert "concurrency 4, composing model preprocess v1: queue" in compared


def test_grpc_endpoints_and_a_dead_one_named(
    servers: tuple[ServerProcess, ServerProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = servers
    code, result = sweep(tmp_path / "grpc", "-m", "mlp", "-i", "grpc", "-u", f"{a.grpc_url},{b.grpc_url}", "--quiet")
    assert code in (0, 3), capsys.readouterr().err
    (level,) = result.levels
    assert len(level.endpoints) == 2 and all(e.ok_count > 0.35 * level.ok_count for e in level.endpoints)
    assert level.server is not None and level.server.success_count >= 0.9 * level.ok_count
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
    capsys.readouterr()
    assert main(["sweep", "-m", "mlp", "-u", f"{a.http_url},{dead}", *WINDOWS, "--report-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"endpoint {dead}" in error and a.http_url not in error.replace(f"{a.http_url},{dead}", "")
    assert main(["sweep", "-u", f"{a.http_url},{a.http_url}", *WINDOWS]) == 2
    assert "each once" in capsys.readouterr().err
    assert main(["sweep", "-u", f"{a.http_url},{b.http_url}", "--workers", "2", *WINDOWS]) == 2
    assert "--workers sends to one -u endpoint" in capsys.readouterr().err
    assert main(["probe", "-u", f"{a.http_url},{b.http_url}"]) == 2
    assert "probe checks one server" in capsys.readouterr().err
    assert json.loads(json.dumps(result.provenance["server"]))["endpoints"] == [a.grpc_url, b.grpc_url]
