"""--metrics-config summary_latencies=true on a running server: the nv_inference_*_summary_us
summaries in the same form as tritonserver 2.51's (the peers test: names, help, type, the lines of
each model, labels and their order, quantile labels, counts), and with front-end workers the core
counting every request of a model the workers could have run themselves."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton, write_identity_model

pytestmark = pytest.mark.integration

MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
CONFIG = """\
name: "echo"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
FLAGS = ("--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001")
QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.99, 0.001))
REQUESTS = 3


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("summaries") / "models"
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(MODEL)
    (root / "echo" / "config.pbtxt").write_text(CONFIG)
    return root


def _infer(url: str, model: str, count: int, dims: tuple[int, ...] = (1,)) -> None:
    client = httpclient.InferenceServerClient(url)
    try:
        for _ in range(count):
            tensor = httpclient.InferInput("INPUT0", list(dims), "FP32")
            tensor.set_data_from_numpy(np.ones(dims, np.float32))
            client.infer(model, [tensor])
    finally:
        client.close()


def _summaries(metrics_url: str, model: str, count: int) -> list[str]:
    """The summary lines of `model` (and their HELP and TYPE), each value but a count replaced by V,
    once every summary has counted `count` requests (a server may count one after answering it)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        lines = [
            line
            for line in text.splitlines()
            if "_summary_us" in line and (line.startswith("#") or f'model="{model}"' in line)
        ]
        counts = [line.rsplit(" ", 1)[1] for line in lines if "_summary_us_count{" in line]
        if (counts and all(c == str(count) for c in counts)) or time.monotonic() > deadline:
            return [
                line if line.startswith("#") or "_count{" in line else re.sub(r" \S+$", " V", line) for line in lines
            ]
        time.sleep(0.05)


def _expected(model: str) -> list[str]:
    lines = []
    for family, text in (
        ("request", "Summary of inference request duration in microseconds (includes cached requests)"),
        ("queue", "Summary of inference queuing duration in microseconds (includes cached requests)"),
        ("compute_input", "Cumulative compute input duration in microseconds (does not include cached requests)"),
        ("compute_infer", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
        (
            "compute_output",
            "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        ),
    ):
        name = f"nv_inference_{family}_summary_us"
        labels = f'model="{model}",version="1"'
        lines += [f"# HELP {name} {text}", f"# TYPE {name} summary", f"{name}_count{{{labels}}} {REQUESTS}"]
        lines.append(f"{name}_sum{{{labels}}} V")
        lines += [f'{name}{{{labels},quantile="{q}"}} V' for q, _ in QUANTILES]
    return lines


def test_summaries_as_tritonserver_lists_them(repository: Path) -> None:
    config = loopback_config(repository, metrics_summary_latencies=True, metrics_summary_quantiles=QUANTILES)
    with running_server(config) as ours:
        _infer(f"127.0.0.1:{ours.http_port}", "echo", REQUESTS)
        assert _summaries(f"http://127.0.0.1:{ours.metrics_port}/metrics", "echo", REQUESTS) == _expected("echo")


def test_no_summaries_by_default(repository: Path) -> None:
    with running_server(loopback_config(repository)) as ours:
        _infer(f"127.0.0.1:{ours.http_port}", "echo", 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{ours.metrics_port}/metrics", timeout=10) as answer:
            assert b"_summary_us" not in answer.read()


def test_with_frontend_workers_the_core_counts_every_request(demo_repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copytree(demo_repository / "identity", root / "identity")
    write_identity_model(root, "pair", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    config = loopback_config(
        root, load=("pair",), frontend_workers=2, metrics_summary_latencies=True, metrics_summary_quantiles=QUANTILES
    )
    with running_server(config) as ours:
        for _ in range(REQUESTS):  # a new connection each: the workers share them
            _infer(f"127.0.0.1:{ours.http_port}", "pair", 1, (1, 1))
        assert _summaries(f"http://127.0.0.1:{ours.metrics_port}/metrics", "pair", REQUESTS) == _expected("pair")


@pytest.mark.peers
def test_summaries_are_tritonservers(repository: Path) -> None:
    peers = os.environ.get("PERFKIT_PEERS")
    if not peers:
        pytest.skip("PERFKIT_PEERS is not set: no tritonserver 2.51 to compare with")
    with running_triton(Path(peers), repository, extra_args=FLAGS, auto_complete=False) as triton:
        _infer(triton.http_url, "echo", REQUESTS)
        assert _summaries(triton.metrics_url, "echo", REQUESTS) == _expected("echo")
