"""Tracing and logging with front-end workers (`--frontend-workers 2`): the models the workers run
themselves are traced into the core's one trace file, in the same JSON as the core's requests,
trace_count holds server-wide, and the logging extension's changes reach the workers' own logs.
Requests go on fresh connections, which the kernel spreads over the workers. And the front ends'
receive timestamps time the request's read, in one process and across the workers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config, write_identity_model

pytestmark = pytest.mark.integration

PAIR = "instance_group [ { count: 2 kind: KIND_CPU } ]"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, demo_repository: Path) -> Path:
    root = tmp_path_factory.mktemp("worker_tracing") / "models"
    root.mkdir()
    shutil.copytree(demo_repository / "identity", root / "identity")  # one instance: run by the core
    write_identity_model(root, "pair", PAIR)  # an instance per worker: run by the workers
    return root


def infer(server: ReferenceServer, model: str, request_id: str, grpc: bool = False) -> None:
    """One request on a new connection."""
    data = np.array([[1.0, 2.0]], dtype=np.float32)
    if grpc:
        client: Any = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        tensor: Any = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    else:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(data)
    try:
        np.testing.assert_array_equal(client.infer(model, [tensor], request_id=request_id).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def core_successes(server: ReferenceServer, model: str) -> int:
    assert server.repository is not None
    return int(server.repository.get(model).stats.success_count)


def read_traces(path: Path) -> dict[int, dict[str, Any]]:
    traces: dict[int, dict[str, Any]] = {}
    for event in json.loads(path.read_text()):
        trace = traces.setdefault(event["id"], {"stamps": []})
        if "timestamps" in event:
            trace["stamps"] += [(t["name"], t["ns"]) for t in event["timestamps"]]
        else:
            trace.update(event)
    return traces


def stamp_names(grpc: bool) -> list[str]:
    recv, send = ("GRPC_WAITREAD", "GRPC_SEND") if grpc else ("HTTP_RECV", "HTTP_SEND")
    return [
        f"{recv}_START", f"{recv}_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE", f"{send}_START",
        f"{send}_END",
    ]  # fmt: skip


def test_the_workers_models_are_traced_into_the_cores_file(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(
        repository, frontend_workers=2, trace_config=(f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1")
    )
    with running_server(config) as server:
        before = core_successes(server, "pair")
        for n in range(6):
            infer(server, "pair", f"h{n}")
            infer(server, "pair", f"g{n}", grpc=True)
            infer(server, "identity", f"c{n}")
        assert core_successes(server, "pair") == before  # the workers ran every one of them
    traces = read_traces(trace_file)
    assert sorted(traces) == list(range(1, 19))  # one id each, given in the core
    by_request = {trace["request_id"]: trace for trace in traces.values()}
    assert sorted(by_request) == sorted(f"{kind}{n}" for kind in "hgc" for n in range(6))
    for request_id, trace in by_request.items():
        model = "identity" if request_id[0] == "c" else "pair"
        assert (trace["model_name"], trace["model_version"]) == (model, 1)
        assert [name for name, _ in trace["stamps"]] == stamp_names(request_id[0] == "g")
        times = [ns for _, ns in trace["stamps"]]
        assert times == sorted(times), trace


def test_trace_count_holds_across_the_workers(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(repository, frontend_workers=2, trace_config=(f"triton,file={trace_file}",))
    with running_server(config) as server:
        infer(server, "pair", "before")  # tracing is off
        settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "5"}
        assert (
            httpclient.InferenceServerClient(server.http_url).update_trace_settings("pair", settings)["trace_count"]
            == "5"
        )
        for n in range(12):
            infer(server, "pair", f"r{n}", grpc=bool(n % 2))
        for _ in range(4):  # whichever worker answers, the count is used up
            assert httpclient.InferenceServerClient(server.http_url).get_trace_settings("pair")["trace_count"] == "0"
        infer(server, "pair", "after")
    traces = read_traces(tmp_path / "trace.json.0")  # Triton's: the last of trace_count writes an indexed file
    assert len(traces) == 5
    assert {trace["request_id"] for trace in traces.values()} <= {f"r{n}" for n in range(12)}


def test_a_level_turned_off_reaches_the_workers(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(
        repository, frontend_workers=2, trace_config=(f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1")
    )
    with running_server(config) as server:
        infer(server, "pair", "on")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        grpc.update_trace_settings(settings={"trace_level": ["OFF"]})
        for n in range(6):
            infer(server, "pair", f"off{n}", grpc=bool(n % 2))
    assert [trace["request_id"] for trace in read_traces(trace_file).values()] == ["on"]


def test_log_settings_changes_reach_the_workers(repository: Path, tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    config = loopback_config(repository, frontend_workers=2, log_file=log_file, log_verbose=1)
    with running_server(config) as server:
        # With --log-verbose the workers' HTTP front ends write an INFO line per request.
        for _ in range(6):
            assert httpclient.InferenceServerClient(server.http_url).is_server_live()
        httpclient.InferenceServerClient(server.http_url).update_log_settings({"log_info": False})
        for _ in range(6):
            assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
        httpclient.InferenceServerClient(server.http_url).update_log_settings({"log_info": True})
        for _ in range(6):
            httpclient.InferenceServerClient(server.http_url).get_server_metadata()
        text = log_file.read_text()
    live = re.findall(r'^I.* (\d+) \S+\] "GET /v2/health/live 200"$', text, re.M)
    assert len(live) == 6 and str(os.getpid()) not in live, text
    assert "/v2/health/ready" not in text, text  # no worker wrote them
    assert len(re.findall(r'"GET /v2 200"$', text, re.M)) == 6, text


def slow_http(server: ReferenceServer, model: str, request_id: str, delay_s: float) -> None:
    """A request whose body the client sends `delay_s` after its head."""
    body = json.dumps(
        {"id": request_id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    ).encode()
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as connection:
        connection.sendall(head.encode())
        time.sleep(delay_s)
        connection.sendall(body)
        assert connection.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_receive_stamps_time_the_requests_read(repository: Path, tmp_path: Path, workers: int) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(
        repository, frontend_workers=workers, trace_config=(f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1")
    )
    delay_ns = 200_000_000
    with running_server(config) as server:
        for model in ("pair", "identity"):  # with workers: run by a worker, and by the core
            slow_http(server, model, f"slow-{model}", delay_ns / 1e9)
            infer(server, model, f"grpc-{model}", grpc=True)
    stamps = {trace["request_id"]: dict(trace["stamps"]) for trace in read_traces(trace_file).values()}
    for model in ("pair", "identity"):
        http = stamps[f"slow-{model}"]
        # The body came that much after the head (which the server may read a little late).
        assert http["HTTP_RECV_END"] - http["HTTP_RECV_START"] >= delay_ns // 2
        assert http["HTTP_RECV_END"] <= http["REQUEST_START"]
        grpc = stamps[f"grpc-{model}"]
        assert grpc["GRPC_WAITREAD_START"] < grpc["GRPC_WAITREAD_END"] <= grpc["REQUEST_START"]


def test_the_workers_trace_tensors(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    config = loopback_config(
        repository, frontend_workers=2, trace_config=(f"triton,file={trace_file}", "level=TENSORS", "rate=1")
    )
    with running_server(config) as server:
        before = core_successes(server, "pair")
        for n in range(4):
            infer(server, "pair", f"t{n}", grpc=bool(n % 2))
        assert core_successes(server, "pair") == before
    events = json.loads(trace_file.read_text())
    assert sorted((e["id"], e["activity"]) for e in events) == [
        (n, activity) for n in range(1, 5) for activity in ("TENSOR_BACKEND_OUTPUT", "TENSOR_QUEUE_INPUT")
    ]
    assert {(e["tensor"]["data"], e["tensor"]["shape"], e["tensor"]["dtype"]) for e in events} == {
        ("1,2", "1,2", "FP32")
    }
