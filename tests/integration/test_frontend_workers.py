"""`--frontend-workers N`: the front ends in N processes sharing the ports, the models in the core.

Every call is made on a server with one process and on one with two front-end workers, and the
answers must be the same; then what only holds across processes: statistics and batches that span
connections served by different workers, model control seen from every connection, a worker that
dies started again, and a core that dies leaving no listener behind.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import ReferenceServer, running_server
from tests.decoupled_models import write_decoupled_models
from tests.servers import loopback_config, write_identity_model

BATCHED = "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 2000000 }"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, demo_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("workers") / "models"
    root.mkdir()
    shutil.copytree(demo_repository / "identity", root / "identity")
    write_identity_model(root, "batched", BATCHED)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: oops\n')
    write_decoupled_models(root)
    return root


@pytest.fixture(scope="module")
def servers(repository: Path) -> Iterator[dict[int, ReferenceServer]]:
    """One server of each kind, explicit model control."""
    load = ("identity", "batched", "repeat")
    with running_server(loopback_config(repository, load=load)) as one:
        with running_server(loopback_config(repository, load=load, frontend_workers=2)) as two:
            yield {1: one, 2: two}


def _http(server: ReferenceServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def _grpc(server: ReferenceServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _failure(call: Any) -> tuple[str | None, str]:
    try:
        call()
    except InferenceServerException as exc:
        return exc.status(), exc.message()
    return None, "no error"


def _identity_inputs(module: Any, values: list[float]) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1, len(values)], "FP32")
    tensor.set_data_from_numpy(np.array([values], dtype=np.float32))
    return [tensor]


def _answers(server: ReferenceServer) -> dict[str, Any]:
    """What a client sees of a server, over both protocols, for calls that do not change it."""
    h, g = _http(server), _grpc(server)
    seen: dict[str, Any] = {}
    for name, client, module in (("http", h, httpclient), ("grpc", g, grpcclient)):
        result = client.infer("identity", _identity_inputs(module, [1.0, -2.5, 3.0]))
        seen[f"{name} infer"] = result.as_numpy("OUTPUT0").tolist()
        seen[f"{name} unknown model"] = _failure(lambda c=client, m=module: c.infer("nope", _identity_inputs(m, [1])))
        seen[f"{name} wrong input"] = _failure(
            lambda c=client, m=module: c.infer("identity", [m.InferInput("WRONG", [1, 1], "FP32")])
        )
        seen[f"{name} load broken"] = _failure(lambda c=client: c.load_model("broken"))
        seen[f"{name} unload unknown"] = _failure(lambda c=client: c.unload_model("never_was"))
        seen[f"{name} ready"] = client.is_server_ready(), client.is_model_ready("identity")
        seen[f"{name} stats of unknown"] = _failure(lambda c=client: c.get_inference_statistics("nope"))
    seen["http metadata"] = h.get_model_metadata("identity")
    seen["http config"] = h.get_model_config("batched")
    seen["grpc config"] = str(g.get_model_config("batched").config)
    seen["index"] = sorted((m["name"], m.get("state", "")) for m in h.get_model_repository_index())
    seen["server extensions"] = h.get_server_metadata()["extensions"]
    seen["repeat stream"] = _stream(g, [4, -1, 6])
    return seen


def _stream(client: grpcclient.InferenceServerClient, values: list[int]) -> list[Any]:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error.message() if error else result))
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    client.async_stream_infer("repeat", [tensor], enable_empty_final_response=True)
    got: list[Any] = []
    while True:
        answer = answers.get(timeout=20)
        if isinstance(answer, str):
            got.append(answer)
            continue
        final = answer.get_response().parameters["triton_final_response"].bool_param
        got.append(None if final else int(answer.as_numpy("OUT")[0]))
        if final:
            break
    client.stop_stream()
    return got


def test_every_call_is_answered_as_one_process_answers_it(servers: dict[int, ReferenceServer]) -> None:
    one, two = _answers(servers[1]), _answers(servers[2])
    assert one["repeat stream"] == [4, "repeat: element 1 is negative (-1)", 6, None]
    assert one["http unknown model"][0] is not None and one["grpc load broken"][0] is not None
    for key in one:
        assert two[key] == one[key], key


def _listening(pid: int) -> bool:
    """Whether process `pid` listens yet: a worker started again is a process before its imports
    are done and its ports are open."""
    return any(c.status == psutil.CONN_LISTEN for c in psutil.Process(pid).net_connections("tcp"))


def _worker_of(server: ReferenceServer, local_port: int) -> int:
    """The pid of the worker holding the server's end of the connection from `local_port`."""
    assert server._workers is not None
    for pid in server._workers.pids:
        for connection in psutil.Process(pid).net_connections("tcp"):
            if connection.raddr and connection.raddr.port == local_port:
                return pid
    raise AssertionError(f"no worker holds the connection from port {local_port}")


