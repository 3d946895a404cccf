"""Tensors in shared memory on the wire (v2kit's codec and gRPC protos): an input names its region
and carries no data; an output the server wrote to a region leaves with neither data nor
parameters, as Triton's do; over gRPC, raw contents count only the inputs that are not in shared
memory, as tritonclient sends them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from v2kit import codec as v2
from v2kit.grpc_proto import request_from_proto, request_to_proto, response_to_proto

REGION = {"shared_memory_region": "r", "shared_memory_offset": 8, "shared_memory_byte_size": 16}


def http_request(inputs: list[dict[str, object]], outputs: list[dict[str, object]] | None = None) -> v2.InferRequest:
    doc: dict[str, object] = {"inputs": inputs}
    if outputs is not None:
        doc["outputs"] = outputs
    return v2.decode_infer_request(json.dumps(doc).encode(), None, "m")


def test_an_input_in_shared_memory_decodes_to_a_placeholder_naming_its_region() -> None:
    request = http_request(
        [
            {"name": "A", "datatype": "FP32", "shape": [1, 4], "parameters": REGION},
            {"name": "B", "datatype": "INT32", "shape": [1], "data": [3]},
        ],
        [{"name": "Y", "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 16}}],
    )
    a, b = request.inputs
    assert a.data.size == 0 and a.data.dtype == np.float32 and a.shape == [1, 4]
    assert v2.shared_memory_ref(a.parameters, "A") == v2.SharedMemoryRef("r", 8, 16)
    assert b.data.tolist() == [3]
    assert request.outputs is not None
    assert v2.shared_memory_ref(request.outputs[0].parameters, "Y") == v2.SharedMemoryRef("o", 0, 16)


@pytest.mark.parametrize(
    ("parameters", "extra", "fragment"),
    [
        (REGION, {"data": [1, 2, 3, 4]}, "has both shared_memory_region and data"),
        ({"shared_memory_byte_size": 16}, {}, "shared_memory_byte_size needs shared_memory_region"),
        ({"shared_memory_region": 5, "shared_memory_byte_size": 16}, {}, "must be a non-empty string"),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": -1},
            {},
            "shared_memory_byte_size must be an integer",
        ),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": True}, {}, "offset"),
    ],
)
def test_malformed_shared_memory_parameters(
    parameters: dict[str, object], extra: dict[str, object], fragment: str
) -> None:
    with pytest.raises(v2.CodecError, match=fragment):
        http_request([{"name": "A", "datatype": "FP32", "shape": [4], "parameters": parameters, **extra}])


def test_null_data_is_not_taken_for_shared_memory() -> None:
    with pytest.raises(v2.CodecError, match="'data' must be a JSON array"):
        http_request([{"name": "A", "datatype": "FP32", "shape": [1], "data": None}])


def test_an_output_in_shared_memory_leaves_without_data_or_parameters() -> None:
    request = v2.InferRequest("m", outputs=[v2.RequestedOutput("Y", binary=True), v2.RequestedOutput("Z")])
    response = v2.InferResponse(
        "m",
        "1",
        outputs=[
            v2.InferTensor("Y", "FP32", [2], np.empty(0, np.uint8), dict(REGION)),
            v2.InferTensor("Z", "FP32", [2], np.ones(2, np.float32)),
        ],
    )
    body, header_length = v2.encode_infer_response(response, request)
    assert header_length is None  # Y went to shared memory, so nothing is binary
    doc = json.loads(body)
    assert doc["outputs"][0] == {"name": "Y", "shape": [2], "datatype": "FP32"}
    assert doc["outputs"][1]["data"] == [1.0, 1.0]

    proto = response_to_proto(response)
    assert list(proto.raw_output_contents) == [b"", np.ones(2, np.float32).tobytes()]
    assert not proto.outputs[0].parameters


def test_an_output_in_shared_memory_with_binary_data_is_refused_as_triton_refuses_it() -> None:
    # Triton 2.51 answers 400 to binary_data true beside a region, and takes false or none.
    tensor = {"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]}
    with pytest.raises(v2.CodecError, match="Output can't set both 'shared_memory_region' and 'binary_data'"):
        http_request([tensor], [{"name": "Y", "parameters": {**REGION, "binary_data": True}}])
    for params in ({**REGION, "binary_data": False}, REGION):
        (output,) = http_request([tensor], [{"name": "Y", "parameters": params}]).outputs or ()
        assert v2.shared_memory_ref(output.parameters, "Y") is not None
    # And what perfkit sends for one: no binary_data at all, as tritonclient.
    request = v2.InferRequest("m", outputs=[v2.RequestedOutput("Y", parameters=dict(REGION))])
    assert json.loads(v2.encode_infer_request(request)[0])["outputs"] == [{"name": "Y", "parameters": REGION}]


def test_grpc_raw_contents_count_only_inputs_outside_shared_memory() -> None:
    request = v2.InferRequest(
        "m",
        inputs=[
            v2.InferTensor("A", "FP32", [4], np.empty(0, np.float32), dict(REGION)),
            v2.InferTensor("B", "INT32", [2], np.array([5, 6], np.int32)),
        ],
    )
    proto = request_to_proto(request)  # what tritonclient sends: one raw entry, for B
    assert len(proto.raw_input_contents) == 1
    back = request_from_proto(proto)
    assert back.inputs[0].data.size == 0 and v2.shared_memory_ref(back.inputs[0].parameters, "A") is not None
    assert back.inputs[1].data.tolist() == [5, 6]

    proto.raw_input_contents.append(b"\0" * 16)
    with pytest.raises(v2.CodecError, match="raw_input_contents has 2 entries for 1 inputs"):
        request_from_proto(proto)


def test_grpc_input_with_region_and_contents_is_refused() -> None:
    proto = pb.ModelInferRequest(model_name="m")
    tensor = proto.inputs.add(name="A", datatype="INT32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    tensor.contents.int_contents.append(1)
    with pytest.raises(v2.CodecError, match="has both shared_memory_region and contents"):
        request_from_proto(proto)
