"""perfkit compare reads the CSV NVIDIA's perf_analyzer writes with `-f`, measured against the
reference server: the file gates against itself on thresholds alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfkit.cli import main
from reference_server.server import ReferenceServer
from tests.integration.test_perf_analyzer import run_perf_analyzer

pytestmark = [pytest.mark.integration, pytest.mark.peers]


def test_compare_reads_perf_analyzers_csv(
    peers: Path, demo_server: ReferenceServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pa.csv"
    # Short windows and any spread accepted: this checks the file's layout, not the measurement.
    result = run_perf_analyzer(
        peers, "-m", "mlp", "-u", f"127.0.0.1:{demo_server.http_port}", "--concurrency-range", "1",
        "-p", "150", "-s", "1000", "-r", "4", "-f", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    junit = tmp_path / "gate.xml"
    assert main(["compare", str(out), str(out), "--junit", str(junit)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "no regression in 2 comparisons (thresholds only: no per-window samples, no significance test)"
    assert any(line.startswith("concurrency 1  throughput") for line in lines)
    assert 'value="thresholds only: no per-window samples"' in junit.read_text()