_opened: list[http.client.HTTPConnection] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _connections_on_every_worker(server: ReferenceServer, least: int) -> list[http.client.HTTPConnection]:
    """At least `least` HTTP connections, opened until every worker holds one of them (closed
    after the test)."""
    connections: list[http.client.HTTPConnection] = []
    holders: set[int] = set()
    assert server._workers is not None
    while len(connections) < least or holders != set(server._workers.pids):
        assert len(connections) < 64, "the kernel gave every connection to the same worker"
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        _opened.append(connection)
        connection.connect()
        connection.request("GET", "/v2/health/live")
        connection.getresponse().read()
        connections.append(connection)
        holders.add(_worker_of(server, connection.sock.getsockname()[1]))
    return connections


def _post_infer(connection: http.client.HTTPConnection, model: str, value: float) -> list[float]:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})
    connection.request("POST", f"/v2/models/{model}/infer", body)
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200, answer
    return list(answer["outputs"][0]["data"])


def _counts(server: ReferenceServer, model: str) -> tuple[int, int]:
    (stats,) = _http(server).get_inference_statistics(model)["model_stats"]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_one_batch_forms_from_connections_on_different_workers(servers: dict[int, ReferenceServer]) -> None:
    server = servers[2]
    opened = _connections_on_every_worker(server, 8)
    # The eight sent on: the first connection each worker holds, then the others in order, so that
    # every worker holds one of them (the first eight opened may all be on one).
    firsts: dict[int, http.client.HTTPConnection] = {}
    for connection in opened:
        firsts.setdefault(_worker_of(server, connection.sock.getsockname()[1]), connection)
    connections = [*firsts.values(), *(c for c in opened if c not in firsts.values())][:8]
    assert server._workers is not None and set(firsts) == set(server._workers.pids)
    before = _counts(server, "batched")
    results: dict[int, list[float]] = {}
    threads = [
        threading.Thread(target=lambda i=i, c=c: results.__setitem__(i, _post_infer(c, "batched", float(i))))
        for i, c in enumerate(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {i: [float(i)] for i in range(8)}
    inferences, executions = (a - b for a, b in zip(_counts(server, "batched"), before))
    # The preferred size (8) closes the batch long before the 2 s queue delay would.
    assert (inferences, executions) == (8, 1)


def test_statistics_count_every_worker_s_requests(servers: dict[int, ReferenceServer]) -> None:
    server = servers[2]
    connections = _connections_on_every_worker(server, 4)
    before = _counts(server, "identity")
    for index, connection in enumerate(connections * 3):
        assert _post_infer(connection, "identity", float(index)) == [float(index)]
    sent = 3 * len(connections)
    for _ in range(3):  # each read on a new connection, landing on any worker
        assert _counts(server, "identity")[0] - before[0] == sent
    assert _grpc(server).get_inference_statistics("identity").model_stats[0].inference_count - before[0] == sent


def test_unload_and_load_through_one_worker_reach_every_connection(servers: dict[int, ReferenceServer]) -> None:
    server = servers[2]
    connections = _connections_on_every_worker(server, 2)
    http_client = _http(server)
    http_client.unload_model("identity")
    try:
        for connection in connections:
            connection.request("GET", "/v2/models/identity/ready")
            response = connection.getresponse()
            response.read()
            assert response.status != 200
        assert not _grpc(server).is_model_ready("identity")
    finally:
        _grpc(server).load_model("identity")
    for connection in connections:
        assert _post_infer(connection, "identity", 7.0) == [7.0]


def test_a_reload_with_a_config_override_reaches_every_connection(servers: dict[int, ReferenceServer]) -> None:
    """A load of a loaded model with a config override reloads it: every worker's connections see the
    new config and are served by it, and a later plain load goes back to the repository's."""
    server = servers[2]
    connections = _connections_on_every_worker(server, 2)
    config = _http(server).get_model_config("identity")
    override = {**config, "max_batch_size": 4}
    _grpc(server).load_model("identity", config=json.dumps(override))
    try:
        for connection in connections:
            connection.request("GET", "/v2/models/identity/config")
            response = connection.getresponse()
            assert json.loads(response.read())["max_batch_size"] == 4
            assert _post_infer(connection, "identity", 3.0) == [3.0]
    finally:
        _http(server).load_model("identity")
    assert _grpc(server).get_model_config("identity").config.max_batch_size == config["max_batch_size"]


def test_system_shared_memory_registered_through_one_worker_serves_another(
    servers: dict[int, ReferenceServer],
) -> None:
    import tritonclient.utils.shared_memory as shm

    server = servers[2]
    key = f"/perfkit-workers-{os.getpid()}"
    handle = shm.create_shared_memory_region("workers_in", key, 16)
    try:
        shm.set_shared_memory_region(handle, [np.array([1, 2, 3, 4], dtype=np.float32)])
        _grpc(server).register_system_shared_memory("workers_in", key, 16)
        connection = _connections_on_every_worker(server, 2)[-1]  # any worker
        body = json.dumps({"inputs": [{
            "name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
            "parameters": {"shared_memory_region": "workers_in", "shared_memory_byte_size": 16},
        }]})  # fmt: skip
        connection.request("POST", "/v2/models/identity/infer", body)
        answer = json.loads(connection.getresponse().read())
        assert "outputs" in answer, answer
        assert answer["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
        assert [r["name"] for r in _http(server).get_system_shared_memory_status()] == ["workers_in"]
    finally:
        _http(server).unregister_system_shared_memory("workers_in")
        shm.destroy_shared_memory_region(handle)
    assert _grpc(server).get_system_shared_memory_status().regions == {}


def test_a_worker_that_dies_is_started_again(servers: dict[int, ReferenceServer]) -> None:
    server = servers[2]
    assert server._workers is not None
    victim = server._workers.pids[0]
    os.kill(victim, signal.SIGKILL)
    # Connections the kernel queued for the dying worker are reset with it; once the core has seen
    # it end, the other worker takes every new connection.
    deadline = time.monotonic() + 10
    while victim in server._workers.pids:
        assert time.monotonic() < deadline, "the core never saw its worker end"
        time.sleep(0.005)
    for value in range(5):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        _opened.append(connection)
        assert _post_infer(connection, "identity", float(value)) == [float(value)]
    workers = server._workers
    deadline = time.monotonic() + 30
    while not (len(workers.pids) == 2 and victim not in workers.pids and all(map(_listening, workers.pids))):
        assert time.monotonic() < deadline, "no worker was started in place of the one that died"
        time.sleep(0.05)
    assert workers.restarts == 1
    _connections_on_every_worker(server, 2)  # and it serves


def test_a_core_that_dies_leaves_no_worker_listening(repository: Path) -> None:
    core = subprocess.Popen(
        [sys.executable, "-m", "reference_server", "--model-repository", str(repository),
         "--model-control-mode", "explicit", "--load-model", "identity", "--frontend-workers", "2",
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert core.stdout is not None
        for line in core.stdout:
            if line.startswith("Server ready"):
                break
        workers = psutil.Process(core.pid).children()
        assert len(workers) == 2
        core.kill()
        core.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"workers still running after their core was killed: {alive}"
    finally:
        if core.poll() is None:
            core.kill()
            core.wait(10)
        if core.stdout is not None:
            core.stdout.close()
