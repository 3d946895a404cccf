"""The perfkit sweep the fault tests throw their faults under (tests/integration/test_faults_under_load.py,
test_process_faults.py): short windows, concurrency 16 then 64 by default, every request exported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REQUEST_TIMEOUT_S = 5.0
LEVELS = (16, 64)


def start_sweep(
    url: str, transport: str, out: Path, model: str, shape: str, levels: tuple[int, ...] = LEVELS
) -> subprocess.Popen[str]:
    """perfkit sweeping `model` over `transport` (http, grpc, or gRPC streams: "stream", "decoupled")
    at `levels` (evenly spaced), writing its results, CSV and per-request export under `out`."""
    protocol = "http" if transport == "http" else "grpc"
    streaming = ["--streaming"] if transport in ("stream", "decoupled") else []
    command = [
        sys.executable, "-m", "perfkit", "sweep", "-u", url, "-i", protocol, *streaming, "-m", model, "--shape", shape,
        "--concurrency-range", f"{levels[0]}:{levels[-1]}:{levels[1] - levels[0]}",
        "-p", "200", "-r", "3", "-s", "50", "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--report-dir", str(out), "-f", str(out / "perfkit.csv"), "--profile-export-file", str(out / "requests.json"),
        "--quiet", "--no-report",
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
