"""NVIDIA's perf_analyzer (C++) measures the reference server over gRPC, with unary calls and with the
bidirectional stream (`--streaming`, which perf_analyzer also accepts for models that are not
decoupled: one response per request)."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
def test_concurrency_sweep_over_grpc(
    peers: Path, demo_server: ReferenceServer, tmp_path: Path, streaming: bool
) -> None:
    out = tmp_path / "pa.csv"
    # A loose stability bound: this checks protocol compatibility, not measurement quality.
    result = run_perf_analyzer(
        peers,
        "-i",
        "grpc",
        *(["--streaming"] if streaming else []),
        "-u",
        f"127.0.0.1:{demo_server.grpc_port}",
        "-m",
        "mlp",
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
    assert "Avg gRPC time" in result.stdout
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["Concurrency"]) for r in rows] == [1, 4]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0
        assert int(row["p99 latency"]) >= int(row["p50 latency"]) > 0
        assert int(row["Server Compute Infer"]) > 0
