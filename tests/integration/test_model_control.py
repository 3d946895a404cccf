"""Model control through NVIDIA's tritonclient.http: explicit load/unload with config overrides,
reloads under load, poll mode, and several versions served at once."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.config import ServerConfig
from reference_server.errors import NotFound
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration


def server_config(repository: Path, mode: str, **extra: Any) -> ServerConfig:
    return loopback_config(repository, model_control_mode=mode, **extra)


@pytest.fixture
def client_of() -> Iterator[Callable[[ReferenceServer], httpclient.InferenceServerClient]]:
    clients: list[httpclient.InferenceServerClient] = []

    def make(server: ReferenceServer) -> httpclient.InferenceServerClient:
        clients.append(httpclient.InferenceServerClient(server.http_url, network_timeout=60))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def mlp_override(*, instances: int = 1, batching: dict[str, Any] | None = None, dims: int = 256) -> str:
    """A complete mlp config for the load API; `batching` None means no dynamic batcher."""
    config: dict[str, Any] = {
        "name": "mlp",
        "backend": "onnxruntime",
        "max_batch_size": 64,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [dims]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [10]}],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    }
    if batching is not None:
        config["dynamic_batching"] = batching
    return json.dumps(config)


def mlp_input(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def identity_input(rows: int = 1) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [rows, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 4), dtype=np.float32))
    return [tensor]


def infer_mlp_concurrently(url: str, count: int) -> None:
    def one(i: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            x = np.full((1, 256), float(i), dtype=np.float32)
            assert client.infer("mlp", mlp_input(x)).as_numpy("OUTPUT0").shape == (1, 10)
        finally:
            client.close()

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))


def batch_sizes(client: httpclient.InferenceServerClient, model: str) -> dict[int, int]:
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def index_of(client: httpclient.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {entry["name"]: entry for entry in client.get_model_repository_index()}


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds; the deadline is generous, the poll interval short."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


# --- explicit mode --------------------------------------------------------------------------------


def test_load_model_star_loads_all_and_unknown_names_stop_the_start(demo_repository: Path) -> None:
    with running_server(server_config(demo_repository, "explicit", load_models=("*",))) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert all(client.is_model_ready(name) for name in ("mlp", "convnet", "identity"))
        client.close()
    with pytest.raises(NotFound, match=r"--load-model 'typo': model 'typo' is not in the model repository"):
        with running_server(server_config(demo_repository, "explicit", load_models=("mlp", "typo"))):
            pass


def test_explicit_load_with_config_override_unload_and_reload(demo_repository: Path, client_of: Any) -> None:
    with running_server(server_config(demo_repository, "explicit", load_models=("mlp",))) as server:
        client = client_of(server)
        # The index lists every model on disk; only mlp was loaded.
        assert index_of(client) == {
            "convnet": {"name": "convnet"},
            "identity": {"name": "identity"},
            "mlp": {"name": "mlp", "version": "1", "state": "READY"},  # no empty reason, as in Triton
            "mlp_pipeline": {"name": "mlp_pipeline"},
            "preprocess": {"name": "preprocess"},
            "python_linear": {"name": "python_linear"},
        }
        with pytest.raises(InferenceServerException) as info:
            client.load_model("no_such_model")
        assert info.value.status() == "404" and "no_such_model" in info.value.message()
        assert "no_such_model" not in index_of(client)

        # Two instances, no batcher: every execution is one request.
        client.load_model("mlp", config=mlp_override(instances=2, batching=None))
        config = client.get_model_config("mlp")
        assert [g["count"] for g in config["instance_group"]] == [2]
        assert "dynamic_batching" not in config
        infer_mlp_concurrently(server.http_url, 8)
        assert batch_sizes(client, "mlp") == {1: 8}

        # One instance with a batcher that waits (up to 2 s) for 4 requests: they run as one batch.
        batching = {"preferred_batch_size": [4], "max_queue_delay_microseconds": 2_000_000}
        client.load_model("mlp", config=mlp_override(instances=1, batching=batching))
        config = client.get_model_config("mlp")
        assert [g["count"] for g in config["instance_group"]] == [1]
        assert config["dynamic_batching"]["preferred_batch_size"] == [4]
        infer_mlp_concurrently(server.http_url, 4)
        assert batch_sizes(client, "mlp") == {4: 1}

        client.unload_model("mlp")
        assert not client.is_model_ready("mlp")
        assert index_of(client)["mlp"] == {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
        with pytest.raises(InferenceServerException) as info:
            client.infer("mlp", mlp_input(np.zeros((1, 256), dtype=np.float32)))
        # Triton's status and words for a model it unloaded.
        assert (info.value.status(), info.value.message()) == (
            "404",
            "Request for unknown model: 'mlp' has no available versions",
        )

        client.load_model("mlp")  # no config: the one on disk again
        assert client.is_model_ready("mlp")
        config = client.get_model_config("mlp")
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100


def test_failed_reload_keeps_serving_the_old_config(demo_repository: Path, client_of: Any) -> None:
    with running_server(server_config(demo_repository, "explicit", load_models=("mlp",))) as server:
        client = client_of(server)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("mlp", config=mlp_override(dims=300))
        message = info.value.message()
        assert info.value.status() == "400"
        assert "INPUT0" in message and "[300]" in message and "[-1, 256]" in message and "mlp" in message
        assert client.is_model_ready("mlp")
        assert client.get_model_config("mlp")["input"][0]["dims"] == [256]
        out = client.infer("mlp", mlp_input(np.ones((2, 256), dtype=np.float32))).as_numpy("OUTPUT0")
        assert out.shape == (2, 10)
        entry = index_of(client)["mlp"]
        assert entry["state"] == "READY" and "INPUT0" in entry["reason"]


def test_reloads_under_concurrent_load_lose_no_request(demo_repository: Path, client_of: Any) -> None:
    rng = np.random.default_rng(7)
    # Large batches keep the model busy most of the time, so every reload finds requests queued on
    # and running in the old version's scheduler.
    samples = [rng.standard_normal((int(rng.integers(16, 65)), 256)).astype(np.float32) for _ in range(16)]
    session = ort.InferenceSession(
        str(demo_repository / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    expected = [session.run(None, {"INPUT0": x})[0] for x in samples]
    overrides = [
        mlp_override(instances=2, batching={}),
        mlp_override(instances=1, batching=None),
        mlp_override(instances=2, batching={"max_queue_delay_microseconds": 500, "preferred_batch_size": [4, 8]}),
    ]
    workers, cap_per_worker, deadline = 4, 1500, time.monotonic() + 30
    sent = [0] * workers
    good = [0] * workers
    failures: list[str] = []
    not_ready = [0]
    stop = threading.Event()

    with running_server(server_config(demo_repository, "explicit", load_models=("mlp",))) as server:
        url = server.http_url

        def send(k: int) -> None:
            client = httpclient.InferenceServerClient(url, network_timeout=60)
            try:
                i = k
                while not stop.is_set() and sent[k] < cap_per_worker and time.monotonic() < deadline:
                    j = i % len(samples)
                    i += 1
                    sent[k] += 1
                    try:
                        out = client.infer("mlp", mlp_input(samples[j])).as_numpy("OUTPUT0")
                    except Exception as exc:
                        failures.append(f"worker {k}: {type(exc).__name__}: {exc}")
                        continue
                    if out is None or out.shape != expected[j].shape or not np.allclose(out, expected[j], atol=1e-5):
                        failures.append(f"worker {k}: wrong output for sample {j}")
                    else:
                        good[k] += 1
            finally:
                client.close()

        def watch_readiness() -> None:
            client = httpclient.InferenceServerClient(url, network_timeout=60)
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    if not client.is_model_ready("mlp"):
                        not_ready[0] += 1
            finally:
                client.close()

        threads = [threading.Thread(target=send, args=(k,)) for k in range(workers)]
        threads.append(threading.Thread(target=watch_readiness))
        for thread in threads:
            thread.start()
        try:
            client = client_of(server)
            wait_for(lambda: sum(good) >= 40, "traffic before the first reload")
            for override in overrides:
                client.load_model("mlp", config=override)
                # Traffic must reach the new version before the next reload.
                target = sum(good) + 150

                def served_more(target: int = target) -> bool:
                    return sum(good) >= target or bool(failures)

                wait_for(served_more, "traffic after a reload")
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert not_ready[0] == 0
        assert sum(good) == sum(sent) and sum(sent) >= 40 + 3 * 150
        config = client.get_model_config("mlp")
        assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
        (stats,) = client.get_inference_statistics("mlp")["model_stats"]
        assert stats["inference_stats"]["success"]["count"] > 0 and stats["inference_stats"]["fail"]["count"] == 0


# --- poll mode ------------------------------------------------------------------------------------


def test_poll_mode_follows_the_repository(repository_copy: Path, client_of: Any) -> None:
    with running_server(server_config(repository_copy, "poll", repository_poll_secs=0.2)) as server:
        client = client_of(server)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("mlp")
        assert info.value.status() == "503" and "poll" in info.value.message()

        mlp_config = repository_copy / "mlp" / "config.pbtxt"
        mlp_config.write_text(mlp_config.read_text().replace("max_batch_size: 64", "max_batch_size: 8"))
        wait_for(lambda: client.get_model_config("mlp")["max_batch_size"] == 8, "mlp reloaded with max_batch_size 8")

        staging = repository_copy.parent / "staging"
        shutil.copytree(repository_copy / "identity", staging)
        (staging / "config.pbtxt").write_text(
            (staging / "config.pbtxt").read_text().replace('name: "identity"', 'name: "identity2"')
        )
        staging.rename(repository_copy / "identity2")
        wait_for(lambda: client.is_model_ready("identity2"), "the new model identity2 to be ready")
        assert client.infer("identity2", identity_input()).as_numpy("OUTPUT0").shape == (1, 4)

        shutil.rmtree(repository_copy / "convnet")
        wait_for(lambda: not client.is_model_ready("convnet"), "the removed model convnet to be unloaded")
        assert "convnet" not in index_of(client)
        with pytest.raises(InferenceServerException) as info:
            client.infer("convnet", mlp_input(np.zeros((1, 1, 28, 28), dtype=np.float32)))
        assert info.value.status() == "404"  # unloaded: Triton's "has no available versions"

        identity_config = repository_copy / "identity" / "config.pbtxt"
        identity_config.write_text(identity_config.read_text() + "\ninstance_group [ { count: \n")
        wait_for(lambda: index_of(client)["identity"].get("reason"), "the broken identity config to be reported")
        entry = index_of(client)["identity"]
        assert entry["state"] == "READY" and "identity/config.pbtxt" in entry["reason"]
        assert client.is_model_ready("identity")
        assert client.infer("identity", identity_input(2)).as_numpy("OUTPUT0").shape == (2, 4)


# --- versions -------------------------------------------------------------------------------------


def multi_config(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "multi",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "version_policy": policy,
    }


@pytest.fixture
def versioned_repository(repository_copy: Path) -> Path:
    model = repository_copy / "multi"
    for version in (1, 2, 3):
        (model / str(version)).mkdir(parents=True)
        shutil.copy(repository_copy / "identity" / "1" / "model.onnx", model / str(version) / "model.onnx")
    # The disk config serves all versions; the load API switches policies with overrides.
    (model / "config.pbtxt").write_text(
        'name: "multi"\nmax_batch_size: 8\nversion_policy: { all { } }\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    return repository_copy


def test_several_versions_under_each_version_policy(versioned_repository: Path, client_of: Any) -> None:
    with running_server(server_config(versioned_repository, "explicit", load_models=("multi",))) as server:
        client = client_of(server)

        def ready_versions() -> list[str]:
            return [v for v in ("1", "2", "3") if client.is_model_ready("multi", v)]

        def served_version(version: str = "") -> str:
            result = client.infer("multi", identity_input(), model_version=version)
            return str(result.get_response()["model_version"])

        assert ready_versions() == ["1", "2", "3"]
        assert client.get_model_metadata("multi")["versions"] == ["1", "2", "3"]
        assert served_version() == "3"  # no version: the highest ready one
        assert [served_version("1"), served_version("1"), served_version("2")] == ["1", "1", "2"]
        stats = {s["version"]: s["inference_count"] for s in client.get_inference_statistics("multi")["model_stats"]}
        assert stats == {"1": 2, "2": 1, "3": 1}
        (only_v2,) = client.get_inference_statistics("multi", "2")["model_stats"]
        assert only_v2["version"] == "2" and only_v2["inference_count"] == 1
        assert [e["version"] for e in client.get_model_repository_index() if e["name"] == "multi"] == ["1", "2", "3"]

        client.load_model("multi", config=json.dumps(multi_config({"latest": {"num_versions": 2}})))
        assert ready_versions() == ["2", "3"]
        assert client.get_model_metadata("multi")["versions"] == ["2", "3"]
        with pytest.raises(InferenceServerException) as info:
            served_version("1")
        assert info.value.status() == "404"

        client.load_model("multi", config=json.dumps(multi_config({"specific": {"versions": [1, 3]}})))
        assert ready_versions() == ["1", "3"]
        assert served_version() == "3"

        client.load_model("multi", config=json.dumps(multi_config({"specific": {"versions": [2]}})))
        assert ready_versions() == ["2"]
        assert served_version() == "2"
        assert client.get_model_config("multi")["version_policy"] == {"specific": {"versions": [2]}}
