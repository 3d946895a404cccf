"""HTTP fuzzing: thousands of malformed requests, every answer a KServe error JSON with a client
status (never a 5xx but 501/503, never a crash), and the server serves normally afterwards.

The requests start from a valid one for a real model and take a few mutations each: broken or
truncated JSON, wrong, negative and huge shapes, datatype mismatches, binary sections whose sizes
lie, `Inference-Header-Content-Length` past the body, unknown parameters, non-UTF-8 names, and
model names that try to leave the repository (`..`, `%2e%2e`, `%2f`, absolute paths).
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, quote_from_bytes

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from reference_server.frontends.http.limits import HttpLimits
from reference_server.server import ReferenceServer
from tests.fuzz.wire import RawHttp, check_http_answer, fuzz_settings

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

# (model, input, datatype, dims after the batch dimension; -1 is free)
MODELS = [
    ("mlp", "INPUT0", "FP32", [256]),
    ("identity", "INPUT0", "FP32", [-1]),
    ("convnet", "INPUT0", "FP32", [1, 28, 28]),
    ("strings", "TEXT", "BYTES", [-1]),
]
PATH_TRICKS = [
    b"..", b"../mlp", b"%2e%2e", b"%2E%2E%2Fmlp", b"..%2fmlp", b"%2fetc%2fpasswd", b"/etc/passwd", b"%00",
    b"mlp%00", b"%ff%fe", b"%c0%ae%c0%ae", b".", b"%2e", b"mlp%2f..%2f..%2fmlp", b"%5c..%5cmlp", b"a" * 3000,
    b"%e2%80%ae", b"mlp/", b"~", b"C:%5cwindows", b"mlp;x", b".hidden", b"%252e%252e", b"mlp%20",
]  # fmt: skip
JUNK_DATATYPES = ["FP99", "", "fp32", "TYPE_FP32", "STRING", "BF16", "FP32 "]
HUGE = [2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63)]
INVALID_UTF8 = b"\xff\xfe\xc0\xae"

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
model_names = st.one_of(
    st.sampled_from([m[0].encode() for m in MODELS]),
    st.sampled_from(PATH_TRICKS),
    st.text(max_size=16).map(lambda t: quote(t, safe="").encode()),
    st.binary(max_size=10).map(lambda b: quote_from_bytes(b, safe="").encode()),
)
versions = st.one_of(
    st.none(), st.sampled_from([b"1", b"0", b"-1", b"2", b"99999999999999999999999", b"abc", b"%2e%2e", b"%ff"])
)
junk_dims = st.one_of(st.integers(-3, 300), st.sampled_from(HUGE), st.floats(), st.text(max_size=3), st.none())
junk_shapes = st.one_of(st.lists(junk_dims, max_size=5), json_values)


def _path(name: bytes, version: bytes | None, tail: bytes) -> bytes:
    path = b"/v2/models/" + name
    if version is not None:
        path += b"/versions/" + version
    return path + tail


@st.composite
def valid_tensor(draw: st.DrawFn) -> tuple[str, dict[str, Any], np.ndarray]:
    model, name, datatype, dims = draw(st.sampled_from(MODELS))
    batch = draw(st.sampled_from([1, 1, 2, 3]))
    shape = [batch] + [draw(st.integers(0, 6)) if d == -1 else d for d in dims]
    count = int(np.prod(shape))
    if datatype == "BYTES":
        values = np.array(draw(st.lists(st.text(max_size=6), min_size=count, max_size=count)), dtype=object)
    else:
        values = np.linspace(-1, 1, count, dtype=np.float32)
    return model, {"name": name, "datatype": datatype, "shape": shape}, values


def _raw(values: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in values.ravel())
    return values.astype("<f4").tobytes()


MUTATIONS = [
    "name", "datatype", "shape", "dim", "data", "param", "tensor_param", "outputs", "id", "drop", "duplicate",
    "size_lie", "header_lie", "truncate", "non_utf8", "timeout", "binary_output", "model", "version", "not_object",
]  # fmt: skip


@st.composite
def infer_requests(draw: st.DrawFn) -> tuple[bytes, bytes, dict[str, bytes]]:
    """(path, body, headers) of an infer request: a valid one, then 1 to 3 mutations."""
    model, tensor, values = draw(valid_tensor())
    binary = draw(st.booleans())
    mutations = set(draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)))
    name, version = model.encode(), None
    doc: dict[str, Any] = {"inputs": [tensor]}
    raw = b""
    if binary:
        raw = _raw(values, tensor["datatype"])
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = [str(v) for v in values.ravel()] if tensor["datatype"] == "BYTES" else values.tolist()
    if "name" in mutations:
        tensor["name"] = draw(st.one_of(st.text(max_size=8), json_values))
    if "datatype" in mutations:
        tensor["datatype"] = draw(
            st.one_of(st.sampled_from(JUNK_DATATYPES + ["INT32", "BOOL", "FP16", "BYTES"]), json_values)
        )
    if "shape" in mutations:
        tensor["shape"] = draw(junk_shapes)
    if "dim" in mutations and isinstance(tensor["shape"], list) and tensor["shape"]:
        i = draw(st.integers(0, len(tensor["shape"]) - 1))
        tensor["shape"][i] = draw(st.one_of(st.sampled_from([-1, 0, 65, 10**6]), st.sampled_from(HUGE)))
    if "data" in mutations:
        tensor.pop("parameters", None)
        binary = False
        tensor["data"] = draw(
            st.one_of(
                json_values,
                st.lists(st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.booleans()), max_size=40),
                st.just([[1.0, 2.0], [3.0]]),  # ragged
                st.just([1e39] * 256),  # out of FP32 range
            )
        )
    if "param" in mutations:
        doc["parameters"] = draw(st.dictionaries(st.text(max_size=12), json_values, max_size=3))
    if "tensor_param" in mutations:
        params = tensor.setdefault("parameters", {})
        if isinstance(params, dict):
            params[draw(st.sampled_from(["binary_data_size", "shared_memory_region", "x", "classification"]))] = draw(
                json_values
            )
    if "outputs" in mutations:
        doc["outputs"] = draw(
            st.one_of(
                json_values,
                st.lists(
                    st.fixed_dictionaries(
                        {"name": st.one_of(st.sampled_from(["OUTPUT0", "ECHO", "", "nope"]), json_values)},
                        optional={"parameters": st.one_of(json_values, st.just({"classification": 3}))},
                    ),
                    max_size=3,
                ),
            )
        )
    if "id" in mutations:
        doc["id"] = draw(json_values)
    if "drop" in mutations:
        target = draw(st.sampled_from([doc, tensor]))
        if target:
            target.pop(draw(st.sampled_from(sorted(target))), None)
    if "duplicate" in mutations and isinstance(doc.get("inputs"), list):
        doc["inputs"] = doc["inputs"] * 2
    if "timeout" in mutations:
        doc.setdefault("parameters", {})["timeout"] = draw(st.one_of(st.sampled_from([-1, 0, 2**64, "1"]), json_values))
    if "binary_output" in mutations:
        doc.setdefault("parameters", {})["binary_data_output"] = draw(json_values)
    if "model" in mutations:
        name = draw(model_names)
    if "version" in mutations:
        version = draw(versions)
    if "size_lie" in mutations and binary and isinstance(tensor.get("parameters"), dict):
        tensor["parameters"]["binary_data_size"] = draw(
            st.one_of(st.integers(-5, len(raw) + 5), st.sampled_from(HUGE), json_values)
        )
    header = json.dumps(doc).encode()
    if "not_object" in mutations:
        header = json.dumps(draw(json_values)).encode()
    if "non_utf8" in mutations:
        at = draw(st.integers(0, len(header)))
        header = header[:at] + INVALID_UTF8 + header[at:]
    body = header + raw if binary else header
    headers: dict[str, bytes] = {}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(header)).encode()
        headers["Content-Type"] = b"application/octet-stream"
    if "header_lie" in mutations:
        headers["Inference-Header-Content-Length"] = draw(
            st.one_of(
                st.integers(-5, len(body) + 100).map(lambda n: str(n).encode()),
                st.sampled_from([b"", b"abc", b"1e3", b"0x10", b"99999999999999999999999", b" 5", b"\xff"]),
            )
        )
    if "truncate" in mutations:
        body = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    return _path(name, version, b"/infer"), body, headers


@st.composite
def other_requests(draw: st.DrawFn) -> tuple[str, bytes, bytes, bool]:
    """(method, path, body, is-a-readiness-probe) for every route but infer, with hostile names and bodies."""
    name, version = draw(model_names), draw(versions)
    kind = draw(st.sampled_from(["metadata", "ready", "config", "stats", "load", "unload", "index", "method"]))
    body = draw(st.one_of(st.just(b""), st.binary(max_size=64), json_values.map(lambda v: json.dumps(v).encode())))
    if kind in ("load", "unload"):
        # Never a real model: a fuzzed unload would take it away from the tests that follow.
        trick = draw(st.sampled_from(PATH_TRICKS))
        if kind == "load" and draw(st.booleans()):
            params = {"config": draw(st.one_of(st.text(max_size=30), json_values.map(json.dumps)))}
            params.update(draw(st.dictionaries(st.sampled_from(["file:1/model.onnx", "x", "config"]), json_values)))
            body = json.dumps({"parameters": params}).encode()
        return "POST", b"/v2/repository/models/" + trick + b"/" + kind.encode(), body, False
    if kind == "index":
        return "POST", b"/v2/repository/index", body, False
    if kind == "method":
        return draw(st.sampled_from(["PUT", "DELETE", "PATCH"])), _path(name, version, b"/infer"), body, False
    tail = {"metadata": b"", "ready": b"/ready", "config": b"/config", "stats": b"/stats"}[kind]
    return "GET", _path(name, version, tail), b"", kind == "ready"


@pytest.fixture(scope="module")
def http(fuzz_server: ReferenceServer) -> Iterator[RawHttp]:
    assert fuzz_server.http_port is not None
    client = RawHttp(fuzz_server.http_port)
    yield client
    client.close()


@fuzz_settings(700)
@given(request=infer_requests())
def test_malformed_infer_requests_get_client_errors(
    http: RawHttp, crashes: list[logging.LogRecord], request: tuple[bytes, bytes, dict[str, bytes]]
) -> None:
    path, body, headers = request
    status, response_headers, payload = http.request("POST", path, body, headers)
    event(f"HTTP {status}")
    check_http_answer(status, response_headers, payload, infer=True, ready_probe=False)


@fuzz_settings(300)
@given(request=other_requests())
def test_malformed_requests_to_every_route_get_client_errors(
    http: RawHttp, crashes: list[logging.LogRecord], request: tuple[str, bytes, bytes, bool]
) -> None:
    method, path, body, ready_probe = request
    status, headers, payload = http.request(method, path, body)
    event(f"HTTP {status}")
    check_http_answer(status, headers, payload, infer=False, ready_probe=ready_probe)


#: The HTTP front end's head limits: the fuzz server runs with the defaults.
LIMITS = HttpLimits()
#: What RawHttp adds to every head, as the limits count it: 'Host' + '127.0.0.1' and
#: 'Content-Length' + '0', each with 4 bytes for ': ' and CRLF.
RAW_HTTP_LINES = [len("Host") + len("127.0.0.1"), len("Content-Length") + len("0")]


def near(limit: int) -> st.SearchStrategy[int]:
    return st.integers(limit - 48, limit + 8)


@st.composite
def request_heads(draw: st.DrawFn) -> tuple[bytes, dict[str, bytes], int]:
    """A GET to the ready probe whose target, lines and count fall far from or right at the head's
    limits; with the status the limits give it (414, 431, or 200)."""
    target_size = draw(st.one_of(st.integers(17, 200), near(LIMITS.max_request_line)))
    target = b"/v2/health/ready?" + b"q" * (target_size - 17)
    sizes = draw(st.lists(st.one_of(st.integers(6, 60), near(LIMITS.max_header_line)), max_size=6))
    sizes += [6] * draw(st.one_of(st.just(0), st.integers(LIMITS.max_headers - 12, LIMITS.max_headers)))
    headers = {f"x-{i:03}": b"v" * (size - 5) for i, size in enumerate(sizes)}  # a name is 5 bytes
    lines = sizes + RAW_HTTP_LINES
    if target_size > LIMITS.max_request_line:
        status = 414
    elif (
        len(lines) > LIMITS.max_headers
        or max(lines) > LIMITS.max_header_line
        or target_size + sum(size + 4 for size in lines) > LIMITS.max_head_bytes
    ):
        status = 431
    else:
        status = 200
    return target, headers, status


@fuzz_settings(200)
@given(head=request_heads())
def test_request_heads_at_the_limits_get_exactly_their_status(
    http: RawHttp, crashes: list[logging.LogRecord], head: tuple[bytes, dict[str, bytes], int]
) -> None:
    """A head one byte over a limit is refused (414 / 431 with the KServe error JSON and close), one
    at it is served, however the head is split into reads on its way."""
    target, headers, expected = head
    status, response_headers, payload = http.request("GET", target, b"", headers)
    event(f"HTTP {status}")
    assert status == expected, (status, payload[:200])
    if status != 200:
        assert response_headers["connection"] == "close"
        assert response_headers["content-type"] == "application/json" and json.loads(payload)["error"]


def test_no_path_leaves_the_repository(http: RawHttp, fuzz_server: ReferenceServer) -> None:
    """A valid model folder beside the repository cannot be reached by any spelling of its path."""
    outside = fuzz_server.config.model_repository.parent / "outside"
    assert (outside / "config.pbtxt").is_file()
    absolute = quote(str(outside), safe="").encode()
    tricks = [b"..%2foutside", b"%2e%2e%2foutside", b"%2E%2E%2Foutside", b"..%5coutside", absolute, b"%2e%2e"]
    tricks += [b"mlp%2f..%2f..%2foutside", b"%252e%252e%252foutside", b"..%2f..%2f" + absolute[3:]]
    infer = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1]}]}'
    for trick in tricks:
        for method, path, body in (
            ("GET", b"/v2/models/" + trick, b""),
            ("GET", b"/v2/models/" + trick + b"/config", b""),
            ("POST", b"/v2/models/" + trick + b"/infer", infer),
            ("POST", b"/v2/repository/models/" + trick + b"/load", b""),
        ):
            status, _, payload = http.request(method, path, body)
            assert status == 404, (trick, method, path, status, payload)
        # Unloading what is not loaded succeeds having done nothing, as on Triton: no folder is touched.
        status, _, payload = http.request("POST", b"/v2/repository/models/" + trick + b"/unload", b"")
        assert (status, payload) == (200, b""), (trick, status, payload)
        assert (outside / "config.pbtxt").is_file()
    index = json.loads(http.request("POST", b"/v2/repository/index", b"{}")[2])
    assert "outside" not in {entry["name"] for entry in index}


def test_the_server_still_serves_and_nothing_crashed(http: RawHttp, crashes: list[logging.LogRecord]) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}]})
    status, _, payload = http.request("POST", b"/v2/models/mlp/infer", body.encode())
    assert status == 200, payload
    assert json.loads(payload)["outputs"][0]["shape"] == [1, 10]
    assert http.request("GET", b"/v2/health/ready")[0] == 200
    assert [r.getMessage() for r in crashes] == []
