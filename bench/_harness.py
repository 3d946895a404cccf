"""Shared bench plumbing: the reference server as a subprocess on free loopback ports, and runs of
NVIDIA's perf_analyzer against it."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService|Metrics Service) at [\d.]+:(\d+)")


@dataclass(frozen=True)
class ServerProcess:
    process: subprocess.Popen[str]
    ports: dict[str, int]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['HTTPService']}"


def peers_dir() -> Path:
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        sys.exit("PERFKIT_PEERS is not set: run `bash ../shared/peers/install.sh DIR` and export PERFKIT_PEERS=DIR")
    return Path(value)


@contextmanager
def reference_server(repository: Path, *extra: str, timeout_s: float = 120) -> Iterator[ServerProcess]:
    command = [
        sys.executable,
        "-m",
        "reference_server",
        "--model-repository",
        str(repository),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        *extra,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ports: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        assert process.stdout is not None
        while "HTTPService" not in ports or "Metrics Service" not in ports:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"reference server exited with {process.wait()} before listening")
            match = STARTED.search(line)
            if match:
                ports[match.group(1)] = int(match.group(2))
            if time.monotonic() > deadline:
                raise RuntimeError("reference server did not start in time")
        yield ServerProcess(process, ports)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def load_model(url: str, name: str, config: dict[str, object]) -> None:
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    request = urllib.request.Request(f"http://{url}/v2/repository/models/{name}/load", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def perf_analyzer(peers: Path, model: str, url: str, out_csv: Path, args: Sequence[str]) -> list[dict[str, str]]:
    command = [str(peers / "bin" / "perf_analyzer"), "-m", model, "-u", url, "-f", str(out_csv), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    with out_csv.open() as handle:
        return list(csv.DictReader(handle))
