"""NVIDIA's perf_analyzer (C++) measures the reference server over HTTP and gRPC (unary and streaming):
the server speaks enough of the protocol (metadata, config, statistics) for the real tool, and
dynamic batching forms batches."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from reference_server.server import ReferenceServer

pytestmark = [pytest.mark.integration, pytest.mark.peers]


def run_perf_analyzer(peers: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(peers / "bin" / "perf_analyzer"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


TRANSPORTS = {
    "http": ("Avg HTTP time", []),
    "grpc": ("Avg gRPC time", ["-i", "grpc"]),
    # perf_analyzer also streams to models that are not decoupled: one response per request.
    "grpc-streaming": ("Avg gRPC time", ["-i", "grpc", "--streaming"]),
}


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_concurrency_sweep(peers: Path, demo_server: ReferenceServer, tmp_path: Path, transport: str) -> None:
    out = tmp_path / "pa.csv"
    client_line, flags = TRANSPORTS[transport]
    port = demo_server.http_port if transport == "http" else demo_server.grpc_port
    # Any spread accepted and short windows (a hundred requests or more each): this checks protocol
    # compatibility, not measurement quality (perf_analyzer leaves out a level that never
    # stabilised, and 200 ms windows on a machine running other tests can spread past 100 %).
    result = run_perf_analyzer(
        peers, *flags, "-m", "mlp", "-u", f"127.0.0.1:{port}", "--concurrency-range", "1:4:3",
        "-p", "200", "-s", "1000", "-r", "6", "-f", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("Server:", "Avg request latency", "Inference count", client_line):
        assert line in result.stdout
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 4]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0
        assert int(row["p99 latency"]) >= int(row["p50 latency"]) > 0
        assert int(row["Server Compute Infer"]) > 0


def test_dynamic_batching_forms_batches_under_load(peers: Path, demo_server: ReferenceServer) -> None:
    result = run_perf_analyzer(
        peers,
        "-m",
        "mlp",
        "-u",
        demo_server.http_url,
        "--concurrency-range",
        "8",
        "-p",
        "400",
        "-s",
        "1000",  # batches formed under load are checked, not the measurement's spread
        "-r",
        "6",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    stats = httpclient.InferenceServerClient(demo_server.http_url).get_inference_statistics("mlp")
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    assert max(sizes) > 1, sizes
    model = stats["model_stats"][0]
    assert model["inference_count"] > model["execution_count"]
