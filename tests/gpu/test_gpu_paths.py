"""What needs an NVIDIA GPU, run where NVML shows one: NVML's readings, the server's `nv_gpu_*`
metrics, KIND_GPU placement on the CUDA execution provider (or, where this onnxruntime has none,
the refusal that says so and no-kind groups on the CPU), and a sweep's GPU figures. Skipped, with
the reason, on machines without a GPU, as CI's are."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest

from perfkit.measure.prometheus import parse_metrics
from perfkit.results.model import read_sweep
from reference_server.server import running_server
from tests.servers import loopback_config
from v2kit.runtime import gpu

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(gpu.gpu_count() == 0, reason="needs an NVIDIA GPU that NVML (pynvml) can see; none here"),
]

CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
GPU_GROUP = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]"


def test_nvml_reads_every_gpu_with_plausible_figures() -> None:
    readings = gpu.read_gpus()
    assert len(readings) == gpu.gpu_count() >= 1
    for reading in readings:
        assert reading.uuid.startswith("GPU-") and reading.uuid == gpu.gpu_uuid(reading.index)
        assert 0 < reading.memory_used_bytes <= reading.memory_total_bytes
        assert 0.0 <= reading.utilization <= 1.0
        assert reading.power_limit_w > 0 and 0 < reading.power_usage_w < 2 * reading.power_limit_w


def _post(url: str, body: dict[str, object]) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _infer(http_url: str, model: str, rows: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}]
    }
    status, text = _post(f"http://{http_url}/v2/models/{model}/infer", body)
    assert status == 200, text
    (output,) = json.loads(text)["outputs"]
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_kind_gpu_runs_on_cuda_or_is_refused_with_the_reason(demo_repository: Path, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(demo_repository / "mlp", repository / "mlp")
    shutil.copytree(demo_repository / "mlp", repository / "mlp_gpu")
    config = repository / "mlp_gpu" / "config.pbtxt"
    text = config.read_text().replace('name: "mlp"', 'name: "mlp_gpu"')
    config.write_text(text.replace("instance_group [ { count: 1 } ]", GPU_GROUP))
    rows = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    with running_server(loopback_config(repository, load=("mlp",))) as server:
        # A group of no kind: on the GPU with CUDA, else on the CPU; either way it serves.
        on_default = _infer(server.http_url, "mlp", rows)
        status, text = _post(f"http://{server.http_url}/v2/repository/models/mlp_gpu/load", {})
        if not CUDA:
            assert status == 400 and "asks for KIND_GPU but onnxruntime" in text and "onnxruntime-gpu" in text, text
            return
        assert status == 200, text
        np.testing.assert_allclose(_infer(server.http_url, "mlp_gpu", rows), on_default, rtol=1e-3, atol=1e-4)
        with urllib.request.urlopen(
            f"http://{server.config.host}:{server.metrics_port}/metrics", timeout=30
        ) as response:
            metrics = response.read().decode()
    held = [line for line in metrics.splitlines() if line.startswith('nv_model_gpu_memory_bytes{model="mlp_gpu"')]
    assert held and float(held[0].rsplit(" ", 1)[1]) > 0, held


def test_the_servers_gpu_metrics_are_nvmls(demo_repository: Path) -> None:
    with running_server(loopback_config(demo_repository, load=("mlp",))) as server:
        with urllib.request.urlopen(
            f"http://{server.config.host}:{server.metrics_port}/metrics", timeout=30
        ) as response:
            scrape = parse_metrics(response.read().decode())
    readings = {reading.uuid: reading for reading in gpu.read_gpus()}
    assert set(scrape.gpus) == set(readings)
    for uuid, sample in scrape.gpus.items():
        assert sample.memory_total_bytes == readings[uuid].memory_total_bytes
        assert 0 < (sample.memory_used_bytes or 0) <= readings[uuid].memory_total_bytes


def test_a_sweep_of_the_embedded_default_records_the_gpus(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    result = subprocess.run(
        [sys.executable, "-m", "perfkit", "sweep", "--concurrency-range", "1:2", "-p", "500", "-s", "50",
         "--collect-metrics", "--metrics-interval", "100", "--report-dir", str(tmp_path), "-f", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode in (0, 3), result.stderr
    assert "no GPU metrics" not in result.stderr
    tidy = pd.read_csv(tmp_path / "out_long.csv")
    assert (tidy["gpu_memory_used_max_bytes"] > 0).all(), tidy.filter(like="gpu").to_string()
    assert (tidy["gpu_power_mean_w"] > 0).all()
    (saved,) = [read_sweep(path) for path in tmp_path.glob("sweep-mlp-*.json")]
    uuids = {reading.uuid for reading in gpu.read_gpus()}
    assert all(set(level.resources.gpu_memory_total_bytes) == uuids for level in saved.levels)
