"""BYTES tensors survive every v2kit encoding byte for byte, both ways: the HTTP binary extension,
gRPC raw contents and `bytes_contents`, and JSON for the elements JSON can carry (UTF-8 text).

Properties over arbitrary lists of bytes (empty, NUL, non-UTF-8, long). PERFKIT_FUZZ_EXAMPLES=N
runs N random examples each; unset, a modest, repeatable run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from tests.fuzz.wire import fuzz_settings
from v2kit import codec as v2
from v2kit import grpc_proto
from v2kit.tensors import CodecError, object_array

_LONG = bytes(range(256)) * 4096  # 1 MiB, every byte value

element = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"\x00", b"a\x00", b"\x00\x00b", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"caf\xe9"]),
    st.integers(0, len(_LONG)).map(lambda n: _LONG[:n]),
)
elements = st.lists(element, max_size=6)
texts = st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=20), max_size=6)
SETTINGS = fuzz_settings(40)


def tensor(name: str, items: list[bytes]) -> v2.InferTensor:
    return v2.InferTensor(name, "BYTES", [1, len(items)], object_array(items).reshape(1, len(items)))


def exact(arr: np.ndarray, items: list[bytes]) -> bool:
    """The decoded tensor is an object array of `bytes`, equal element for element (type included)."""
    values = arr.ravel().tolist()
    return arr.dtype == object and all(type(x) is bytes for x in values) and values == items


@SETTINGS
@given(elements, elements)
def test_http_binary_extension_round_trips_any_bytes(a: list[bytes], b: list[bytes]) -> None:
    request = v2.InferRequest("m", inputs=[tensor("A", a), tensor("B", b)])
    body, length = v2.encode_infer_request(request, binary_inputs=True)
    decoded = v2.decode_infer_request(body, length, "m")
    assert exact(decoded.inputs[0].data, a) and exact(decoded.inputs[1].data, b)
    assert decoded.inputs[0].shape == [1, len(a)]

    response = v2.InferResponse("m", "1", outputs=[tensor("A", a), tensor("B", b)])
    body, length = v2.encode_infer_response(response, v2.InferRequest("m", parameters={"binary_data_output": True}))
    back = v2.decode_infer_response(body, length)
    assert exact(back.outputs[0].data, a) and exact(back.outputs[1].data, b)


@SETTINGS
@given(elements)
def test_grpc_raw_contents_round_trip_any_bytes(items: list[bytes]) -> None:
    request = v2.InferRequest("m", inputs=[tensor("A", items)])
    wire = grpc_proto.request_to_proto(request).SerializeToString()
    assert exact(grpc_proto.request_from_proto(service_pb2.ModelInferRequest.FromString(wire)).inputs[0].data, items)

    response = v2.InferResponse("m", "1", outputs=[tensor("A", items)])
    wire = grpc_proto.response_to_proto(response).SerializeToString()
    assert exact(grpc_proto.response_from_proto(service_pb2.ModelInferResponse.FromString(wire)).outputs[0].data, items)


@SETTINGS
@given(elements)
def test_grpc_bytes_contents_round_trip_any_bytes(items: list[bytes]) -> None:
    pb = service_pb2.ModelInferRequest(model_name="m")
    pb.inputs.add(name="A", datatype="BYTES", shape=[1, len(items)]).contents.bytes_contents.extend(items)
    wire = pb.SerializeToString()
    assert exact(grpc_proto.request_from_proto(service_pb2.ModelInferRequest.FromString(wire)).inputs[0].data, items)

    out = service_pb2.ModelInferResponse(model_name="m")
    out.outputs.add(name="A", datatype="BYTES", shape=[len(items)]).contents.bytes_contents.extend(items)
    wire = out.SerializeToString()
    assert exact(grpc_proto.response_from_proto(service_pb2.ModelInferResponse.FromString(wire)).outputs[0].data, items)


@SETTINGS
@given(texts)
def test_json_round_trips_any_utf8_text(strings: list[str]) -> None:
    items = [s.encode() for s in strings]
    request = v2.InferRequest("m", inputs=[tensor("A", items)])
    body, length = v2.encode_infer_request(request, binary_inputs=False, binary_outputs=False)
    assert length is None
    assert exact(v2.decode_infer_request(body, None, "m").inputs[0].data, items)

    response = v2.InferResponse("m", "1", outputs=[tensor("A", items)])
    body, length = v2.encode_infer_response(response, v2.InferRequest("m"))
    assert length is None and exact(v2.decode_infer_response(body, None).outputs[0].data, items)


@SETTINGS
@given(elements)
def test_json_refuses_exactly_the_elements_that_are_not_utf8(items: list[bytes]) -> None:
    def utf8(x: bytes) -> bool:
        try:
            x.decode()
        except UnicodeDecodeError:
            return False
        return True

    bad = [i for i, x in enumerate(items) if not utf8(x)]
    response = v2.InferResponse("m", "1", outputs=[tensor("OUT", items)])
    if not bad:
        body, _ = v2.encode_infer_response(response, v2.InferRequest("m"))
        assert exact(v2.decode_infer_response(body, None).outputs[0].data, items)
        return
    with pytest.raises(CodecError, match=rf"output 'OUT': BYTES element {bad[0]} is not valid UTF-8.*binary_data"):
        v2.encode_infer_response(response, v2.InferRequest("m"))


@SETTINGS
@given(element)
def test_a_raw_binary_request_is_its_one_element(item: bytes) -> None:
    request = v2.decode_raw_binary_request(item, "m", "", "A", "BYTES", [1])
    assert exact(request.inputs[0].data, [item])


def test_json_nul_and_escapes_are_the_bytes_they_stand_for() -> None:
    body = b'{"inputs":[{"name":"A","datatype":"BYTES","shape":[3],"data":["a\\u0000b","\\u00e9","\\ud83d\\ude00"]}]}'
    data = v2.decode_infer_request(body, None, "m").inputs[0].data
    assert exact(data, [b"a\x00b", "\u00e9".encode(), "\U0001f600".encode()])


def test_str_elements_are_sent_as_utf8_and_a_lone_surrogate_is_refused() -> None:
    assert v2.serialize_bytes_tensor(np.array(["a\x00\u00e9", ""], dtype=object)) == (
        b"\x04\x00\x00\x00a\x00\xc3\xa9\x00\x00\x00\x00"
    )
    with pytest.raises(CodecError, match="BYTES element 1 is a str that is not valid Unicode"):
        v2.serialize_bytes_tensor(np.array(["ok", "\ud800"], dtype=object))
