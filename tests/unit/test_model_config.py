"""Model configuration: parsing, Triton's JSON shape, ONNX auto-complete/validation, versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from reference_server.backends.onnxruntime import signature_from_session
from reference_server.core.model_config import (
    ModelConfig,
    available_versions,
    complete_config,
    config_from_json,
    config_parameter,
    config_to_json,
    model_file,
    parse_config_text,
    read_config,
    select_versions,
)
from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import TensorSignature

# `GET /v2/models/pyadd/config` from a real Triton 2.51.0 (python backend, CPU), for this config.pbtxt:
#   name: "pyadd"  backend: "python"  max_batch_size: 8
#   dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [2, 4] }
#   instance_group [{ count: 2 kind: KIND_CPU }]
#   input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] },
#          { name: "INPUT1" data_type: TYPE_INT64 dims: [-1] optional: true }]
#   output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] },
#           { name: "OUTPUT1" data_type: TYPE_STRING dims: [1] }]
#   parameters { key: "foo" value { string_value: "bar" } }
#   version_policy { specific { versions: [1] } }
# 64-bit integers are numbers, every scalar/repeated/map field is printed at its default, unset
# sub-messages are left out, enums are names. (optimization, the group name and
# default_model_filename were filled by Triton.)
TRITON_PYADD_CONFIG: dict[str, Any] = {
    "name": "pyadd",
    "platform": "",
    "backend": "python",
    "runtime": "",
    "version_policy": {"specific": {"versions": [1]}},
    "max_batch_size": 8,
    "input": [
        {
            "name": "INPUT0",
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NONE",
            "dims": [4],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        },
        {
            "name": "INPUT1",
            "data_type": "TYPE_INT64",
            "format": "FORMAT_NONE",
            "dims": [-1],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": True,
            "is_non_linear_format_io": False,
        },
    ],
    "output": [
        {
            "name": "OUTPUT0",
            "data_type": "TYPE_FP32",
            "dims": [4],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        },
        {
            "name": "OUTPUT1",
            "data_type": "TYPE_STRING",
            "dims": [1],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        },
    ],
    "batch_input": [],
    "batch_output": [],
    "optimization": {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    },
    "dynamic_batching": {
        "preferred_batch_size": [2, 4],
        "max_queue_delay_microseconds": 100,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    },
    "instance_group": [
        {
            "name": "pyadd_0",
            "kind": "KIND_CPU",
            "count": 2,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        },
    ],
    "default_model_filename": "model.py",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {"foo": {"string_value": "bar"}},
    "model_warmup": [],
}

# The same Triton's dynamic_batching for a config with uint64 values above 2**32 and queue
# policies: still numbers; map keys (uint64 priority levels) are strings, as JSON requires.
TRITON_DYNAMIC_BATCHING: dict[str, Any] = {
    "preferred_batch_size": [4],
    "max_queue_delay_microseconds": 5000000000,
    "preserve_ordering": False,
    "priority_levels": 3,
    "default_priority_level": 2,
    "default_queue_policy": {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 7000000000,
        "allow_timeout_override": True,
        "max_queue_size": 9,
    },
    "priority_queue_policy": {
        "1": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": 11,
            "allow_timeout_override": False,
            "max_queue_size": 3,
        }
    },
}

CONFIG_PATH = Path("models/tiny/config.pbtxt")
MODEL_PATH = Path("models/tiny/1/model.onnx")


def _session(path: Path, tensors: list[tuple[str, int, list[Any]]]) -> ort.InferenceSession:
    """An ONNX model copying each input `IN_<name>` to output `<name>`, loaded in onnxruntime."""
    nodes = [helper.make_node("Identity", [f"IN_{name}"], [name]) for name, _, _ in tensors]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(f"IN_{name}", elem, shape) for name, elem, shape in tensors],
        [helper.make_tensor_value_info(name, elem, shape) for name, elem, shape in tensors],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """A graph INPUT0 FP32 [batch, 16] → OUTPUT0 FP32 [batch, 16] (via a Relu)."""
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["INPUT0"], ["OUTPUT0"])],
        "tiny",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return signature_from_session(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))


def _complete(text: str, inputs: list[TensorSignature], outputs: list[TensorSignature]) -> ModelConfig:
    return complete_config(
        parse_config_text(text, CONFIG_PATH),
        inputs,
        outputs,
        model_name="tiny",
        config_path=CONFIG_PATH,
        model_path=MODEL_PATH,
    )


# --------------------------------------------------------------------------------------------
# Parsing


def test_syntax_error_names_file_line_and_column() -> None:
    text = 'name: "mlp"\nmax_batch_size: 8\n\ninput [{ name: "A" data_tpe: TYPE_FP32 }]\n'
    with pytest.raises(ModelConfigError) as info:
        parse_config_text(text, Path("models/mlp/config.pbtxt"))
    assert str(info.value) == (
        'models/mlp/config.pbtxt:4:20: Message type "inference.ModelInput" has no field named "data_tpe".'
    )


def test_syntax_error_in_a_file_names_that_file(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m"\n  instance_group [{ kind: KIND_FOO }]\n')
    with pytest.raises(ModelConfigError, match=r"config\.pbtxt:2:27: .*KIND_FOO") as info:
        read_config(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / 'config.pbtxt'}:2:27: ")


def test_read_config(tmp_path: Path) -> None:
    assert read_config(tmp_path) is None
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 8\n')
    config = read_config(tmp_path)
    assert config is not None and config.name == "m" and config.max_batch_size == 8


def test_read_config_rejects_non_utf8_and_unreadable(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.pbtxt").write_bytes(b'name: "\xff"\n')
    with pytest.raises(ModelConfigError, match=r"a/config\.pbtxt: not valid UTF-8 \(byte offset 7\)"):
        read_config(tmp_path / "a")
    (tmp_path / "b" / "config.pbtxt").mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(ModelConfigError, match=r"b/config\.pbtxt: cannot read"):
        read_config(tmp_path / "b")


# --------------------------------------------------------------------------------------------
# JSON


def test_config_to_json_matches_triton() -> None:
    config = config_from_json(json.dumps(TRITON_PYADD_CONFIG), "fixture")
    assert config_to_json(config) == TRITON_PYADD_CONFIG
    config = config_from_json(json.dumps({"dynamic_batching": TRITON_DYNAMIC_BATCHING}), "fixture")
    assert config_to_json(config)["dynamic_batching"] == TRITON_DYNAMIC_BATCHING


def test_config_to_json_prints_int64_as_numbers_and_defaults() -> None:
    config = parse_config_text(
        'max_batch_size: 2\ninput [{ name: "X" data_type: TYPE_INT64 dims: [-1, 3] }]\n'
        "dynamic_batching { max_queue_delay_microseconds: 5000000000 }\n",
        CONFIG_PATH,
    )
    document = config_to_json(config)
    assert document["input"][0]["dims"] == [-1, 3]
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 5000000000
    assert document["name"] == "" and document["instance_group"] == [] and document["parameters"] == {}
    assert document["input"][0]["format"] == "FORMAT_NONE"
    assert "sequence_batching" not in document and "version_policy" not in document
    assert json.loads(json.dumps(document)) == document


def test_json_round_trip() -> None:
    config = parse_config_text(
        'name: "m" max_batch_size: 4 version_policy { latest { num_versions: 2 } }\n'
        'input [{ name: "X" data_type: TYPE_FP16 dims: [3] }]\n'
        'output [{ name: "Y" data_type: TYPE_STRING dims: [-1] }]\n'
        "instance_group [{ count: 3 kind: KIND_CPU }]\n"
        'parameters { key: "k" value { string_value: "v" } }\n',
        CONFIG_PATH,
    )
    assert config_from_json(json.dumps(config_to_json(config)), "round trip") == config
    assert config_from_json(json.dumps(config_to_json(config)).encode(), "round trip") == config


def test_config_from_json_accepts_what_triton_accepts() -> None:
    # Observed on Triton 2.51's load API: 64-bit ints as strings and lower-case enum names.
    config = config_from_json(
        '{"max_batch_size": 4, "input": [{"name": "X", "data_type": "type_fp32", "dims": ["4"]}],'
        ' "dynamic_batching": {"max_queue_delay_microseconds": "250"},'
        ' "instance_group": [{"kind": "kind_cpu"}]}',
        "load request",
    )
    assert config_to_json(config)["input"][0]["data_type"] == "TYPE_FP32"
    assert list(config.input[0].dims) == [4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 250
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"bogus": 1}', 'no field named "bogus"'),
        ('{"max_batch_size": "x"}', "max_batch_size"),
        (b'{"name": "\xff"}', "not valid JSON"),
    ],
)
def test_config_from_json_errors_name_the_source(text: str | bytes, reason: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        config_from_json(text, "load request for 'm'")
    assert str(info.value).startswith("load request for 'm': ")
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


def test_config_parameter() -> None:
    config = parse_config_text('parameters { key: "a" value { string_value: "1" } }', CONFIG_PATH)
    assert config_parameter(config, "a") == "1"
    assert config_parameter(config, "b") is None
    assert "b" not in config.parameters


# --------------------------------------------------------------------------------------------
# ONNX signature and auto-complete


def test_signature_from_session_maps_types_and_dims(tmp_path: Path) -> None:
    session = _session(
        tmp_path / "m.onnx",
        [
            ("f32", TensorProto.FLOAT, ["batch", 3]),
            ("i64", TensorProto.INT64, [None, 2]),
            ("txt", TensorProto.STRING, [4]),
            ("flag", TensorProto.BOOL, ["n"]),
            ("half", TensorProto.FLOAT16, [1, 2, 3]),
            ("u8", TensorProto.UINT8, []),
        ],
    )
    inputs, outputs = signature_from_session(session)
    assert outputs == [
        TensorSignature("f32", "TYPE_FP32", (-1, 3)),
        TensorSignature("i64", "TYPE_INT64", (-1, 2)),
        TensorSignature("txt", "TYPE_STRING", (4,)),
        TensorSignature("flag", "TYPE_BOOL", (-1,)),
        TensorSignature("half", "TYPE_FP16", (1, 2, 3)),
        TensorSignature("u8", "TYPE_UINT8", ()),
    ]
    assert [sig.name for sig in inputs] == ["IN_f32", "IN_i64", "IN_txt", "IN_flag", "IN_half", "IN_u8"]


def test_complete_fills_an_empty_config(tiny: tuple[list[TensorSignature], list[TensorSignature]]) -> None:
    original = ModelConfig()
    config = complete_config(original, *tiny, model_name="tiny", config_path=CONFIG_PATH, model_path=MODEL_PATH)
    assert original == ModelConfig()  # a new config is returned
    document = config_to_json(config)
    assert document["name"] == "tiny"
    assert (document["backend"], document["platform"]) == ("onnxruntime", "onnxruntime_onnx")
    assert document["max_batch_size"] == 4
    tensors = [(t["name"], t["data_type"], t["dims"]) for t in (*document["input"], *document["output"])]
    assert tensors == [("INPUT0", "TYPE_FP32", [16]), ("OUTPUT0", "TYPE_FP32", [16])]
    assert document["dynamic_batching"]["preferred_batch_size"] == [4]
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    groups = [(g["name"], g["kind"], g["count"]) for g in document["instance_group"]]
    assert groups == [("tiny", "KIND_AUTO", 1)]
    assert document["version_policy"] == {"latest": {"num_versions": 1}}
    assert document["default_model_filename"] == "model.onnx"
    # No config.pbtxt at all completes the same way.
    without_file = complete_config(None, *tiny, model_name="tiny", config_path=CONFIG_PATH, model_path=MODEL_PATH)
    assert without_file == config


def test_complete_default_max_batch_size_one_enables_no_batcher(
    tiny: tuple[list[TensorSignature], list[TensorSignature]],
) -> None:
    config = complete_config(
        None,
        *tiny,
        model_name="tiny",
        config_path=CONFIG_PATH,
        model_path=MODEL_PATH,
        default_max_batch_size=1,
    )
    assert config.max_batch_size == 1 and not config.HasField("dynamic_batching")


def test_complete_keeps_a_given_scheduler(tiny: tuple[list[TensorSignature], list[TensorSignature]]) -> None:
    config = _complete("sequence_batching { }", *tiny)
    assert config.max_batch_size == 4 and not config.HasField("dynamic_batching")


def test_complete_does_not_batch_a_fixed_shape_graph(tmp_path: Path) -> None:
    session = _session(tmp_path / "m.onnx", [("Y", TensorProto.FLOAT, [2, 3])])
    inputs, outputs = signature_from_session(session)
    config = _complete("", inputs, outputs)
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[2, 3], [2, 3]]


def test_complete_explicit_tensors_are_not_auto_batched(
    tiny: tuple[list[TensorSignature], list[TensorSignature]],
) -> None:
    config = _complete('input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 16] }]', *tiny)
    assert config.max_batch_size == 0
    assert [list(t.dims) for t in config.output] == [[-1, 16]]  # filled with the full graph shape


def test_complete_fills_partial_tensors(tiny: tuple[list[TensorSignature], list[TensorSignature]]) -> None:
    config = _complete('max_batch_size: 8\ninput [{ name: "INPUT0" dims: [16] }]', *tiny)
    assert config_to_json(config)["input"][0]["data_type"] == "TYPE_FP32"  # taken from the graph
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT0", [16])]
    assert not config.HasField("dynamic_batching")  # an explicit max_batch_size gets no batcher


@pytest.mark.parametrize(
    "text",
    [
        'max_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]',  # -1 vs fixed 16
        'max_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [3, 16] }]',  # narrows dynamic
        'name: "tiny" backend: "onnxruntime" platform: "onnxruntime_onnx" max_batch_size: 2',
        # Accepted by Triton 2.51, so accepted here: a batcher without batching, and a count below 1.
        'max_batch_size: 0\ninput [{ name: "INPUT0" dims: [-1, 16] }]\ndynamic_batching { }',
        "max_batch_size: 2\ninstance_group [{ count: -1 kind: KIND_CPU }]",
    ],
)
def test_complete_accepts(text: str, tiny: tuple[list[TensorSignature], list[TensorSignature]]) -> None:
    config = _complete(text, *tiny)
    assert all(group.count == 1 for group in config.instance_group)


def test_complete_keeps_dynamic_batching_without_batching(
    tiny: tuple[list[TensorSignature], list[TensorSignature]],
) -> None:
    # Triton 2.51 loads this (and reports preferred_batch_size []): requests queue, one per run.
    config = _complete('input [{ name: "INPUT0" dims: [-1, 16] }]\ndynamic_batching { }', *tiny)
    assert config.max_batch_size == 0
    assert config_to_json(config)["dynamic_batching"]["preferred_batch_size"] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('name: "other"', "name 'other' does not match the model folder name 'tiny'"),
        ('backend: "tensorrt"', "python models (backend 'python') are served; got backend 'tensorrt'"),
        ('platform: "tensorrt_plan"', "got platform 'tensorrt_plan'"),
        ('input [{ name: "NOPE" data_type: TYPE_FP32 dims: [16] }]', "input 'NOPE' is not a model input"),
        ('output [{ name: "NOPE" data_type: TYPE_FP32 dims: [16] }]', "output 'NOPE' is not a model output"),
        (
            'max_batch_size: 2\ninput [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }]',
            "input 'INPUT0' has data_type TYPE_INT32 but the model's is TYPE_FP32",
        ),
        (
            'max_batch_size: 2\noutput [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4, 4] }]',
            "output 'OUTPUT0' has dims [4, 4] plus the batch dimension (rank 3) but the model's shape is [-1, 16]",
        ),
        (
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16] }]',
            "the model has a leading batch dimension",
        ),
        (
            'max_batch_size: 2\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [15] }]',
            "input 'INPUT0' has dims [15] plus the batch dimension but the model's shape is [-1, 16]",
        ),
        ('max_batch_size: 2\ninput [{ name: "INPUT0" dims: [-2] }]', "input 'INPUT0' has dims [-2]"),
        (
            'max_batch_size: 2\ninput [{ name: "INPUT0" dims: [16] }, { name: "INPUT0" dims: [16] }]',
            "input 'INPUT0' is declared more than once",
        ),
        (
            'max_batch_size: 2\ninput [{ name: "INPUT0" dims: [16] reshape { shape: [4, 5] } }]',
            "model input 'INPUT0' has different size for dims and reshape: dims [16] hold 16 elements",
        ),
        ("max_batch_size: -1", "max_batch_size must be >= 0, got -1"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [0] }", "preferred_batch_size 0"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }", "preferred_batch_size 8"),
        (
            'max_batch_size: 0\ninput [{ name: "INPUT0" dims: [-1, 16] }]\n'
            "dynamic_batching { preferred_batch_size: [1] }",
            "preferred_batch_size 1",
        ),
        ("version_policy { specific { } }", "version_policy specific must list at least one version"),
        ("version_policy { latest { } }", "num_versions >= 1"),
    ],
)
def test_complete_rejects_contradictions(
    text: str, expected: str, tiny: tuple[list[TensorSignature], list[TensorSignature]]
) -> None:
    with pytest.raises(ModelConfigError) as info:
        _complete(text, *tiny)
    message = str(info.value)
    assert message.startswith(f"{CONFIG_PATH}: ")
    assert str(MODEL_PATH) in message
    assert expected in message


def test_complete_rejects_a_batch_size_the_graph_cannot_take(tmp_path: Path) -> None:
    session = _session(tmp_path / "m.onnx", [("Y", TensorProto.FLOAT, [1, 3])])
    inputs, outputs = signature_from_session(session)
    expected = r"max_batch_size 8 needs .* tensor 'IN_Y' has shape \[1, 3\]"
    with pytest.raises(ModelConfigError, match=expected) as info:
        _complete("max_batch_size: 8", inputs, outputs)
    assert str(MODEL_PATH) in str(info.value)


def test_complete_rejects_unsupported_graph_types() -> None:
    weird = [TensorSignature("SEQ", "TYPE_INVALID", (-1,))]
    with pytest.raises(ModelConfigError, match="tensor 'SEQ' is not a tensor of a supported element type"):
        _complete("", weird, weird)


# --------------------------------------------------------------------------------------------
# Versions and files


def test_available_versions(tmp_path: Path) -> None:
    for name in ("1", "10", "2", "latest", "03"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    (tmp_path / "config.pbtxt").write_text("")
    assert available_versions(tmp_path) == [1, 2, 3, 10]
    assert available_versions(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [5]),
        ("version_policy { latest { num_versions: 1 } }", [5]),
        ("version_policy { latest { num_versions: 2 } }", [3, 5]),
        ("version_policy { latest { num_versions: 9 } }", [1, 2, 3, 5]),
        ("version_policy { all { } }", [1, 2, 3, 5]),
        ("version_policy { specific { versions: [3, 1] } }", [1, 3]),
        ("version_policy { specific { versions: [2, 4] } }", [2]),  # 4 is missing: just not served
        ("version_policy { specific { versions: [4] } }", []),
    ],
)
def test_select_versions(policy: str, expected: list[int]) -> None:
    config = parse_config_text(policy, CONFIG_PATH)
    assert select_versions(config, [5, 1, 3, 2]) == expected
    assert select_versions(config, []) == []


def test_model_file(tmp_path: Path) -> None:
    assert model_file(tmp_path, 3, ModelConfig()) == tmp_path / "3" / "model.onnx"
    custom = parse_config_text('default_model_filename: "net.onnx"', CONFIG_PATH)
    assert model_file(tmp_path, 1, custom) == tmp_path / "1" / "net.onnx"
    for name in ("../../etc/passwd", "/etc/passwd", "a/../../b"):
        with pytest.raises(ModelConfigError, match="must be a path inside the version folder"):
            model_file(tmp_path, 1, parse_config_text(f'default_model_filename: "{name}"', CONFIG_PATH))
