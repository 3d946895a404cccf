"""v2kit.codec: bytes in, objects out, and the reverse, checked against tritonclient's own encoders."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import serialize_byte_tensor

import v2kit
from v2kit import codec as v2
from v2kit import grpc_proto as v2_grpc
from v2kit.codec import CodecError, InferRequest, InferResponse, InferTensor, RequestedOutput

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
ALL = NUMERIC + ["BYTES"]
STRINGS = [b"", "h\u00e9llo \u2603".encode(), b"\x00\xff binary", b"plain"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    n = int(np.prod(shape))
    if datatype == "BYTES":
        arr = np.empty(n, dtype=object)
        arr[:] = [f"s{i}-\u00e9".encode() if i % 3 else b"" for i in range(n)]
        return arr.reshape(shape)
    dtype = v2.datatype_to_numpy(datatype)
    if datatype == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if dtype.kind == "f":
        return (np.arange(n, dtype=dtype) - 2.5).reshape(shape)
    info = np.iinfo(dtype)
    values = np.array([info.min, info.max] + list(range(n - 2)), dtype=dtype)
    return values[:n].reshape(shape)


def assert_tensor_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    assert a.dtype == b.dtype
    assert a.tolist() == b.tolist()


def request_of(*tensors: InferTensor, **kw) -> InferRequest:
    return InferRequest(model_name="m", inputs=list(tensors), **kw)


def http_body(doc: dict, *binary: bytes) -> tuple[bytes, int | None]:
    header = json.dumps(doc).encode()
    return (header + b"".join(binary), len(header)) if binary else (header, None)


# ---------------------------------------------------------------------------------------------
# Datatypes


def test_datatype_table_matches_tritonclient():
    from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

    assert list(v2.DATATYPES) == ALL
    for name in ALL:
        dtype = v2.datatype_to_numpy(name)
        assert dtype == np.dtype(triton_to_np_dtype(name))
        assert v2.numpy_to_datatype(dtype) == name == np_to_triton_dtype(dtype)
    assert v2.numpy_to_datatype(np.dtype("S3")) == "BYTES"
    assert v2.numpy_to_datatype(">f4") == "FP32"


def test_datatype_errors_list_valid_names():
    with pytest.raises(CodecError, match=r"unknown datatype 'FLOAT32'.*BOOL, UINT8.*BYTES"):
        v2.datatype_to_numpy("FLOAT32")
    with pytest.raises(CodecError, match="no v2 datatype"):
        v2.numpy_to_datatype(np.complex64)


def test_config_types_cover_model_config_enum():
    for enum_name, _ in model_config_pb2.DataType.items():
        if enum_name in ("TYPE_INVALID", "TYPE_BF16"):
            with pytest.raises(CodecError, match="unknown model config data type"):
                v2.config_type_to_datatype(enum_name)
            continue
        datatype = v2.config_type_to_datatype(enum_name)
        assert datatype in v2.DATATYPES
        assert v2.datatype_to_config_type(datatype) == enum_name
    assert v2.config_type_to_datatype("TYPE_STRING") == "BYTES"
    with pytest.raises(CodecError):
        v2.config_type_to_datatype("TYPE_BYTES")


# ---------------------------------------------------------------------------------------------
# BYTES and raw tensors


def test_bytes_serialization_matches_tritonclient():
    arr = np.array(STRINGS + ["str \u00fc"], dtype=object)
    ours = v2.serialize_bytes_tensor(arr)
    assert ours == serialize_byte_tensor(arr).item()
    back = v2.deserialize_bytes_tensor(ours, count=5)
    assert back.tolist() == STRINGS + ["str \u00fc".encode()]
    assert v2.serialize_bytes_tensor(np.empty((0, 2), dtype=object)) == b""
    assert v2.deserialize_bytes_tensor(b"").shape == (0,)


@pytest.mark.parametrize(
    ("buf", "count", "fragment"),
    [
        (b"\x05\x00\x00\x00abc", None, "declares 5 bytes, 3 remain"),
        (b"\x01\x00\x00\x00a\x02\x00", None, "where a 4-byte length belongs"),
        (b"\x01\x00\x00\x00a", 2, "cannot hold 2 BYTES elements"),
        (b"\x00\x00\x00\x00\x00\x00\x00\x00", 1, "expected 1 BYTES elements, got 2"),
    ],
)
def test_bytes_deserialization_errors(buf, count, fragment):
    with pytest.raises(CodecError, match=fragment):
        v2.deserialize_bytes_tensor(buf, count)


def test_serialize_rejects_non_bytes_elements():
    with pytest.raises(CodecError, match="bytes or str, got int"):
        v2.serialize_bytes_tensor(np.array([1, 2]))


@pytest.mark.parametrize("datatype", ALL)
def test_raw_round_trip(datatype):
    arr = sample(datatype)
    raw = v2.tensor_to_raw(arr, datatype)
    if datatype != "BYTES":
        assert raw == arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    back = v2.tensor_from_raw(raw, datatype, [2, 3], "x")
    assert_tensor_equal(back, arr)


def test_raw_is_zero_copy_and_read_only():
    buf = np.arange(6, dtype=np.float32).tobytes()
    arr = v2.tensor_from_raw(buf, "FP32", [2, 3], "x")
    assert not arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(buf, dtype=np.uint8))


def test_raw_encoding_is_little_endian_row_major():
    arr = np.arange(6, dtype=">i4").reshape(2, 3).T  # big-endian and not C-contiguous
    raw = v2.tensor_to_raw(arr, "INT32")
    assert raw == np.ascontiguousarray(arr).astype("<i4").tobytes()
    assert v2.tensor_to_raw(np.array([1, 2], dtype=np.float64), "FP32") == np.array([1, 2], "<f4").tobytes()
    with pytest.raises(CodecError, match="cannot send a float64 array as INT32"):
        v2.tensor_to_raw(np.array([1.5]), "INT32")


def test_raw_size_message():
    with pytest.raises(CodecError, match=r"input 'X': expected 24 bytes for shape \[2, 3\] FP32, got 20"):
        v2.tensor_from_raw(b"\x00" * 20, "FP32", [2, 3], "X")


def test_raw_scalar_and_empty_shapes():
    assert v2.tensor_from_raw(np.float64(2.5).tobytes(), "FP64", [], "s").shape == ()
    assert v2.tensor_from_raw(b"", "INT8", [0, 4], "e").shape == (0, 4)
    assert v2.tensor_from_raw(b"", "BYTES", [3, 0], "e").shape == (3, 0)


def test_raw_bool_bytes_must_be_0_or_1():
    with pytest.raises(CodecError, match="BOOL bytes must be 0 or 1"):
        v2.tensor_from_raw(b"\x00\x02", "BOOL", [2], "b")


# ---------------------------------------------------------------------------------------------
# JSON tensors


@pytest.mark.parametrize("datatype", [d for d in ALL if d != "FP16"])
def test_json_round_trip(datatype):
    arr = sample(datatype)
    data = v2.tensor_to_json(arr, datatype)
    assert data == json.loads(json.dumps(data))
    nested = np.array(data, dtype=object).reshape(2, 3).tolist()
    for payload in (data, nested):
        assert_tensor_equal(v2.tensor_from_json(payload, datatype, [2, 3], "x"), arr)


def test_json_fp16_is_refused_both_ways():
    with pytest.raises(CodecError, match="FP16 cannot be sent as JSON; use binary"):
        v2.tensor_from_json([1.0], "FP16", [1], "h")
    with pytest.raises(CodecError, match="FP16 cannot be sent as JSON"):
        v2.tensor_to_json(np.zeros(1, np.float16), "FP16", name="h", kind="input")
    with pytest.raises(CodecError, match="^sending FP16 data via JSON is not supported. Please use the binary"):
        v2.tensor_to_json(np.zeros(1, np.float16), "FP16", name="h")


def test_json_bytes_not_utf8_suggests_binary():
    with pytest.raises(CodecError, match=r"element 0 is not valid UTF-8.*binary_data: true"):
        v2.tensor_to_json(np.array([b"\xff"], dtype=object), "BYTES", name="o")


@pytest.mark.parametrize(
    ("data", "datatype", "shape", "fragment"),
    [
        (["1.5"], "FP32", [1], "FP32 data must be JSON numbers, got strings"),
        ([1.5], "INT32", [1], "must be JSON integers, got non-integer numbers"),
        ([1, 0], "BOOL", [2], "BOOL data must be JSON booleans, got integers"),
        ([True], "INT8", [1], "must be JSON integers, got booleans"),
        ([300], "UINT8", [1], "value 300 is out of range for UINT8"),
        ([-1], "UINT64", [1], "value -1 is out of range for UINT64"),
        ([2**70], "INT64", [1], "value 1180591620717411303424 is out of range for INT64"),
        ([-1, 2**64 - 1], "INT64", [2], "value 18446744073709551615 is out of range for INT64"),
        ([1, {}], "INT64", [2], "got mixed or out-of-range values"),
        ([1e300], "FP32", [1], "out of range for FP32"),
        ([[1, 2], [3]], "INT32", [3], "ragged"),
        ([["a", "b"], ["c"]], "BYTES", [3], "ragged"),
        ([1, None], "FP64", [2], "mixed"),
        (["a", 1], "BYTES", [2], "BYTES data must hold JSON strings, got a number"),
        (["\ud800"], "BYTES", [1], "not valid Unicode"),
        ({"a": 1}, "INT32", [1], "'data' must be a JSON array, got a object"),
        ([1, 2, 3], "INT32", [2, 2], r"shape \[2, 2\] needs 4 elements but data has 3"),
        ([], "INT32", [1], "needs 1 elements but data has 0"),
    ],
)
def test_json_bad_values(data, datatype, shape, fragment):
    with pytest.raises(CodecError, match=fragment) as info:
        v2.tensor_from_json(data, datatype, shape, "in0")
    assert "input 'in0'" in str(info.value)


def test_json_empty_tensor():
    assert v2.tensor_from_json([], "INT32", [0], "e").dtype == np.int32
    assert v2.tensor_from_json([[], []], "FP32", [2, 0], "e").shape == (2, 0)


# ---------------------------------------------------------------------------------------------
# HTTP: against tritonclient


def triton_inputs(binary: bool) -> list[httpclient.InferInput]:
    inputs = []
    for name, datatype, arr in [
        ("f", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
        ("s", "BYTES", np.array([[b"", "\u00e9t\u00e9".encode()]], dtype=object)),
        ("b", "BOOL", np.array([True, False, True])),
        ("i", "INT64", np.array([[-(2**62)], [7]], dtype=np.int64)),
    ]:
        inp = httpclient.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
    return inputs


@pytest.mark.parametrize("binary", [True, False])
def test_decodes_tritonclient_request(binary):
    inputs = triton_inputs(binary)
    outputs = [
        httpclient.InferRequestedOutput("o1", binary_data=False, class_count=3),
        httpclient.InferRequestedOutput("o2"),
    ]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="r1", priority=2, parameters={"custom": "x"}
    )
    req = v2.decode_infer_request(body, header_length, "m", "1")
    assert (req.model_name, req.model_version, req.id) == ("m", "1", "r1")
    assert req.parameters == {"priority": 2, "custom": "x"}
    assert [(t.name, t.datatype, t.shape) for t in req.inputs] == [(i.name(), i.datatype(), i.shape()) for i in inputs]
    assert all(t.parameters == {} for t in req.inputs)
    assert req.outputs == [RequestedOutput("o1", False, {"classification": 3}), RequestedOutput("o2", True)]
    assert req.inputs[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert req.inputs[1].data.tolist() == [[b"", "\u00e9t\u00e9".encode()]]
    assert req.inputs[2].data.dtype == np.bool_
    assert req.inputs[3].data.tolist() == [[-(2**62)], [7]]


def test_request_bytes_identical_to_tritonclient():
    inputs = triton_inputs(True)
    outputs = [httpclient.InferRequestedOutput("o1", class_count=2), httpclient.InferRequestedOutput("o2", False)]
    theirs, their_len = httpclient.InferenceServerClient.generate_request_body(inputs, outputs, request_id="7")
    req = v2.decode_infer_request(theirs, their_len, "m")
    req.outputs = [RequestedOutput("o1", None, {"classification": 2}), RequestedOutput("o2", False)]
    ours, our_len = v2.encode_infer_request(req)
    assert (ours, our_len) == (theirs, their_len)

    theirs, their_len = httpclient.InferenceServerClient.generate_request_body(inputs)
    ours, our_len = v2.encode_infer_request(v2.decode_infer_request(theirs, their_len, "m"))
    assert (ours, our_len) == (theirs, their_len)  # no outputs named: binary_data_output true


def make_response() -> InferResponse:
    return InferResponse(
        "m",
        "3",
        "r9",
        [
            InferTensor(name, dt, list(sample(dt).shape), sample(dt))
            for name, dt in [("fp32", "FP32"), ("str", "BYTES"), ("fp16", "FP16"), ("u8", "UINT8"), ("flag", "BOOL")]
        ],
    )


def test_tritonclient_parses_our_response():
    resp = make_response()
    request = request_of(
        InferTensor("x", "INT32", [1], np.zeros(1, np.int32)),
        outputs=[
            RequestedOutput("fp32", False),
            RequestedOutput("str"),
            RequestedOutput("fp16", True),
            RequestedOutput("u8", None),
            RequestedOutput("flag", False),
        ],
        parameters={"binary_data_output": True},
    )
    body, header_length = v2.encode_infer_response(resp, request)
    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)
    for t in resp.outputs:
        assert_tensor_equal(result.as_numpy(t.name), t.data)
    raw = result.get_response()
    assert raw["model_name"] == "m" and raw["model_version"] == "3" and raw["id"] == "r9"
    assert {o["name"] for o in raw["outputs"] if "data" in o} == {"fp32", "flag"}
    binary = {o["name"] for o in raw["outputs"] if "binary_data_size" in o.get("parameters", {})}
    assert binary == {"str", "fp16", "u8"}
    back = v2.decode_infer_response(body, header_length)
    assert [t.name for t in back.outputs] == [t.name for t in resp.outputs]
    for a, b in zip(back.outputs, resp.outputs):
        assert_tensor_equal(a.data, b.data)
        assert a.parameters == {}


def test_response_all_json_has_no_header_length():
    resp = InferResponse("m", "1", outputs=[InferTensor("o", "INT32", [2], np.array([1, 2], np.int32))])
    body, header_length = v2.encode_infer_response(resp, request_of())
    assert header_length is None
    assert json.loads(body) == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "o", "datatype": "INT32", "shape": [2], "data": [1, 2]}],
    }
    assert b" " not in body
    assert httpclient.InferenceServerClient.parse_response_body(body).as_numpy("o").tolist() == [1, 2]


def test_response_inconsistent_shape_is_an_error():
    resp = InferResponse("m", "1", outputs=[InferTensor("o", "INT32", [3], np.array([1, 2], np.int32))])
    with pytest.raises(CodecError, match=r"output 'o': shape \[3\] needs 3 elements but data has 2"):
        v2.encode_infer_response(resp, request_of())


@pytest.mark.parametrize("binary_inputs", [True, False])
@pytest.mark.parametrize("datatype", ALL)
def test_our_request_round_trip(datatype, binary_inputs):
    if datatype == "FP16" and not binary_inputs:
        with pytest.raises(CodecError, match="FP16"):
            v2.encode_infer_request(request_of(InferTensor("x", "FP16", [2, 3], sample("FP16"))), False)
        return
    arr = sample(datatype)  # its BYTES are valid UTF-8, so JSON can carry them
    req = request_of(InferTensor("x", datatype, [2, 3], arr, {"p": 1}), id="id1", parameters={"k": True})
    body, header_length = v2.encode_infer_request(req, binary_inputs=binary_inputs, binary_outputs=False)
    assert (header_length is not None) == binary_inputs
    back = v2.decode_infer_request(body, header_length, "m")
    assert_tensor_equal(back.inputs[0].data, arr)
    assert back.inputs[0].parameters == {"p": 1}
    assert (back.id, back.parameters, back.outputs) == ("id1", {"k": True}, None)


def test_response_round_trip_via_decoder():
    resp = make_response()
    req = request_of(InferTensor("x", "INT32", [1], np.zeros(1, np.int32)), parameters={"binary_data_output": True})
    back = v2.decode_infer_response(*v2.encode_infer_response(resp, req))
    assert (back.model_name, back.model_version, back.id) == ("m", "3", "r9")
    for a, b in zip(back.outputs, resp.outputs, strict=True):
        assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
        assert_tensor_equal(a.data, b.data)


def test_decode_response_error_body():
    with pytest.raises(CodecError, match="server error: boom"):
        v2.decode_infer_response(v2.error_body("boom"), None)


def test_error_body_and_decode_error():
    assert json.loads(v2.error_body("bad 'x'")) == {"error": "bad 'x'"}
    assert v2.decode_error(v2.error_body("nope \u00e9")) == "nope \u00e9"
    assert v2.decode_error(b"  upstream timeout\n") == "upstream timeout"
    assert v2.decode_error(b'{"message": "x"}') == '{"message": "x"}'
    assert v2.decode_error(b"\xff") == "\ufffd"


def test_raw_binary_request():
    body = np.arange(8, dtype=np.float32).tobytes()
    req = v2.decode_raw_binary_request(body, "m", "", "in", "FP32", [-1, 4])
    assert req.inputs[0].shape == [2, 4] and req.inputs[0].data.shape == (2, 4)
    assert req.parameters == {"binary_data_output": True} and req.outputs is None
    req = v2.decode_raw_binary_request(b"\x00raw", "m", "", "in", "BYTES", [1])
    assert req.inputs[0].data.tolist() == [b"\x00raw"]
    with pytest.raises(CodecError, match="not a whole number"):
        v2.decode_raw_binary_request(body[:-4], "m", "", "in", "FP32", [-1, 4])
    with pytest.raises(CodecError, match="allows one variable dimension"):
        v2.decode_raw_binary_request(body, "m", "", "in", "FP32", [-1, -1])
    with pytest.raises(CodecError, match=r"BYTES shape \[1\]"):
        v2.decode_raw_binary_request(body, "m", "", "in", "BYTES", [2])
    with pytest.raises(CodecError, match="expected 16 bytes"):
        v2.decode_raw_binary_request(body, "m", "", "in", "FP32", [4])
    with pytest.raises(CodecError, match="decode_raw_binary_request"):
        v2.decode_infer_request(body, 0, "m")


def test_binary_inputs_are_views_of_the_body():
    body, header_length = v2.encode_infer_request(request_of(InferTensor("x", "FP64", [3], np.ones(3))))
    arr = v2.decode_infer_request(body, header_length, "m").inputs[0].data
    assert np.shares_memory(arr, np.frombuffer(body, dtype=np.uint8)) and not arr.flags.writeable


def test_encode_request_output_flags():
    req = request_of(InferTensor("x", "INT8", [1], np.ones(1, np.int8)))
    assert b"binary_data_output" not in v2.encode_infer_request(req, binary_outputs=False)[0]
    req.outputs = [RequestedOutput("a"), RequestedOutput("b", True, {"classification": 1})]
    doc = json.loads(v2.encode_infer_request(req, binary_inputs=False, binary_outputs=False)[0])
    assert doc["outputs"] == [
        {"name": "a", "parameters": {"binary_data": False}},
        {"name": "b", "parameters": {"classification": 1, "binary_data": True}},
    ]
    assert "parameters" not in doc and doc["inputs"][0]["data"] == [1]


def test_header_length_as_header_string():
    body, header_length = v2.encode_infer_request(request_of(InferTensor("x", "INT8", [1], np.ones(1, np.int8))))
    assert v2.decode_infer_request(body, str(header_length), "m").inputs[0].data.tolist() == [1]


# ---------------------------------------------------------------------------------------------
# HTTP: malformed requests

F32 = {"name": "a", "shape": [2], "datatype": "FP32"}
B8 = np.arange(2, dtype=np.float32).tobytes()


def with_(**kw) -> dict:
    return {**F32, **kw}


MALFORMED = [
    ("header past body", (b'{"inputs":[]}', 99), "Inference-Header-Content-Length 99 is outside the 13-byte body"),
    ("negative header", (b"{}", -1), "outside the 2-byte body"),
    ("header not int", (b"{}", "abc"), "must be an integer"),
    (
        "sizes short",
        http_body({"inputs": [with_(parameters={"binary_data_size": 8})]}, B8[:4]),
        r"input 'a': 8\) add up to 8 bytes but 4 bytes follow",
    ),
    (
        "sizes long",
        http_body({"inputs": [with_(parameters={"binary_data_size": 4})]}, B8),
        "add up to 4 bytes but 8 bytes follow",
    ),
    (
        "binary without header",
        (json.dumps({"inputs": [with_(parameters={"binary_data_size": 8})]}).encode(), None),
        "no binary part",
    ),
    (
        "wrong tensor size",
        http_body({"inputs": [with_(parameters={"binary_data_size": 4})]}, B8[:4]),
        r"input byte size mismatch for input 'a' for model '\w+'. Expected 8, got 4",
    ),
    ("missing data", http_body({"inputs": [F32]}), "input 'a': has neither 'data' nor parameters.binary_data_size"),
    (
        "shared memory without size",
        http_body({"inputs": [with_(parameters={"shared_memory_region": "r"})]}),
        "input 'a': shared_memory_region 'r' needs shared_memory_byte_size",
    ),
    (
        "data and binary",
        http_body({"inputs": [with_(data=[1, 2], parameters={"binary_data_size": 8})]}, B8),
        "has both 'data' and parameters.binary_data_size",
    ),
    ("bad binary size", http_body({"inputs": [with_(parameters={"binary_data_size": -8})]}), "must be an integer >= 0"),
    ("negative dim", http_body({"inputs": [with_(shape=[-1, 2], data=[1, 2])]}), "negative dimension -1"),
    ("shape not list", http_body({"inputs": [with_(shape="2", data=[1, 2])]}), "shape must be a list"),
    ("shape float", http_body({"inputs": [with_(shape=[2.0], data=[1, 2])]}), "shape must be a list"),
    ("missing shape", http_body({"inputs": [{"name": "a", "datatype": "FP32", "data": [1]}]}), "missing 'shape'"),
    ("count mismatch", http_body({"inputs": [with_(data=[1, 2, 3])]}), "needs 2 elements but data has 3"),
    (
        "unknown datatype",
        http_body({"inputs": [with_(datatype="FLOAT", data=[1, 2])]}),
        "input 'a': unknown datatype 'FLOAT'; expected one of BOOL",
    ),
    ("non-object json", http_body([1, 2]), "must be an object, got a array"),
    ("truncated json", (b'{"inputs": [', None), "failed to parse the request JSON buffer"),
    ("empty body", (b"", None), "failed to parse the request JSON buffer"),
    ("non-utf8", (b'{"id": "\xff"}', None), "not valid UTF-8"),
    ("utf8 header cut", ('{"id":"\u00e9"}'.encode(), 8), "not valid UTF-8"),
    (
        "truncated BYTES",
        http_body(
            {"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]},
            b"\x05\x00\x00\x00ab",
        ),
        "input 's': truncated BYTES element 0",
    ),
    (
        "huge shape",
        http_body({"inputs": [with_(shape=[2**40, 2**40], parameters={"binary_data_size": 8})]}, B8),
        "Expected 4835703278458516698824704, got",
    ),
    (
        "huge BYTES shape",
        http_body(
            {"inputs": [{"name": "s", "shape": [2**62], "datatype": "BYTES", "parameters": {"binary_data_size": 4}}]},
            b"\0\0\0\0",
        ),
        "cannot hold",
    ),
    ("huge JSON shape", http_body({"inputs": [with_(shape=[2**62, 4], data=[1])]}), "needs 18446744073709551616"),
    ("dim past int64", http_body({"inputs": [with_(shape=[2**64], data=[1])]}), "exceeds int64"),
    ("too many dims", http_body({"inputs": [with_(shape=[1] * 70, data=[1])]}), "cannot build a tensor"),
    ("duplicate input", http_body({"inputs": [with_(data=[1, 2]), with_(data=[1, 2])]}), "duplicate input name 'a'"),
    ("fp16 json", http_body({"inputs": [with_(datatype="FP16", data=[1, 2])]}), "FP16 cannot be sent as JSON"),
    ("no inputs key", http_body({"id": "x"}), "no 'inputs'"),
    ("inputs not list", http_body({"inputs": {}}), "'inputs' must be a JSON array"),
    ("input not object", http_body({"inputs": [3]}), r"inputs\[0\] must be a JSON object"),
    (
        "input no name",
        http_body({"inputs": [{"shape": [1]}]}),
        r"inputs\[0\] must be a JSON object with a non-empty string 'name'",
    ),
    ("id not string", http_body({"id": 5, "inputs": [with_(data=[1, 2])]}), "'id' must be a string"),
    ("params not object", http_body({"parameters": [], "inputs": [with_(data=[1, 2])]}), "'parameters' must be"),
    (
        "binary_data_output",
        http_body({"parameters": {"binary_data_output": 1}, "inputs": [with_(data=[1, 2])]}),
        "binary_data_output must be true or false",
    ),
    ("input params", http_body({"inputs": [with_(data=[1, 2], parameters=3)]}), "input 'a': 'parameters' must be"),
    ("outputs not list", http_body({"inputs": [with_(data=[1, 2])], "outputs": {}}), "'outputs' must be"),
    ("output no name", http_body({"inputs": [with_(data=[1, 2])], "outputs": [{}]}), r"outputs\[0\]"),
    (
        "output binary",
        http_body({"inputs": [with_(data=[1, 2])], "outputs": [{"name": "o", "parameters": {"binary_data": "yes"}}]}),
        "binary_data must be true or false",
    ),
    (
        "classification",
        http_body({"inputs": [with_(data=[1, 2])], "outputs": [{"name": "o", "parameters": {"classification": -1}}]}),
        "classification must be",
    ),
    (
        "duplicate output",
        http_body({"inputs": [with_(data=[1, 2])], "outputs": [{"name": "o"}, {"name": "o"}]}),
        "duplicate requested output name 'o'",
    ),
    (
        "deep nesting",
        (b'{"inputs":' + b"[" * 100000 + b"]" * 100000 + b"}", None),
        "failed to parse the request JSON buffer",
    ),
    (
        "huge int literal",
        (b'{"inputs":[{"name":"a","shape":[' + b"9" * 5000 + b'],"datatype":"FP32"}]}', None),
        "failed to parse the request JSON buffer",
    ),
    ("ragged", http_body({"inputs": [with_(data=[[1], [2, 3]])]}), "ragged"),
]


@pytest.mark.parametrize(("body", "fragment"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_request(body, fragment):
    with pytest.raises(CodecError, match=fragment):
        v2.decode_infer_request(body[0], body[1], "m")


def test_request_outputs_and_parameters_kept():
    body, header_length = http_body(
        {
            "id": "q",
            "parameters": {"binary_data_output": True, "priority": 1},
            "inputs": [with_(data=[[1.5], [2]], parameters={"x": "y"})],
            "outputs": [{"name": "o1"}, {"name": "o2", "parameters": {"binary_data": False, "classification": 2}}],
        }
    )
    req = v2.decode_infer_request(body, header_length, "m", "2")
    assert req.parameters == {"binary_data_output": True, "priority": 1}
    assert req.inputs[0] == InferTensor("a", "FP32", [2], req.inputs[0].data, {"x": "y"})
    assert req.inputs[0].data.tolist() == [1.5, 2.0]
    assert req.outputs == [RequestedOutput("o1", None, {}), RequestedOutput("o2", False, {"classification": 2})]
    assert v2.decode_infer_request(*http_body({"inputs": [with_(data=[1, 2])], "outputs": []}), "m").outputs is None


def test_random_corruption_only_raises_codec_error():
    inputs = triton_inputs(True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, [httpclient.InferRequestedOutput("o")], request_id="abc"
    )
    rng = random.Random(1234)
    for _ in range(1500):
        mutated = bytearray(body)
        op = rng.randrange(3)
        if op == 0:
            del mutated[rng.randrange(len(mutated)) :]
        elif op == 1:
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        else:
            pos = rng.randrange(len(mutated))
            mutated[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        hl = rng.choice([header_length, None, rng.randrange(len(mutated) + 2)])
        try:
            v2.decode_infer_request(bytes(mutated), hl, "m")
        except CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# gRPC


def test_proto_request_round_trip_all_datatypes():
    tensors = [InferTensor(f"in_{d}", d, [2, 3], sample(d), {"n": 1}) for d in ALL]
    req = InferRequest(
        "m",
        "2",
        "id",
        tensors,
        [RequestedOutput("o", None, {"classification": 2})],
        {"s": "x", "b": True, "i": -5, "u": 2**63 + 1, "f": 0.5},
    )
    pb = service_pb2.ModelInferRequest.FromString(v2_grpc.request_to_proto(req).SerializeToString())
    assert len(pb.raw_input_contents) == len(ALL)
    assert pb.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
    back = v2_grpc.request_from_proto(pb)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "2", "id", req.parameters)
    assert back.outputs == [RequestedOutput("o", None, {"classification": 2})]
    for a, b in zip(back.inputs, tensors, strict=True):
        assert (a.name, a.datatype, a.shape, a.parameters) == (b.name, b.datatype, b.shape, {"n": 1})
        assert_tensor_equal(a.data, b.data)


def test_proto_response_round_trip():
    resp = make_response()
    resp.parameters = {"triton_final_response": True}
    pb = service_pb2.ModelInferResponse.FromString(v2_grpc.response_to_proto(resp).SerializeToString())
    back = v2_grpc.response_from_proto(pb)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "3", "r9", resp.parameters)
    for a, b in zip(back.outputs, resp.outputs, strict=True):
        assert_tensor_equal(a.data, b.data)


def test_proto_decodes_tritonclient_grpc_request():
    arr = np.arange(4, dtype=np.float16).reshape(2, 2)
    inp = grpcclient.InferInput("h", [2, 2], "FP16")
    inp.set_data_from_numpy(arr)
    s = grpcclient.InferInput("s", [1], "BYTES")
    s.set_data_from_numpy(np.array(["\u00e9"], dtype=object))
    pb = grpc_utils._get_inference_request(
        "m", [inp, s], "", "r", [grpcclient.InferRequestedOutput("o")], 0, False, False, 3, None, None
    )
    req = v2_grpc.request_from_proto(pb)
    assert_tensor_equal(req.inputs[0].data, arr)
    assert req.inputs[1].data.tolist() == ["\u00e9".encode()]
    assert req.parameters == {"priority": 3}
    assert [o.name for o in req.outputs] == ["o"]


TYPED = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@pytest.mark.parametrize("datatype", list(TYPED))
def test_proto_typed_contents(datatype):
    arr = sample(datatype)
    pb = service_pb2.ModelInferRequest(model_name="m")
    t = pb.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    getattr(t.contents, TYPED[datatype]).extend(arr.ravel().tolist())
    assert_tensor_equal(v2_grpc.request_from_proto(pb).inputs[0].data, arr)


def typed_request(datatype: str, field: str, values: list, shape: list[int]) -> service_pb2.ModelInferRequest:
    pb = service_pb2.ModelInferRequest(model_name="m")
    getattr(pb.inputs.add(name="x", datatype=datatype, shape=shape).contents, field).extend(values)
    return pb


@pytest.mark.parametrize(
    ("pb", "fragment"),
    [
        (typed_request("FP32", "int_contents", [1, 2], [2]), "datatype FP32 takes fp32_contents, got int_contents"),
        (typed_request("FP32", "fp32_contents", [1, 2], [3]), r"shape \[3\] needs 3 elements, fp32_contents has 2"),
        (typed_request("FP16", "fp32_contents", [1], [1]), "FP16 data must be sent in raw_input_contents"),
        (typed_request("UINT8", "uint_contents", [256], [1]), "value 256 is out of range for UINT8"),
        (typed_request("INT32", "int_contents", [], [1]), "needs 1 elements, int_contents has 0"),
        (typed_request("INT32", "int_contents", [1], [-1]), "negative dimension"),
        (typed_request("FLOAT", "int_contents", [1], [1]), "unknown datatype 'FLOAT'"),
    ],
)
def test_proto_errors(pb, fragment):
    with pytest.raises(CodecError, match=fragment):
        v2_grpc.request_from_proto(pb)


def test_no_inputs_is_left_to_the_server_which_knows_how_many_the_model_wants():
    assert v2_grpc.request_from_proto(service_pb2.ModelInferRequest(model_name="m")).inputs == []
    assert v2.decode_infer_request(b'{"inputs": []}', None, "m").inputs == []


def test_proto_raw_errors():
    pb = typed_request("FP32", "fp32_contents", [1.0], [1])
    pb.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(
        CodecError, match="contents field must not be specified when using raw_input_contents for 'x' for model 'm'"
    ):
        v2_grpc.request_from_proto(pb)
    pb = v2_grpc.request_to_proto(
        request_of(
            InferTensor("a", "INT8", [1], np.ones(1, np.int8)), InferTensor("b", "INT8", [1], np.ones(1, np.int8))
        )
    )
    del pb.raw_input_contents[1]
    with pytest.raises(CodecError, match="raw_input_contents has 1 entries for 2 inputs"):
        v2_grpc.request_from_proto(pb)
    pb.raw_input_contents.append(b"\1\1")
    with pytest.raises(CodecError, match=r"input byte size mismatch for input 'b' for model '\w+'. Expected 1, got 2"):
        v2_grpc.request_from_proto(pb)
    pb.inputs[1].name = "a"
    with pytest.raises(CodecError, match="duplicate input name"):
        v2_grpc.request_from_proto(pb)


def test_parameters_proto_helpers():
    params = {"b": False, "i": -(2**63), "u": 2**64 - 1, "s": "", "d": 1e-3, "np": np.int32(4)}
    pb = service_pb2.ModelInferRequest()
    v2_grpc.parameters_to_proto(params, pb.parameters)
    assert v2_grpc.parameters_from_proto(pb.parameters) == {**params, "np": 4}
    assert isinstance(v2_grpc.parameters_from_proto(pb.parameters)["b"], bool)
    for bad in ({"x": None}, {"x": 2**64}, {"x": [1]}):
        with pytest.raises(CodecError, match="parameter 'x'"):
            v2_grpc.parameters_to_proto(bad, pb.parameters)


def test_message_to_json_writes_64_bit_integers_as_numbers():
    stats = service_pb2.ModelStatisticsResponse()
    model = stats.model_stats.add(name="m", version="1", inference_count=2**63 + 1)
    model.inference_stats.success.ns = 7
    model.batch_stats.add(batch_size=4).compute_infer.count = 3
    doc = v2_grpc.message_to_json(stats)
    entry = doc["model_stats"][0]
    assert entry["inference_count"] == 2**63 + 1 and entry["execution_count"] == 0  # defaults printed
    assert entry["inference_stats"]["success"] == {"count": 0, "ns": 7}
    assert entry["batch_stats"][0]["batch_size"] == 4 and entry["batch_stats"][0]["compute_infer"]["count"] == 3
    metadata = service_pb2.ModelMetadataResponse(name="m")
    metadata.inputs.add(name="x", datatype="FP32", shape=[-1, 3])
    assert v2_grpc.message_to_json(metadata)["inputs"][0]["shape"] == [-1, 3]


def test_the_codec_modules_use_only_public_names_of_each_other():
    private = []
    for path in Path(v2kit.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("v2kit"):
                private += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


def _binary_request(values: np.ndarray) -> tuple[bytes, int | None]:
    request = InferRequest(
        "m", inputs=[InferTensor("IN", "FP32", list(values.shape), values)], outputs=[RequestedOutput("OUT", True)]
    )
    return v2.encode_infer_request(request)


def test_a_header_seen_before_decodes_each_body_afresh():
    # The second body has the same JSON header, so its parse is reused: its data, and objects of its own.
    first_body, length = _binary_request(np.arange(4, dtype=np.float32).reshape(1, 4))
    second_body, second_length = _binary_request(np.full((1, 4), 7, dtype=np.float32))
    assert first_body[:length] == second_body[:second_length]
    first = v2.decode_infer_request(first_body, length, "m")
    first.parameters["changed"] = True
    first.inputs[0].parameters["changed"] = True
    first.inputs[0].shape.append(9)
    assert first.outputs is not None
    first.outputs[0].parameters["changed"] = True
    second = v2.decode_infer_request(second_body, second_length, "m")
    assert second.inputs[0].data.tolist() == [[7, 7, 7, 7]]
    assert first.inputs[0].data.tolist() == [[0, 1, 2, 3]]
    assert second.inputs[0].shape == [1, 4] and second.inputs[0].parameters == {}
    assert second.parameters == {} and second.outputs is not None and second.outputs[0].parameters == {}
    assert second.outputs[0].binary is True


def test_a_header_seen_before_still_checks_the_binary_size():
    body, length = _binary_request(np.zeros((1, 4), dtype=np.float32))
    v2.decode_infer_request(body, length, "m")
    with pytest.raises(CodecError, match="expecting 4 additional bytes"):
        v2.decode_infer_request(body[:-4], length, "m")
    with pytest.raises(CodecError, match="unexpected additional input data"):
        v2.decode_infer_request(body + b"1234", length, "m")


def test_parsed_headers_are_bounded():
    for i in range(v2._PARSED_MAX + 10):
        body, length = _binary_request(np.zeros((1, i + 1), dtype=np.float32))
        v2.decode_infer_request(body, length, "m")
        assert len(v2._PARSED) <= v2._PARSED_MAX


def test_an_answer_of_shapes_seen_before_carries_its_own_data():
    request = InferRequest("m", outputs=[RequestedOutput("OUT", True)])

    def answer(values: np.ndarray) -> tuple[bytes, int | None]:
        response = InferResponse("m", "1", outputs=[InferTensor("OUT", "FP32", list(values.shape), values)])
        return v2.encode_infer_response(response, request)

    first_body, first_length = answer(np.zeros((1, 3), dtype=np.float32))
    second_body, second_length = answer(np.array([[1, 2, 3]], dtype=np.float32))
    assert first_length == second_length and first_body[:first_length] == second_body[:second_length]
    decoded = v2.decode_infer_response(second_body, second_length)
    assert decoded.outputs[0].data.tolist() == [[1, 2, 3]]
    # Data that does not fit its shape is refused as before, whatever was encoded before.
    misfit = InferResponse("m", "1", outputs=[InferTensor("OUT", "FP32", [1, 3], np.zeros((1, 4), np.float32))])
    with pytest.raises(CodecError, match="needs 3 elements but data has 4"):
        v2.encode_infer_response(misfit, request)
    # An id, or JSON output, takes the full path and says so in the header.
    with_id = InferResponse("m", "1", "r1", outputs=[InferTensor("OUT", "FP32", [1, 3], np.zeros((1, 3), np.float32))])
    body, length = v2.encode_infer_response(with_id, request)
    assert length is not None and json.loads(body[:length])["id"] == "r1"
    as_json, none = v2.encode_infer_response(with_id, InferRequest("m", outputs=[RequestedOutput("OUT", False)]))
    assert none is None and json.loads(as_json)["outputs"][0]["data"] == [0, 0, 0]


def test_a_raw_bytes_request_to_a_batched_model_is_one_element_of_shape_1_1() -> None:
    request = v2.decode_raw_binary_request(b"\x05\x00\x00\x00hi", "m", "", "RAW", "BYTES", [1, 1])
    (tensor,) = request.inputs
    assert tensor.shape == [1, 1]
    assert tensor.data.tolist() == [[b"\x05\x00\x00\x00hi"]]
    with pytest.raises(v2.CodecError, match="needs BYTES shape"):
        v2.decode_raw_binary_request(b"x", "m", "", "RAW", "BYTES", [1, 2])
