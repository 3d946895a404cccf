"""Bad requests get a KServe error JSON with the right status, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reference_server.config import ServerConfig
from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration


def call(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def infer_json(model: str = "mlp", **overrides: object) -> bytes:
    request: dict[str, object] = {
        "inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]
    }
    request.update(overrides)
    return json.dumps(request).encode()


def binary_body(
    values: np.ndarray, declared_size: int | None = None, shape: list[int] | None = None
) -> tuple[bytes, str]:
    raw = values.astype(np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": shape or list(values.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw) if declared_size is None else declared_size},
                }
            ]
        }
    ).encode()
    return header + raw, str(len(header))


GOOD = np.zeros((1, 256), dtype=np.float32)
LIES_LARGER = binary_body(GOOD, declared_size=4096)
LIES_SMALLER = binary_body(GOOD, declared_size=16)

CASES = [
    # (name, path, body, headers, status, message fragment)
    ("unknown model", "/v2/models/nope/infer", infer_json(), {}, 404, "nope"),
    ("unknown version", "/v2/models/mlp/versions/9/infer", infer_json(), {}, 404, "version 9"),
    ("non-numeric version", "/v2/models/mlp/versions/abc/infer", infer_json(), {}, 400, "version string 'abc'"),
    (
        "wrong input name",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [{"name": "X", "shape": [1, 256], "datatype": "FP32", "data": [0] * 256}]}).encode(),
        {},
        400,
        "unexpected inference input 'X'",
    ),
    (
        "wrong datatype",
        "/v2/models/mlp/infer",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "INT32", "data": [0] * 256}]}
        ).encode(),
        {},
        400,
        "expects 'FP32'",
    ),
    (
        "wrong shape",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 128], "datatype": "FP32", "data": [0] * 128}]}).encode(),
        {},
        400,
        "unexpected shape",
    ),
    (
        "batch too large",
        "/v2/models/mlp/infer",
        json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [65, 256], "datatype": "FP32", "data": [0] * (65 * 256)}]}
        ).encode(),
        {},
        400,
        "batch-size must be <= 64",
    ),
    (
        "data count mismatch",
        "/v2/models/mlp/infer",
        json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 256], "datatype": "FP32", "data": [0] * 10}]}).encode(),
        {},
        400,
        "INPUT0",
    ),
    ("malformed JSON", "/v2/models/mlp/infer", b'{"inputs": [', {}, 400, ""),
    ("JSON not an object", "/v2/models/mlp/infer", b"[1, 2]", {}, 400, ""),
    ("no inputs", "/v2/models/mlp/infer", b'{"inputs": []}', {}, 400, "inputs"),
    ("non-UTF-8 body", "/v2/models/mlp/infer", b"\xff\xfe\x00garbage", {}, 400, ""),
    (
        "header length past body",
        "/v2/models/mlp/infer",
        binary_body(GOOD)[0],
        {"Inference-Header-Content-Length": "999999"},
        400,
        "",
    ),
    (
        "header length not a number",
        "/v2/models/mlp/infer",
        binary_body(GOOD)[0],
        {"Inference-Header-Content-Length": "ten"},
        400,
        "Inference-Header-Content-Length",
    ),
    (
        "binary size larger than sent",
        "/v2/models/mlp/infer",
        LIES_LARGER[0],
        {"Inference-Header-Content-Length": LIES_LARGER[1]},
        400,
        "INPUT0",
    ),
    (
        "binary size smaller than sent",
        "/v2/models/mlp/infer",
        LIES_SMALLER[0],
        {"Inference-Header-Content-Length": LIES_SMALLER[1]},
        400,
        "",
    ),
    ("binary data without header length", "/v2/models/mlp/infer", binary_body(GOOD)[0], {}, 400, ""),
    (
        "unknown output",
        "/v2/models/mlp/infer",
        infer_json(outputs=[{"name": "NOPE"}]),
        {},
        400,
        "unexpected inference output 'NOPE'",
    ),
    ("path trick", "/v2/models/..%2F..%2Fetc/infer", infer_json(), {}, 404, ""),
    ("dot-dot model", "/v2/models/%2e%2e/infer", infer_json(), {}, 404, ""),
    ("unknown route", "/v2/nothing/here", b"", {}, 404, ""),
]


@pytest.mark.parametrize("name,path,body,headers,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_kserve_error(
    demo_server: ReferenceServer,
    name: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    assert demo_server.http_port is not None
    got_status, payload = call(demo_server.http_port, "POST" if body else "GET", path, body, headers)
    assert got_status == status, payload
    message = json.loads(payload)["error"]
    assert isinstance(message, str) and message
    assert fragment in message
    # ...and the server keeps serving.
    ok_status, ok_payload = call(demo_server.http_port, "POST", "/v2/models/mlp/infer", infer_json())
    assert ok_status == 200, ok_payload
    assert json.loads(ok_payload)["outputs"][0]["shape"] == [1, 10]


def test_raw_binary_request(demo_server: ReferenceServer) -> None:
    """Inference-Header-Content-Length: 0 sends the only input's bytes; outputs come back binary."""
    assert demo_server.http_port is not None
    x = np.arange(256, dtype=np.float32)
    status, payload = call(
        demo_server.http_port, "POST", "/v2/models/mlp/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200, payload


def test_oversized_body_is_refused(demo_repository: Path) -> None:
    config = loopback_config(demo_repository, http_max_input_size=4096)
    with running_server(config) as server:
        assert server.http_port is not None
        big = infer_json(inputs=[{"name": "INPUT0", "shape": [8, 256], "datatype": "FP32", "data": [0.25] * 2048}])
        assert len(big) > 4096
        status, payload = call(server.http_port, "POST", "/v2/models/mlp/infer", big)
        assert status == 413
        assert "--http-max-input-size" in json.loads(payload)["error"]
        small = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 256], "datatype": "FP32", "parameters": {"binary_data_size": 1024}}
                ]
            }
        ).encode()
        status, _ = call(
            server.http_port,
            "POST",
            "/v2/models/mlp/infer",
            small + bytes(1024),
            {"Inference-Header-Content-Length": str(len(small))},
        )
        assert status == 200


