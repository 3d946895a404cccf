"""Shared bench plumbing: runs of NVIDIA's perf_analyzer, and the repository load API."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
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
