"""perfkit.load.inputs: perf_analyzer's input-data semantics, from metadata and config dicts to requests."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from perfkit.errors import PerfkitError, TargetError
from perfkit.load.inputs import build_requests, build_sequence_streams, has_streams, parse_shape_flag, parse_shape_flags
from perfkit.wire.client import make_client
from v2kit import codec as v2
from v2kit.grpc_proto import request_from_proto

ALL = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]


def meta(*inputs: tuple[str, str, list[int]], outputs: tuple[str, ...] = ("OUTPUT0",)) -> dict[str, Any]:
    return {
        "name": "m",
        "inputs": [{"name": n, "datatype": dt, "shape": shape} for n, dt, shape in inputs],
        "outputs": [{"name": n, "datatype": "FP32", "shape": [-1, 10]} for n in outputs],
    }


MLP = meta(("INPUT0", "FP32", [-1, 256]))
MLP_CONFIG = {
    "name": "mlp",
    "max_batch_size": 64,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
}
IDENTITY = meta(("INPUT0", "FP32", [-1, -1]))
BATCH8 = {"max_batch_size": 8}


def only_tensor(requests: list[v2.InferRequest]) -> v2.InferTensor:
    assert len(requests) == 1 and len(requests[0].inputs) == 1
    return requests[0].inputs[0]


def write_data(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    return str(path)


# --- generated data -------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ALL)
@pytest.mark.parametrize("mode", ["random", "zero"])
def test_generated_data_has_the_datatype_and_batched_shape(datatype: str, mode: str) -> None:
    requests = build_requests(
        meta(("X", datatype, [-1, 2, 3])), BATCH8, model="m", batch_size=4, input_data=mode, string_length=7
    )
    t = only_tensor(requests)
    assert (t.name, t.datatype, t.shape) == ("X", datatype, [4, 2, 3])
    assert t.data.shape == (4, 2, 3)
    assert t.data.dtype == v2.datatype_to_numpy(datatype)
    if datatype == "BYTES":
        assert all(isinstance(x, bytes) and len(x) == 7 for x in t.data.ravel())
        if mode == "zero":
            assert set(t.data.ravel()) == {b"0000000"}
        else:
            assert all(x.isalnum() for x in t.data.ravel())
    elif mode == "zero":
        assert not np.any(t.data)
    # perf_analyzer generates one batch-1 row per input and repeats it to fill the batch
    for row in t.data[1:]:
        np.testing.assert_array_equal(row, t.data[0])
    body, _ = v2.encode_infer_request(requests[0])  # the codec accepts what we built
    assert body


def test_random_values_are_in_their_ranges() -> None:
    requests = build_requests(
        meta(("F", "FP32", [500]), ("I", "INT8", [500]), ("B", "BOOL", [500])), {}, model="m", seed=3
    )
    f, i, b = (t.data for t in requests[0].inputs)
    assert -1.0 < f.mean() < 1.0 and 0.5 < f.std() < 1.5  # standard normal
    assert i.min() >= 0 and i.max() < 100 and len(set(i.tolist())) > 20
    assert 0 < b.sum() < 500


def test_random_data_is_reproducible_per_seed() -> None:
    a = only_tensor(build_requests(MLP, MLP_CONFIG, model="mlp", seed=7)).data
    b = only_tensor(build_requests(MLP, MLP_CONFIG, model="mlp", seed=7)).data
    c = only_tensor(build_requests(MLP, MLP_CONFIG, model="mlp", seed=8)).data
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    strings = build_requests(meta(("S", "BYTES", [4])), {}, model="m", seed=1)
    again = build_requests(meta(("S", "BYTES", [4])), {}, model="m", seed=1)
    assert list(strings[0].inputs[0].data) == list(again[0].inputs[0].data)


def test_request_carries_model_version_and_outputs() -> None:
    (request,) = build_requests(MLP, MLP_CONFIG, model="mlp", version="2", outputs=["OUTPUT0"])
    assert (request.model_name, request.model_version) == ("mlp", "2")
    assert request.outputs == [v2.RequestedOutput("OUTPUT0")]
    (default,) = build_requests(MLP, MLP_CONFIG, model="mlp")
    assert default.outputs is None  # the server returns all outputs
    with pytest.raises(PerfkitError, match="'NOPE' is not an output of model 'mlp' \\(outputs: OUTPUT0\\)"):
        build_requests(MLP, MLP_CONFIG, model="mlp", outputs=["NOPE"])


# --- batch dimension and shapes -------------------------------------------------------------------


def test_batch_dimension_follows_max_batch_size() -> None:
    t = only_tensor(build_requests(MLP, MLP_CONFIG, model="mlp", batch_size=64))
    assert t.shape == [64, 256]
    unbatched = meta(("X", "FP32", [3, 4]))
    assert only_tensor(build_requests(unbatched, {"max_batch_size": 0}, model="u")).shape == [3, 4]
    assert only_tensor(build_requests(unbatched, {}, model="u")).shape == [3, 4]


def test_batch_size_errors_name_the_flag_and_the_limit() -> None:
    with pytest.raises(PerfkitError, match="-b 65 exceeds the max_batch_size 64 of model 'mlp'; pass -b 64 or less"):
        build_requests(MLP, MLP_CONFIG, model="mlp", batch_size=65)
    with pytest.raises(PerfkitError, match="model 'u' does not support batching \\(max_batch_size 0\\); -b must be 1"):
        build_requests(meta(("X", "FP32", [3])), {"max_batch_size": 0}, model="u", batch_size=2)
    with pytest.raises(PerfkitError, match="-b must be at least 1"):
        build_requests(MLP, MLP_CONFIG, model="mlp", batch_size=0)


def test_variable_dimensions_need_shape() -> None:
    two = meta(("X", "FP32", [-1, -1, 16]))
    with pytest.raises(PerfkitError, match=r"input 'X' has variable dimensions \[-1, 16\]; pass --shape X:D1,D2$"):
        build_requests(two, BATCH8, model="m")
    t = only_tensor(build_requests(two, BATCH8, model="m", batch_size=2, shapes={"X": [5, 16]}))
    assert t.shape == [2, 5, 16]
    t = only_tensor(build_requests(IDENTITY, BATCH8, model="identity", shapes={"INPUT0": [32]}))
    assert t.shape == [1, 32]


def test_shape_errors() -> None:
    with pytest.raises(PerfkitError, match="--shape names input 'Y', but model 'm' has inputs INPUT0"):
        build_requests(IDENTITY, BATCH8, model="m", shapes={"Y": [3]})
    with pytest.raises(
        PerfkitError, match=r"--shape X:4,15: shape \[4, 15\] does not fit input 'X' dimensions \[-1, 16\]"
    ):
        build_requests(meta(("X", "FP32", [-1, -1, 16])), BATCH8, model="m", shapes={"X": [4, 15]})
    with pytest.raises(PerfkitError, match=r"does not fit input 'INPUT0' dimensions \[-1\]"):
        build_requests(IDENTITY, BATCH8, model="m", shapes={"INPUT0": [2, 2]})


def test_parse_shape_flag() -> None:
    assert parse_shape_flag("INPUT0:3,224,224") == ("INPUT0", [3, 224, 224])
    assert parse_shape_flag("input:0:7") == ("input:0", [7])  # names with colons keep them
    for bad, why in [
        ("INPUT0", "expects NAME:D1,D2"),
        (":3", "expects NAME:D1,D2"),
        ("X:", "dimension '' is not a positive integer"),
        ("X:3,a", "dimension 'a' is not a positive integer"),
        ("X:-1", "dimension '-1' is not a positive integer"),
    ]:
        with pytest.raises(PerfkitError, match=why):
            parse_shape_flag(bad)
    assert parse_shape_flags(["A:1", "B:2,3"]) == {"A": [1], "B": [2, 3]}
    with pytest.raises(PerfkitError, match="--shape names input 'A' twice"):
        parse_shape_flags(["A:1", "A:2"])


def test_malformed_metadata_is_a_target_error() -> None:
    with pytest.raises(TargetError, match="lists no inputs"):
        build_requests({"name": "m"}, {}, model="m")
    with pytest.raises(TargetError, match="malformed input"):
        build_requests(meta(("X", "FLOAT", [1])), {}, model="m")


# --- data files -----------------------------------------------------------------------------------


def test_data_file_flat_b64_and_content_forms(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32)
    doc = {
        "data": [
            {"INPUT0": x.tolist()},
            {"INPUT0": {"b64": base64.b64encode((x + 10).tobytes()).decode()}},
            {"INPUT0": {"content": (x + 20).tolist(), "shape": [6]}},
            {"INPUT0": {"content": {"b64": base64.b64encode((x + 30).tobytes()).decode()}, "shape": [6]}},
        ]
    }
    requests = build_requests(
        IDENTITY, BATCH8, model="identity", shapes={"INPUT0": [6]}, input_data=write_data(tmp_path, doc)
    )
    assert len(requests) == 4  # one request per data step
    for i, request in enumerate(requests):
        (t,) = request.inputs
        assert t.shape == [1, 6] and t.datatype == "FP32"
        np.testing.assert_array_equal(t.data, [x + 10 * i])


def test_content_shape_overrides_shape_flag(tmp_path: Path) -> None:
    doc = {"data": [{"INPUT0": {"content": [1.0, 2.0, 3.0], "shape": [3]}}]}
    path = write_data(tmp_path, doc)
    (request,) = build_requests(IDENTITY, BATCH8, model="identity", input_data=path)  # no --shape needed
    assert request.inputs[0].shape == [1, 3]
    (request,) = build_requests(IDENTITY, BATCH8, model="identity", shapes={"INPUT0": [8]}, input_data=path)
    assert request.inputs[0].shape == [1, 3]


def test_batches_are_filled_round_robin_as_perf_analyzer_does(tmp_path: Path) -> None:
    doc = {"data": [{"INPUT0": [float(i)] * 2} for i in range(3)]}
    requests = build_requests(
        IDENTITY, BATCH8, model="identity", batch_size=2, shapes={"INPUT0": [2]}, input_data=write_data(tmp_path, doc)
    )
    # request s holds steps s, s+1 (mod 3): infer_data_manager.cc UpdateInputs
    assert [r.inputs[0].data[:, 0].tolist() for r in requests] == [[0.0, 1.0], [1.0, 2.0], [2.0, 0.0]]
    assert all(r.inputs[0].shape == [2, 2] for r in requests)
    # more rows than steps wrap around
    (one,) = build_requests(
        IDENTITY, BATCH8, model="identity", batch_size=5, shapes={"INPUT0": [2]},
        input_data=write_data(tmp_path, {"data": [{"INPUT0": [7.0, 8.0]}]}),
    )  # fmt: skip
    assert one.inputs[0].shape == [5, 2]


def test_steps_with_different_shapes_cannot_share_a_batch(tmp_path: Path) -> None:
    doc = {"data": [{"INPUT0": {"content": [1.0], "shape": [1]}}, {"INPUT0": {"content": [1.0, 2.0], "shape": [2]}}]}
    path = write_data(tmp_path, doc)
    assert len(build_requests(IDENTITY, BATCH8, model="identity", input_data=path)) == 2
    with pytest.raises(PerfkitError, match=r"cannot batch input 'INPUT0' of data\[0\] to data\[1\] together"):
        build_requests(IDENTITY, BATCH8, model="identity", batch_size=2, input_data=path)


def test_bytes_bool_and_fp16_in_data_files(tmp_path: Path) -> None:
    m = meta(("S", "BYTES", [-1, 2]), ("B", "BOOL", [-1, 2]), ("H", "FP16", [-1, 2]))
    prefixed = v2.serialize_bytes_tensor([b"x", b"yz"])
    doc = {
        "data": [
            {"S": ["a", "bc"], "B": [True, False], "H": [0.5, 1.5]},
            {"S": {"b64": base64.b64encode(prefixed).decode()}, "B": [False, True], "H": [2.5, 3.5]},
        ]
    }
    requests = build_requests(m, BATCH8, model="m", input_data=write_data(tmp_path, doc))
    s, b, h = requests[0].inputs
    assert s.data.tolist() == [[b"a", b"bc"]] and b.data.tolist() == [[True, False]]
    assert h.data.dtype == np.float16 and h.data.tolist() == [[0.5, 1.5]]
    assert requests[1].inputs[0].data.tolist() == [[b"x", b"yz"]]


def test_optional_inputs_may_be_left_out(tmp_path: Path) -> None:
    m = meta(("A", "FP32", [-1, 1]), ("B", "FP32", [-1, 1]))
    config = {"max_batch_size": 4, "input": [{"name": "A"}, {"name": "B", "optional": True}]}
    path = write_data(tmp_path, {"data": [{"A": [1.0]}, {"A": [2.0], "B": [3.0]}]})
    first, second = build_requests(m, config, model="m", input_data=path)
    assert [t.name for t in first.inputs] == ["A"] and [t.name for t in second.inputs] == ["A", "B"]
    with pytest.raises(PerfkitError, match="optional input 'B' is in some of"):
        build_requests(m, config, model="m", batch_size=2, input_data=path)
    with pytest.raises(PerfkitError, match=r"data\[0\] has no data for input 'B'"):
        build_requests(m, {"max_batch_size": 4}, model="m", input_data=path)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"nodata": []}, 'expected a JSON object with a non-empty "data" list'),
        ({"data": []}, 'expected a JSON object with a non-empty "data" list'),
        ({"data": [[{"INPUT0": [1.0]}]]}, r"data\[0\] is a list: sequence streams"),
        ({"data": [{"INPUT0": [1.0, 2.0]}, {"INPUT1": [1.0]}]}, r"data\[1\] names 'INPUT1', which is not an input"),
        (
            {"data": [{"INPUT0": [1.0, 2.0]}, {"INPUT0": [1.0]}]},
            r"data\[1\]: input 'INPUT0': shape \[2\] needs 2 elements but data has 1",
        ),
        ({"data": [{"INPUT0": ["a", "b"]}]}, r"data\[0\]: input 'INPUT0': FP32 data must be JSON numbers"),
        ({"data": [{"INPUT0": {"b64": "AAAA"}}]}, r"data\[0\]: input 'INPUT0': expected 8 bytes"),
        ({"data": [{"INPUT0": {"b64": "!!"}}]}, r"data\[0\]: input 'INPUT0': invalid base64"),
        ({"data": [{"INPUT0": 3}]}, r"data\[0\]: input 'INPUT0': expected a list of values"),
        ({"data": [{"INPUT0": {"content": [1.0], "shape": "x"}}]}, r'"shape" must be a list of integers'),
    ],
)
def test_data_file_errors_name_file_step_and_input(tmp_path: Path, doc: Any, message: str) -> None:
    path = write_data(tmp_path, doc)
    with pytest.raises(PerfkitError, match=message) as info:
        build_requests(IDENTITY, BATCH8, model="identity", shapes={"INPUT0": [2]}, input_data=path)
    assert str(info.value).startswith(f"--input-data {path}")


def test_data_file_needs_a_shape_for_variable_dimensions(tmp_path: Path) -> None:
    path = write_data(tmp_path, {"data": [{"INPUT0": [1.0, 2.0]}]})
    with pytest.raises(PerfkitError, match=r"pass --shape INPUT0:D1 or give \{\"content\": \[...\], \"shape\""):
        build_requests(IDENTITY, BATCH8, model="identity", input_data=path)


def test_unreadable_data_sources(tmp_path: Path) -> None:
    with pytest.raises(PerfkitError, match="no file 'INPUT0' for input 'INPUT0' \\(one file per input"):
        build_requests(MLP, MLP_CONFIG, model="mlp", input_data=str(tmp_path))  # a data directory without it
    with pytest.raises(PerfkitError, match="no such file; expected random, zero, a JSON data file or a data directory"):
        build_requests(MLP, MLP_CONFIG, model="mlp", input_data=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PerfkitError, match="bad.json: cannot read a JSON data file"):
        build_requests(MLP, MLP_CONFIG, model="mlp", input_data=str(tmp_path / "bad.json"))


def test_bytes_from_a_data_file_reach_the_wire_exactly(tmp_path: Path) -> None:
    items = [b"a\x00", b"", b"\xff\xfe", "\u00e9".encode()]
    doc = {"data": [{"S": {"b64": base64.b64encode(v2.serialize_bytes_tensor(items)).decode()}}]}
    path = write_data(tmp_path, doc)
    (request,) = build_requests(meta(("S", "BYTES", [-1, 4])), BATCH8, model="m", batch_size=2, input_data=path)
    http = make_client("127.0.0.1:1", "http").prepare(request)
    header_length = int(http.headers["Inference-Header-Content-Length"]) if http.headers else None
    sent = v2.decode_infer_request(http.payload, header_length, "m").inputs[0]
    assert sent.shape == [2, 4] and sent.data.tolist() == [items, items]
    grpc_payload = make_client("127.0.0.1:1", "grpc").prepare(request).payload
    sent = request_from_proto(service_pb2.ModelInferRequest.FromString(grpc_payload)).inputs[0]
    assert sent.data.tolist() == [items, items]
    with pytest.raises(PerfkitError, match=r"input 'S': BYTES element 2 is not valid UTF-8.*send it as binary"):
        make_client("127.0.0.1:1", "http", json_tensors=True).prepare(request)


def test_string_data_fills_every_string_element_and_string_length_the_generated_ones() -> None:
    (given,) = build_requests(meta(("S", "BYTES", [3]), ("X", "INT32", [2])), {}, model="m", string_data="héllo")
    assert given.inputs[0].data.tolist() == ["héllo".encode()] * 3
    assert given.inputs[1].data.shape == (2,)
    (generated,) = build_requests(meta(("S", "BYTES", [3])), {}, model="m", string_length=5)
    assert [len(s) for s in generated.inputs[0].data.tolist()] == [5, 5, 5]


def test_sequence_streams_from_a_data_file(tmp_path: Path) -> None:
    path = tmp_path / "streams.json"
    path.write_text(json.dumps({"data": [[{"X": [1]}, {"X": [2]}], [{"X": [3]}]]}))
    streams, from_data = build_sequence_streams(meta(("X", "INT32", [-1, 1])), BATCH8, model="m", input_data=str(path))
    assert from_data and [[r.inputs[0].data.tolist() for r in s] for s in streams] == [[[[1]], [[2]]], [[[3]]]]
    assert has_streams(str(path)) and not has_streams("random")
    with pytest.raises(PerfkitError, match="sequence streams are for sequence models"):
        build_requests(meta(("X", "INT32", [-1, 1])), BATCH8, model="m", input_data=str(path))
