"""Trace level TENSORS (`core/trace_tensors.py`): each request's inputs as queued and each response's
outputs, in the records tritonserver 2.51 writes, for unary and streamed requests over HTTP and
gRPC; the same records as tritonserver for the same requests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_server.core.trace_tensors import tensor_records
from reference_server.server import running_server
from tests.integration.test_stream_tracing import repository, send_streams, send_unary
from tests.servers import loopback_config, running_triton

pytestmark = pytest.mark.integration

__all__ = ["repository"]  # the fixture, shared with the stream tests


def tensors_args(folder: Path) -> list[str]:
    return [f"triton,file={folder / 'trace.json'}", "level=TENSORS", "rate=1", "triton,log-frequency=1"]


def records(folder: Path, count: int) -> dict[int, list[dict[str, Any]]]:
    """The tensor records of each trace, by its id, from `count` indexed files."""
    deadline = time.monotonic() + 30
    while len(list(folder.glob("trace.json.*"))) < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    by_id: dict[int, list[dict[str, Any]]] = {}
    for path in folder.glob("trace.json.*"):
        for event in json.loads(path.read_text()):
            assert set(event) == {"id", "activity", "tensor"}, event  # no head, no timestamps at TENSORS alone
            by_id.setdefault(event["id"], []).append({"activity": event["activity"], **event["tensor"]})
    return by_id


def run(folder: Path, http_url: str, grpc_url: str) -> dict[int, list[dict[str, Any]]]:
    send_streams(http_url, grpc_url)
    send_unary(http_url, grpc_url)
    return records(folder, 5)


def test_tensor_records_as_triton_writes_them() -> None:
    tensors = {
        "f": np.array([[0.5, 1e-7], [1234567.0, -2.0]], dtype=np.float32),
        "b": np.array([True, False]),
        "s": np.array([b"ab", b"c"], dtype=object),
        "u": np.array([65], dtype=np.uint8),
        "h": np.array([1.0], dtype=np.float16),
        "i": np.array([-3, 4], dtype=np.int64),
    }
    assert [json.loads("{" + record)["tensor"] for record in tensor_records("TENSOR_QUEUE_INPUT", tensors)] == [
        {"name": "f", "data": "0.5,1e-07,1.23457e+06,-2", "shape": "2,2", "dtype": "FP32"},
        {"name": "b", "data": "1,0", "shape": "2", "dtype": "BOOL"},
        {"name": "s", "data": '"ab","c"', "shape": "2", "dtype": "BYTES"},
        {"name": "u", "data": "A", "shape": "1", "dtype": "UINT8"},
        {"name": "h", "data": "", "shape": "1", "dtype": "FP16"},
        {"name": "i", "data": "-3,4", "shape": "2", "dtype": "INT64"},
    ]


def test_inputs_and_each_responses_outputs(repository: Path, tmp_path: Path) -> None:
    with running_server(loopback_config(repository, trace_config=tuple(tensors_args(tmp_path)))) as server:
        traced = run(tmp_path, server.http_url, f"127.0.0.1:{server.grpc_port}")
    repeat = traced[1]  # gRPC stream: repeat with [1, 2, 3]
    assert repeat[0] == {
        "activity": "TENSOR_QUEUE_INPUT",
        "name": "IN",
        "data": "1,2,3",
        "shape": "3",
        "dtype": "INT32",
    }
    assert [(r["activity"], r["name"], r["data"]) for r in repeat[1:]] == [
        ("TENSOR_BACKEND_OUTPUT", name, data)
        for value, index in ((1, 0), (2, 1), (3, 2))
        for name, data in (("OUT", str(value)), ("IDX", str(index)))
    ]
    for unary in (traced[2], traced[4], traced[5]):  # logged: OUTPUT0 = INPUT0
        assert [(r["activity"], r["name"], r["data"], r["dtype"]) for r in unary] == [
            ("TENSOR_QUEUE_INPUT", "INPUT0", "0,1,2,3", "FP32"),
            ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", "0,1,2,3", "FP32"),
        ]


@pytest.mark.peers
def test_the_same_records_as_tritonserver(peers: Path, repository: Path, tmp_path: Path) -> None:
    theirs_folder, ours_folder = tmp_path / "triton", tmp_path / "ours"
    theirs_folder.mkdir()
    ours_folder.mkdir()
    extra = [arg for entry in tensors_args(theirs_folder) for arg in ("--trace-config", entry)]
    with running_triton(peers, repository, extra_args=extra, auto_complete=False) as triton:
        theirs = run(theirs_folder, triton.http_url, triton.grpc_url)
    with running_server(loopback_config(repository, trace_config=tuple(tensors_args(ours_folder)))) as server:
        ours = run(ours_folder, server.http_url, f"127.0.0.1:{server.grpc_port}")
    assert ours == theirs
