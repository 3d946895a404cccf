"""Streamed requests are traced as Triton traces them: gRPC ModelStreamInfer and the HTTP generate
extension, one trace per request with the scheduler's REQUEST_START..REQUEST_END, the front end's
read, INFER_RESPONSE_COMPLETE (gRPC: for the first response; HTTP: for each, and for the final flag)
and a send per response; the same timestamp names on real tritonserver 2.51 for the same requests (and for unary ones).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from reference_server.server import running_server
from tests.decoupled_models import write_decoupled_models
from tests.integration.test_logging_tracing import CONFIG, MODEL
from tests.servers import loopback_config, running_triton

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream_tracing") / "models"
    root.mkdir()
    write_decoupled_models(root)  # repeat: a response per element, then the final flag alone
    (root / "logged" / "1").mkdir(parents=True)  # a python model that is not decoupled
    (root / "logged" / "config.pbtxt").write_text(CONFIG)
    (root / "logged" / "1" / "model.py").write_text(MODEL)
    return root


def trace_args(trace_file: Path) -> list[str]:
    # log-frequency 1: each trace is written as it completes (Triton is killed, not stopped, after a test).
    return [f"triton,file={trace_file}", "level=TIMESTAMPS", "rate=1", "triton,log-frequency=1"]


def send_streams(http_url: str, grpc_url: str) -> None:
    """Three streamed requests: `repeat` with 3 elements and `logged` over gRPC ModelStreamInfer
    (one after the other, so that their ids follow), and `repeat` over generate_stream."""
    client = grpcclient.InferenceServerClient(grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    three = grpcclient.InferInput("IN", [3], "INT32")
    three.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    client.async_stream_infer("repeat", [three], request_id="grpc-repeat")
    for _ in range(3):
        assert answers.get(timeout=60)[1] is None
    four = grpcclient.InferInput("INPUT0", [4], "FP32")
    four.set_data_from_numpy(np.arange(4, dtype=np.float32))
    client.async_stream_infer("logged", [four], request_id="grpc-logged")
    assert answers.get(timeout=60)[1] is None
    client.stop_stream()
    client.close()
    connection = http.client.HTTPConnection(http_url, timeout=60)
    try:
        body = json.dumps({"id": "http-repeat", "IN": [4, 5]})
        connection.request("POST", "/v2/models/repeat/generate_stream", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.read().count(b"data: ") == 2
    finally:
        connection.close()


def send_unary(http_url: str, grpc_url: str) -> None:
    """`logged` once over HTTP and once over gRPC ModelInfer, to compare with the streams."""
    for module, url, request_id in ((httpclient, http_url, "http-unary"), (grpcclient, grpc_url, "grpc-unary")):
        client: Any = module.InferenceServerClient(url)
        tensor: Any = module.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        client.infer("logged", [tensor], request_id=request_id)
        client.close()


def read_traces(folder: Path, count: int) -> dict[str, list[tuple[str, int]]]:
    """The timestamps of each traced request, by request id, from `count` indexed trace files
    (waited for: a trace is written once its request is done)."""
    deadline = time.monotonic() + 30
    while len(list(folder.glob("trace.json.*"))) < count:
        assert time.monotonic() < deadline, sorted(os.listdir(folder))
        time.sleep(0.05)
    time.sleep(0.2)  # the last file's write, if it is being written
    traces: dict[int, dict[str, Any]] = {}
    for path in folder.glob("trace.json.*"):
        for event in json.loads(path.read_text()):
            trace = traces.setdefault(event["id"], {"stamps": []})
            if "timestamps" in event:
                trace["stamps"] += [(t["name"], t["ns"]) for t in event["timestamps"]]
            else:
                trace.update(event)
    return {trace["request_id"]: trace["stamps"] for trace in traces.values()}


CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


def test_streamed_requests_are_traced(repository: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    with running_server(loopback_config(repository, trace_config=tuple(trace_args(trace_file)))) as server:
        send_streams(server.http_url, f"127.0.0.1:{server.grpc_port}")
        traces = read_traces(tmp_path, 3)
    assert sorted(traces) == ["grpc-logged", "grpc-repeat", "http-repeat"]
    for request_id, stamps in traces.items():
        names = [name for name, _ in stamps]
        front, responses = {"grpc-repeat": ("GRPC", 3), "grpc-logged": ("GRPC", 1), "http-repeat": ("HTTP", 2)}[
            request_id
        ]
        recv, send = ("GRPC_WAITREAD", "GRPC_SEND") if front == "GRPC" else ("HTTP_RECV", "HTTP_SEND")
        sends = [f"{send}_START", f"{send}_END"] * responses
        assert names[:2] == [f"{recv}_START", f"{recv}_END"], names
        assert [name for name in names if name in CORE] == CORE, names
        assert [name for name in names if name.startswith(send)] == sends, names
        # Triton's INFER_RESPONSE_COMPLETE: over gRPC for the first response; over HTTP for each, and
        # for the final flag that comes alone.
        completes = 1 if front == "GRPC" else responses + 1
        assert names.count("INFER_RESPONSE_COMPLETE") == completes and names.count("REQUEST_END") == 1, names
        assert names.index("INFER_RESPONSE_COMPLETE") < names.index(f"{send}_START"), names
        # Each side's in order; a decoupled model's responses go out while it computes, as in Triton.
        core = [ns for name, ns in stamps if name in CORE or name == "REQUEST_END"]
        sent = [ns for name, ns in stamps if name not in CORE and name != "REQUEST_END"]
        assert core == sorted(core) and sent == sorted(sent), stamps


@pytest.mark.peers
def test_the_same_timestamps_as_tritonserver(peers: Path, repository: Path, tmp_path: Path) -> None:
    names: dict[str, dict[str, Counter[str]]] = {}
    theirs_folder, ours_folder = tmp_path / "triton", tmp_path / "ours"
    theirs_folder.mkdir()
    ours_folder.mkdir()
    extra = [arg for entry in trace_args(theirs_folder / "trace.json") for arg in ("--trace-config", entry)]
    with running_triton(peers, repository, extra_args=extra, auto_complete=False) as triton:
        send_streams(triton.http_url, triton.grpc_url)
        send_unary(triton.http_url, triton.grpc_url)
        traces = read_traces(theirs_folder, 5)
    names["triton"] = {request_id: Counter(name for name, _ in stamps) for request_id, stamps in traces.items()}
    config = loopback_config(repository, trace_config=tuple(trace_args(ours_folder / "trace.json")))
    with running_server(config) as server:
        send_streams(server.http_url, f"127.0.0.1:{server.grpc_port}")
        send_unary(server.http_url, f"127.0.0.1:{server.grpc_port}")
        traces = read_traces(ours_folder, 5)
    names["ours"] = {request_id: Counter(name for name, _ in stamps) for request_id, stamps in traces.items()}
    assert names["ours"] == names["triton"]


@pytest.mark.parametrize("workers", [1, 2])
def test_generate_streams_receive_stamps_time_the_read(repository: Path, tmp_path: Path, workers: int) -> None:
    delay_ns = 200_000_000
    config = loopback_config(
        repository, frontend_workers=workers, trace_config=tuple(trace_args(tmp_path / "trace.json"))
    )
    with running_server(config) as server:
        body = json.dumps({"id": "slow", "IN": [7]}).encode()
        head = f"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as connection:
            connection.sendall(head.encode())
            time.sleep(delay_ns / 1e9)  # the body comes that much after the head
            connection.sendall(body)
            assert connection.recv(65536).startswith(b"HTTP/1.1 200")
        stamps = dict(read_traces(tmp_path, 1)["slow"])
    assert stamps["HTTP_RECV_END"] - stamps["HTTP_RECV_START"] >= delay_ns // 2  # the head may be read a little late
    assert stamps["HTTP_RECV_END"] <= stamps["REQUEST_START"]
