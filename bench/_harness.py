"""Shared bench plumbing: runs of NVIDIA's perf_analyzer, and the repository load API."""

from __future__ import annotations

import csv
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def peers_dir() -> Path:
    value = os.environ.get("PERFKIT_PEERS")
    if not value:
        sys.exit("PERFKIT_PEERS is not set: run `bash ../shared/peers/install.sh DIR` and export PERFKIT_PEERS=DIR")
    return Path(value)


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


@dataclass(frozen=True, slots=True)
class TimedRun:
    result: subprocess.CompletedProcess[str]
    cpu_s: float  # user + system CPU of the command and of every process it waited for
    wall_s: float


def run_timed(command: Sequence[str], timeout_s: float) -> TimedRun:
    """Run `command` to its end and measure its CPU from RUSAGE_CHILDREN deltas.

    RUSAGE_CHILDREN counts only children that have ended and been waited for, so a server that this
    process started and that is still running (reference_server_process) is not counted. Run one
    command at a time: a child that ends meanwhile would be counted too.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return TimedRun(result, cpu_s, wall_s)


def success_count(http_url: str, model: str) -> int:
    """The server's cumulative count of successful requests for `model` (statistics extension)."""
    stats = get_json(f"http://{http_url}/v2/models/{model}/stats")
    assert isinstance(stats, dict)
    return sum(int(entry["inference_stats"]["success"]["count"]) for entry in stats["model_stats"])
