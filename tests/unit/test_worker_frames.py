"""What crosses between a front-end worker and the core comes out as it went in."""

from __future__ import annotations

import numpy as np
import pytest

from reference_server.errors import InvalidArgument, NotFound, ServerError
from reference_server.workers.frames import (
    FrameProtocol,
    decode,
    encode,
    error_of,
    exception_of,
    request_from_wire,
    request_to_wire,
    response_from_wire,
    response_to_wire,
)
from v2kit import codec as v2


def _through(message: tuple[object, ...]) -> object:
    frame = encode(message)
    assert int.from_bytes(frame[:4], "little") == len(frame) - 4
    return decode(frame[4:])


TENSORS = {
    "fp32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "fp16": np.array([[0.5, -2.0]], dtype=np.float16),
    "bool": np.array([True, False, True]),
    "int64 scalar": np.array(7, dtype=np.int64),
    "strided": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],
    "bytes": np.array([[b"a", b""], [b"\x00\xff", b"long" * 100]], dtype=object),
    "shared memory placeholder": np.empty(0, dtype=np.float32),
}


@pytest.mark.parametrize("kind", list(TENSORS))
def test_a_request_and_a_response_cross_unchanged(kind: str) -> None:
    data = TENSORS[kind]
    parameters = {"shared_memory_region": "r", "shared_memory_byte_size": 24} if data.size == 0 else {}
    request = v2.InferRequest(
        "m", "2", "id-1", [v2.InferTensor("IN", "FP32", [2, 3], data, parameters)],
        [v2.RequestedOutput("OUT", True, {"classification": 2})], {"sequence_id": 5, "priority": 1},
    )  # fmt: skip
    back = request_from_wire(_through(request_to_wire(request)))  # type: ignore[arg-type]
    assert (back.model_name, back.model_version, back.id, back.outputs, back.parameters) == (
        request.model_name, request.model_version, request.id, request.outputs, request.parameters,
    )  # fmt: skip
    (tensor,) = back.inputs
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.parameters) == ("IN", "FP32", [2, 3], parameters)
    assert tensor.data.dtype == data.dtype and tensor.data.shape == data.shape
    assert np.array_equal(tensor.data, data)
    response = v2.InferResponse("m", "2", "id-1", [v2.InferTensor("OUT", "FP32", list(data.shape), data)], {"x": 1})
    again = response_from_wire(_through(response_to_wire(response)))  # type: ignore[arg-type]
    assert np.array_equal(again.outputs[0].data, data) and again.parameters == {"x": 1}


def test_numpy_values_in_parameters_keep_their_value() -> None:
    request = v2.InferRequest("m", inputs=[v2.InferTensor("IN", "INT64", [1], np.array([1]), {"n": np.int64(3)})])
    back = request_from_wire(_through(request_to_wire(request)))  # type: ignore[arg-type]
    assert back.inputs[0].parameters == {"n": 3}


def test_errors_keep_their_class_and_words() -> None:
    for error in (NotFound("Request for unknown model: 'x' is not found"), InvalidArgument("bad")):
        crossed = exception_of(_through((1, "err", error_of(error, "t")))[2])  # type: ignore[index]
        assert type(crossed) is type(error) and str(crossed) == str(error)
    bug = exception_of(error_of(KeyError("k"), "a call"))
    assert isinstance(bug, ServerError) and bug.http_status == 500 and "KeyError" in str(bug)


def test_frames_split_anywhere_are_read_whole() -> None:
    got: list[tuple[object, ...]] = []
    protocol = FrameProtocol(got.append, lambda: None)
    stream = b"".join(encode((i, "ok", list(range(i)))) for i in range(20))
    for start in range(0, len(stream), 7):
        protocol.data_received(stream[start : start + 7])
    assert got == [(i, "ok", list(range(i))) for i in range(20)]
