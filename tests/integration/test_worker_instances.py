"""`--worker-instances`: a model with an instance per front-end worker runs in the workers.

What must hold: the requests of such a model never reach the core, yet the statistics extension and
the `nv_*` metrics count every one of them before its answer arrives, as one process does; a model
with fewer instances than workers stays in the core; an unload, a reload with a config override, a
failed load and a worker that dies leave the server answering as one process would; requests that
name shared memory run in the core, where the regions are registered; and `--frontend-workers auto`
starts a worker per instance of such a model.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.config import AUTO_FRONTEND_WORKERS
from reference_server.server import ReferenceServer, running_server
from tests.servers import grpc_client, http_client, loopback_config, write_identity_model

PAIR = "instance_group [ { count: 2 kind: KIND_CPU } ]"
BATCHED = PAIR + "\ndynamic_batching { max_queue_delay_microseconds: 200000 }"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, demo_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("worker_instances") / "models"
    root.mkdir()
    shutil.copytree(demo_repository / "identity", root / "identity")  # one instance: the core's
    write_identity_model(root, "pair", PAIR)
    write_identity_model(root, "batched", BATCHED)
    twin = write_identity_model(root, "twin", PAIR + "\nversion_policy: { all { } }")
    shutil.copytree(twin / "1", twin / "2")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ReferenceServer]:
    config = loopback_config(repository, load=("identity", "pair", "batched", "twin"), frontend_workers=2)
    with running_server(config) as running:
        yield running


def _infer(server: ReferenceServer, model: str, value: float) -> list[float]:
    """One request on a new connection, so that over many of them every worker reads some."""
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})
        connection.request("POST", f"/v2/models/{model}/infer", body)
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 200, answer
    return list(answer["outputs"][0]["data"])


def _successes(server: ReferenceServer, model: str) -> int:
    (stats,) = http_client(server).get_inference_statistics(model)["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


def _core_successes(server: ReferenceServer, model: str) -> int:
    """What the core's own instances of `model` ran."""
    assert server.repository is not None
    return server.repository.get(model).stats.success_count


def _hosting(server: ReferenceServer) -> Any:
    assert server._plane_server is not None
    return server._plane_server.hosting


def _metric(server: ReferenceServer, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}",version="1"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model}")


def test_a_model_with_an_instance_per_worker_runs_in_the_workers(server: ReferenceServer) -> None:
    core_pair, core_identity = _core_successes(server, "pair"), _core_successes(server, "identity")
    for value in range(12):
        assert _infer(server, "pair", float(value)) == [float(value)]
        assert _infer(server, "identity", float(value)) == [float(value)]
    assert _core_successes(server, "pair") == core_pair  # none of them reached the core's instances
    assert _core_successes(server, "identity") == core_identity + 12  # one instance for two workers
    assert sorted(_hosting(server)._hosted) == ["batched", "pair", "twin"]


def test_every_version_runs_in_the_workers_and_is_counted_as_its_own(server: ReferenceServer) -> None:
    client = http_client(server)
    for version, sent in (("1", 3), ("2", 5), ("", 2)):  # no version: the latest, 2
        for value in range(sent):
            assert client.infer("twin", [_input(float(value))], model_version=version).as_numpy("OUTPUT0").tolist() == [
                [float(value)]
            ]
    assert server.repository is not None
    assert [server.repository.get("twin", v).stats.success_count for v in ("1", "2")] == [0, 0]
    counted = {
        s["version"]: s["inference_stats"]["success"]["count"]
        for s in client.get_inference_statistics("twin")["model_stats"]
    }
    assert counted == {"1": 3, "2": 7}


def test_statistics_and_metrics_count_each_request_before_its_answer(server: ReferenceServer) -> None:
    before = _successes(server, "pair")
    client = grpc_client(server)
    for sent in range(1, 11):
        assert _infer(server, "pair", 1.0) == [1.0]
        assert _successes(server, "pair") == before + sent  # read on another connection, any worker
    (stats,) = client.get_inference_statistics("pair").model_stats
    assert stats.inference_stats.success.count == before + 10
    assert stats.inference_count == stats.inference_stats.compute_infer.count == before + 10
    assert sum(b.batch_size * b.compute_infer.count for b in stats.batch_stats) == stats.inference_count
    assert _metric(server, "nv_inference_request_success", "pair") == before + 10
    assert _metric(server, "nv_inference_count", "pair") == before + 10


def test_batches_form_in_the_workers_and_are_counted_once(server: ReferenceServer) -> None:
    before = http_client(server).get_inference_statistics("batched")["model_stats"][0]
    connections = [httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}") for _ in range(8)]
    answers: dict[int, Any] = {}

    def send(index: int) -> None:
        tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[index]], dtype=np.float32))
        answers[index] = connections[index].infer("batched", [tensor]).as_numpy("OUTPUT0").tolist()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {i: [[float(i)]] for i in range(8)}
    after = http_client(server).get_inference_statistics("batched")["model_stats"][0]
    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 8
    assert executions < 8  # a 200 ms queue delay: the requests each worker reads run together
    assert _core_successes(server, "batched") == 0


