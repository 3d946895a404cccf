"""NVIDIA's perf_analyzer (C++) measures the reference server over HTTP: the server speaks enough of
the protocol (metadata, config, statistics) for the real tool, and dynamic batching forms batches."""

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


def test_concurrency_sweep_over_http(peers: Path, demo_server: ReferenceServer, tmp_path: Path) -> None:
    out = tmp_path / "pa.csv"
    # A loose stability bound: this checks protocol compatibility, not measurement quality.
    result = run_perf_analyzer(
        peers,
        "-m",
        "mlp",
        "-u",
        demo_server.http_url,
        "--concurrency-range",
        "1:4:3",
        "-p",
        "800",
        "-s",
        "100",
        "-r",
        "6",
        "-f",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Server:" in result.stdout
    assert "Avg request latency" in result.stdout
    assert "Inference count" in result.stdout
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["Concurrency"]) for r in rows] == [1, 4]
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
        "800",
        "-s",
        "100",
        "-r",
        "6",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    stats = httpclient.InferenceServerClient(demo_server.http_url).get_inference_statistics("mlp")
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    assert max(sizes) > 1, sizes
    model = stats["model_stats"][0]
    assert model["inference_count"] > model["execution_count"]
