"""The response cache through the front ends, driven by tritonclient and perf_analyzer: hits answer
without running the model and show in the statistics extension and the nv_cache_* metrics; what the
cache cannot hold, and models it must refuse, behave as in Triton."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config, write_identity_model
from v2kit.demo import build_demo_repository

pytestmark = pytest.mark.integration

CACHE_BYTES = 4096  # a few small responses; one of 2,000 FP32 values (8,000 bytes) does not fit


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = build_demo_repository(tmp_path_factory.mktemp("cache") / "models")
    for name in ("convnet", "python_linear"):  # not needed: faster start
        shutil.rmtree(repo / name)
    with (repo / "mlp" / "config.pbtxt").open("a") as config:  # a step of the mlp_pipeline ensemble
        config.write("\nresponse_cache { enable: true }\n")
    write_identity_model(repo, "cached", "response_cache { enable: true }")
    write_identity_model(repo, "oversized", "response_cache { enable: true }")
    decoupled = write_identity_model(repo, "decoupled_cached", "response_cache { enable: true }")
    with (decoupled / "config.pbtxt").open("a") as config:
        config.write("model_transaction_policy { decoupled: true }\n")
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ReferenceServer]:
    with running_server(loopback_config(repository, response_cache_bytes=CACHE_BYTES)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ReferenceServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def infer(client: httpclient.InferenceServerClient, model: str, x: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
    assert out is not None
    return out


def inference_stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def metrics(server: ReferenceServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def test_identical_requests_are_answered_from_the_cache(
    client: httpclient.InferenceServerClient, server: ReferenceServer
) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    answers = [infer(client, "cached", x) for _ in range(5)]
    for answer in answers:
        np.testing.assert_array_equal(answer, x)
    # Over gRPC, the same request is the same entry.
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("cached", [inp]).as_numpy("OUTPUT0"), x)
    # Another input is another entry.
    np.testing.assert_array_equal(infer(client, "cached", x + 1), x + 1)

    stats = inference_stats(client, "cached")
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 7
    assert inference["cache_hit"]["count"] == 5 and int(inference["cache_hit"]["ns"]) > 0
    assert inference["cache_miss"]["count"] == 2 and int(inference["cache_miss"]["ns"]) > 0
    assert inference["queue"]["count"] == 7
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert inference[phase]["count"] == 2  # only the misses ran
    assert stats["execution_count"] == 2 and stats["inference_count"] == 4  # two runs of batch 2

    text = metrics(server)
    labels = '{model="cached",version="1"}'
    assert f"nv_cache_num_hits_per_model{labels} 5" in text
    assert f"nv_cache_num_misses_per_model{labels} 2" in text
    assert f"nv_cache_hit_duration_per_model{labels}" in text
    assert f"nv_cache_miss_duration_per_model{labels}" in text
    assert 'nv_cache_num_hits_per_model{model="identity"' not in text  # its config does not enable the cache


def test_json_outputs_and_streamed_requests_are_answered_from_the_cache(
    client: httpclient.InferenceServerClient, server: ReferenceServer
) -> None:
    x = np.full((1, 5), 3.5, np.float32)
    before = inference_stats(client, "cached")["inference_stats"]["cache_hit"]["count"]
    for _ in range(2):  # a miss, then a hit, both answered as JSON
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=False)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
        np.testing.assert_array_equal(client.infer("cached", [inp], outputs=[out]).as_numpy("OUTPUT0"), x)
    answers: list[Any] = []
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    grpc.start_stream(callback=lambda result, error: answers.append(error or result))
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        grpc.async_stream_infer("cached", [inp], request_id="streamed")
    finally:
        grpc.stop_stream()  # waits for the answer
    assert len(answers) == 1 and not isinstance(answers[0], Exception), answers
    np.testing.assert_array_equal(answers[0].as_numpy("OUTPUT0"), x)
    assert inference_stats(client, "cached")["inference_stats"]["cache_hit"]["count"] == before + 2


def test_a_response_larger_than_the_cache_runs_every_time(client: httpclient.InferenceServerClient) -> None:
    x = np.linspace(0, 1, 2000, dtype=np.float32).reshape(1, 2000)  # 8,000 bytes > the 4,096-byte cache
    for _ in range(3):
        np.testing.assert_array_equal(infer(client, "oversized", x), x)
    stats = inference_stats(client, "oversized")
    assert stats["execution_count"] == 3
    assert stats["inference_stats"]["cache_hit"]["count"] == 0
    assert stats["inference_stats"]["cache_miss"]["count"] == 3  # Triton counts a failed insert as a miss
    # Small ones still fit beside it.
    small = np.ones((1, 3), np.float32)
    infer(client, "oversized", small)
    infer(client, "oversized", small)
    assert inference_stats(client, "oversized")["inference_stats"]["cache_hit"]["count"] == 1


def test_an_ensemble_step_is_answered_from_its_models_cache(client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    first, second = (client.infer("mlp_pipeline", [inp]).as_numpy("OUTPUT0") for _ in range(2))
    np.testing.assert_array_equal(first, second)
    mlp = inference_stats(client, "mlp")
    assert mlp["inference_stats"]["cache_hit"]["count"] == 1 and mlp["execution_count"] == 1
    assert inference_stats(client, "mlp_pipeline")["inference_stats"]["success"]["count"] == 2
    assert inference_stats(client, "preprocess")["execution_count"] == 2  # no cache there: it ran twice


def test_a_decoupled_model_with_the_cache_fails_to_load_with_tritons_words(
    client: httpclient.InferenceServerClient,
) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index()}
    entry = index["decoupled_cached"]
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "Response Cache does not currently support model decoupled_cached with 'decoupled' transaction policy. "
        "Please disable the response cache." in entry["reason"]
    )
    assert client.is_model_ready("cached")  # the others loaded


def test_without_a_server_cache_the_model_runs_every_request(repository: Path) -> None:
    with running_server(loopback_config(repository, load=("cached", "identity"))) as plain:
        client = httpclient.InferenceServerClient(plain.http_url)
        x = np.ones((1, 4), np.float32)
        for _ in range(3):
            np.testing.assert_array_equal(infer(client, "cached", x), x)
        stats = inference_stats(client, "cached")
        assert stats["execution_count"] == 3
        assert stats["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
        assert stats["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}
        # As Triton's, the metrics follow the model's setting: there, and zero.
        assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 0' in metrics(plain)
        assert 'nv_cache_num_hits_per_model{model="identity"' not in metrics(plain)


@pytest.mark.peers
def test_perf_analyzer_prints_cache_hits_and_misses(
    peers: Path, server: ReferenceServer, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    out = tmp_path / "pa.csv"
    result = subprocess.run(
        [
            str(peers / "bin" / "perf_analyzer"), "-m", "cached", "-u", f"127.0.0.1:{server.http_port}",
            "--shape", "INPUT0:16", "--concurrency-range", "2", "-p", "150", "-s", "1000", "-r", "10",
            "-f", str(out),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # perf_analyzer sends the same generated input every time: after the first, all hits.
    for line in ("Cache hit count:", "Cache miss count:", "Average Cache Hit Latency:", "Average Cache Miss Latency:"):
        assert line in result.stdout, result.stdout
    hits = [int(line.split(":")[1]) for line in result.stdout.splitlines() if "Cache hit count:" in line]
    assert hits and hits[-1] > 0
    header = out.read_text().splitlines()[0].split(",")
    assert "Server Cache Hit" in header and "Server Cache Miss" in header