def test_unload_and_load_reach_the_workers(server: ReferenceServer) -> None:
    client = grpc_client(server)
    client.unload_model("pair")
    try:
        assert "pair" not in _hosting(server)._hosted
        with pytest.raises(InferenceServerException) as refused:
            http_client(server).infer("pair", [_input(1.0)])
        assert refused.value.status() == "404"  # as one process answers a model unloaded (Triton's 404)
        assert "pair" in refused.value.message()
    finally:
        client.load_model("pair")
    assert "pair" in _hosting(server)._hosted
    core_before = _core_successes(server, "pair")
    for value in range(6):
        assert _infer(server, "pair", float(value)) == [float(value)]
    assert _core_successes(server, "pair") == core_before
    assert _successes(server, "pair") == 6  # cumulative since this load, as in one process


def test_a_reload_with_a_config_override_reaches_the_workers(server: ReferenceServer) -> None:
    client = http_client(server)
    config = client.get_model_config("pair")
    # One instance for two workers: the model goes back to the core.
    single = {**config, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    client.load_model("pair", config=json.dumps(single))
    try:
        assert "pair" not in _hosting(server)._hosted
        core_before = _core_successes(server, "pair")
        assert _infer(server, "pair", 2.0) == [2.0]
        assert _core_successes(server, "pair") == core_before + 1
        # Four instances: two in each worker.
        four = {**config, "instance_group": [{"count": 4, "kind": "KIND_CPU"}], "max_batch_size": 4}
        client.load_model("pair", config=json.dumps(four))
        assert "pair" in _hosting(server)._hosted
        assert client.get_model_config("pair")["max_batch_size"] == 4
        for value in range(4):
            assert _infer(server, "pair", float(value)) == [float(value)]
        assert _core_successes(server, "pair") == 0
        assert _successes(server, "pair") == 4
    finally:
        client.load_model("pair")
    assert "pair" in _hosting(server)._hosted


def test_a_failed_load_leaves_the_workers_serving(server: ReferenceServer) -> None:
    client = http_client(server)
    loaded = _hosting(server)._hosted["pair"].load_ids
    bad = {**client.get_model_config("pair"), "max_batch_size": -3}
    with pytest.raises(InferenceServerException) as failed:
        client.load_model("pair", config=json.dumps(bad))
    assert "pair" in failed.value.message()
    assert _hosting(server)._hosted["pair"].load_ids == loaded
    core_before = _core_successes(server, "pair")
    assert _infer(server, "pair", 5.0) == [5.0]
    assert _core_successes(server, "pair") == core_before


def test_requests_naming_shared_memory_run_in_the_core(server: ReferenceServer) -> None:
    import tritonclient.utils.shared_memory as shm

    key = f"/perfkit-worker-instances-{os.getpid()}"
    handle = shm.create_shared_memory_region("pair_in", key, 16)
    try:
        shm.set_shared_memory_region(handle, [np.array([1, 2, 3, 4], dtype=np.float32)])
        client = http_client(server)
        client.register_system_shared_memory("pair_in", key, 16)
        core_before = _core_successes(server, "pair")
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_shared_memory("pair_in", 16)
        assert client.infer("pair", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0, 2.0, 3.0, 4.0]]
        assert _core_successes(server, "pair") == core_before + 1
    finally:
        http_client(server).unregister_system_shared_memory("pair_in")
        shm.destroy_shared_memory_region(handle)


def test_a_worker_that_dies_runs_its_share_again_and_its_counts_stay(server: ReferenceServer) -> None:
    workers = server._workers
    assert workers is not None
    for value in range(16):
        _infer(server, "pair", float(value))
    counted = _successes(server, "pair")
    hosted = _hosting(server)._hosted["pair"]
    published = hosted.counters[(0, 1)]  # worker 0's, version 1
    victim = workers.pids[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while hosted.counters.get((0, 1)) is published or (0, 1) not in hosted.counters:
        assert time.monotonic() < deadline, "the worker was not started again with its share"
        assert _successes(server, "pair") == counted  # what the dead worker counted is kept throughout
        time.sleep(0.05)
    assert victim not in workers.pids
    assert _successes(server, "pair") == counted
    core_before = _core_successes(server, "pair")
    for value in range(8):
        assert _infer(server, "pair", float(value)) == [float(value)]
    assert _successes(server, "pair") == counted + 8
    assert _core_successes(server, "pair") == core_before


def test_without_worker_instances_every_model_runs_in_the_core(repository: Path) -> None:
    config = loopback_config(repository, load=("pair",), frontend_workers=2, worker_instances=False)
    with running_server(config) as core_only:
        for value in range(4):
            assert _infer(core_only, "pair", float(value)) == [float(value)]
        assert _core_successes(core_only, "pair") == 4
        assert _successes(core_only, "pair") == 4


def _input(value: float) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return tensor


def test_auto_sizes_the_workers_by_the_models_loaded(
    demo_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    shutil.copytree(demo_repository / "identity", root / "identity")
    write_identity_model(root, "triple", "instance_group [ { count: 3 kind: KIND_CPU } ]")
    monkeypatch.setattr("v2kit.runtime.cpus.usable_cpus", lambda: 4)  # 4 CPUs: 2 workers unless a model asks more
    config = loopback_config(root, load=("identity", "triple"), frontend_workers=AUTO_FRONTEND_WORKERS)
    with running_server(config) as server:
        assert server.config.frontend_workers == 3
        assert server._workers is not None and len(server._workers.pids) == 3