@pytest.fixture
def broken_repository(repository_copy: Path) -> Path:
    bad_syntax = repository_copy / "bad_syntax"
    shutil.copytree(repository_copy / "identity", bad_syntax)
    (bad_syntax / "config.pbtxt").write_text('name: "bad_syntax"\nmax_batch_size: 8\ninput [ { name: }\n')
    not_onnx = repository_copy / "not_onnx"
    (not_onnx / "1").mkdir(parents=True)
    (not_onnx / "1" / "model.onnx").write_bytes(b"this is not an ONNX file")
    contradicts = repository_copy / "contradicts"
    shutil.copytree(repository_copy / "mlp", contradicts)
    text = (contradicts / "config.pbtxt").read_text().replace('"mlp"', '"contradicts"').replace("256", "300")
    (contradicts / "config.pbtxt").write_text(text)
    return repository_copy


def test_broken_models_do_not_stop_the_others(broken_repository: Path) -> None:
    config = ServerConfig(model_repository=broken_repository, http_port=0, grpc_port=0, metrics_port=0)
    with running_server(config) as server:
        port = server.http_port
        assert port is not None
        status, payload = call(port, "POST", "/v2/models/mlp/infer", infer_json())
        assert status == 200, payload
        assert call(port, "GET", "/v2/health/live")[0] == 200
        # Strict readiness, as Triton: not every model is ready.
        assert call(port, "GET", "/v2/health/ready")[0] == 400
        index = {e["name"]: e for e in json.loads(call(port, "POST", "/v2/repository/index", b"{}")[1])}
        assert index["mlp"]["state"] == "READY"
        for name in ("bad_syntax", "not_onnx", "contradicts"):
            assert index[name]["state"] == "UNAVAILABLE"
        assert "bad_syntax/config.pbtxt:3:" in index["bad_syntax"]["reason"]
        assert "not_onnx" in index["not_onnx"]["reason"]
        assert "config.pbtxt" in index["contradicts"]["reason"] and "model.onnx" in index["contradicts"]["reason"]
        status, payload = call(port, "POST", "/v2/models/bad_syntax/infer", infer_json())
        # Triton's 404 for a model whose config it could not read (the reason is the index's).
        assert (status, json.loads(payload)["error"]) == (404, "Request for unknown model: 'bad_syntax' is not found")


def test_metrics_use_triton_names(demo_server: ReferenceServer) -> None:
    assert demo_server.http_port is not None and demo_server.metrics_port is not None
    for _ in range(3):
        assert call(demo_server.http_port, "POST", "/v2/models/mlp/infer", infer_json())[0] == 200
    status, payload = call(demo_server.metrics_port, "GET", "/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(payload.decode()):
        for sample in family.samples:
            # Keyed by family: the parser itself appends `_total` to counter sample names.
            samples[(family.name, tuple(sorted(sample.labels.items())))] = sample.value
    mlp = (("model", "mlp"), ("version", "1"))
    assert samples[("nv_inference_request_success", mlp)] >= 3
    assert samples[("nv_inference_count", mlp)] >= 3
    assert samples[("nv_inference_exec_count", mlp)] >= 1
    assert samples[("nv_inference_request_duration_us", mlp)] > 0
    for name in (
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
    ):
        assert (name, mlp) in samples
    assert ("nv_inference_request_failure", (("model", "mlp"), ("reason", "REJECTED"), ("version", "1"))) in samples
    assert 0.0 <= samples[("nv_cpu_utilization", ())] <= 1.0
    assert samples[("nv_cpu_memory_used_bytes", ())] > 0
    # Triton's plain counter names, without the `_total` suffix Prometheus clients add by default.
    assert b"nv_inference_request_success_total" not in payload
