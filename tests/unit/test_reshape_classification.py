"""Reshape (checked at load, applied around the scheduler), classification (Triton's top-k strings)
and the load API's `file:` override folders, each on its own, without a server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.warmup import run_warmup
from reference_server.core.classification import classify, read_labels, requested_classes
from reference_server.core.load_overrides import OverrideFolders
from reference_server.core.model_config import complete_config, parse_config_text, reshape_problem
from reference_server.errors import InternalError, InvalidArgument, ModelConfigError, ServerError, Unsupported
from reference_server.scheduling.execute import Tensors, TensorSignature
from reference_server.scheduling.reshape import ReshapePlan, ReshapingScheduler, with_reshape
from v2kit import codec as v2

# NVIDIA's quick-start densenet_onnx config.pbtxt (server repo, docs/examples/model_repository), as is.
DENSENET_CONFIG = """\
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""
DENSENET_GRAPH = (
    [TensorSignature("data_0", "TYPE_FP32", (1, 3, 224, 224))],
    [TensorSignature("fc6_1", "TYPE_FP32", (1, 1000, 1, 1))],
)
CONFIG_PATH = Path("models/densenet_onnx/config.pbtxt")


def _complete(text: str) -> mc.ModelConfig:
    return complete_config(
        parse_config_text(text, CONFIG_PATH),
        *DENSENET_GRAPH,
        model_name="densenet_onnx",
        config_path=CONFIG_PATH,
        model_path=Path("models/densenet_onnx/1/model.onnx"),
    )


# --- reshape at load --------------------------------------------------------------------------


def test_the_densenet_quick_start_config_completes_with_its_reshapes() -> None:
    config = _complete(DENSENET_CONFIG)
    assert list(config.input[0].dims) == [3, 224, 224]
    assert list(config.input[0].reshape.shape) == [1, 3, 224, 224]
    assert list(config.output[0].reshape.shape) == [1, 1000, 1, 1]


def test_a_reshape_holding_other_element_count_is_refused_naming_model_tensor_and_shapes() -> None:
    with pytest.raises(ModelConfigError) as caught:
        _complete(DENSENET_CONFIG.replace("shape: [ 1, 1000, 1, 1 ]", "shape: [ 1, 999, 1, 1 ]"))
    message = str(caught.value)
    for part in (
        "model 'densenet_onnx'",
        "model output 'fc6_1' has different size for dims and reshape",  # Triton's words
        "dims [1000] hold 1000 elements",
        "reshape [1,999,1,1] holds 999",
        str(CONFIG_PATH),
    ):
        assert part in message


def test_the_graph_is_checked_against_the_reshape_not_the_dims() -> None:
    # The reshape fits the dims but not the graph ([1,3,224,224]).
    with pytest.raises(
        ModelConfigError,
        match=r"input 'data_0' has reshape \[3, 1, 224, 224\] but the model.s shape is \[1, 3, 224, 224\]",
    ):
        _complete(DENSENET_CONFIG.replace("shape: [ 1, 3, 224, 224 ]", "shape: [ 3, 1, 224, 224 ]"))


@pytest.mark.parametrize(
    ("reshape", "dims", "max_batch_size", "problem"),
    [
        ([1, 3, 224, 224], [3, 224, 224], 0, ""),
        ([8, -1, 1, 6], [2, 4, -1, 6], 0, ""),  # Triton's own example of a valid variable reshape
        ([], [1], 4, ""),  # empty reshape: one element, batching only
        ([], [1], 0, "cannot have empty reshape for non-batching model as scalar tensors are not supported"),
        ([2, 0], [4], 0, "reshape dimensions must be integer >= 1, or -1"),
        ([8, -1, 2, 6], [2, 4, -1, 6], 0, "has different size for dims and reshape"),
        ([-1, -1], [-1], 0, "has different number of variable-size dimensions for dims and reshape"),
        ([-1, 4], [4], 0, "has different size for dims and reshape"),
    ],
)
def test_reshape_rules_follow_tritons(reshape: list[int], dims: list[int], max_batch_size: int, problem: str) -> None:
    found = reshape_problem(reshape, dims, max_batch_size)
    assert found.startswith(problem) if problem else found == ""


# --- reshape at run time ----------------------------------------------------------------------


class _EchoScheduler:
    """Answers each output from the input of the same name with an `OUT` prefix; records shapes."""

    def __init__(self) -> None:
        self.seen: list[dict[str, tuple[int, ...]]] = []

    async def infer(self, inputs: Tensors, output_names: Sequence[str], **_: Any) -> Tensors:
        self.seen.append({name: array.shape for name, array in inputs.items()})
        return {"OUT" + name: array for name, array in inputs.items()}

    async def infer_stream(self, inputs: Tensors, output_names: Sequence[str], **_: Any) -> AsyncIterator[Any]:
        yield await self.infer(inputs, output_names), False
        yield ServerError("model said no"), True

    async def close(self, grace_s: float) -> None:
        pass


def _plan_config(max_batch_size: int) -> mc.ModelConfig:
    return parse_config_text(
        f'name: "r" max_batch_size: {max_batch_size}\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ 2, -1, 1, 3 ] } },\n'
        '        { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTX" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ 2, -1, 1, 3 ] } } ]\n',
        Path("r/config.pbtxt"),
    )


def test_the_model_sees_the_reshape_and_the_client_the_dims_with_the_batch_dimension_kept() -> None:
    inner = _EchoScheduler()
    scheduler = with_reshape(inner, _plan_config(8))
    assert isinstance(scheduler, ReshapingScheduler)
    x = np.arange(3 * 2 * 5 * 3, dtype=np.float32).reshape(3, 2, 5, 3)
    y = np.zeros((3, 4), np.float32)
    outputs = asyncio.run(scheduler.infer({"X": x, "Y": y}, ["OUTX"]))
    assert inner.seen == [{"X": (3, 2, 5, 1, 3), "Y": (3, 4)}]  # batch 3 and the variable 5 carried over
    assert outputs["OUTX"].shape == (3, 2, 5, 3)
    np.testing.assert_array_equal(outputs["OUTX"], x)
    assert outputs["OUTY"].shape == (3, 4)


def test_a_model_without_batching_is_reshaped_whole_and_streams_are_reshaped_too() -> None:
    inner = _EchoScheduler()
    scheduler = with_reshape(inner, _plan_config(0))
    x = np.ones((2, 7, 3), np.float32)

    async def collect() -> list[Any]:
        return [item async for item in scheduler.infer_stream({"X": x}, ["OUTX"])]

    (first, final), (error, last) = asyncio.run(collect())
    assert inner.seen == [{"X": (2, 7, 1, 3)}]
    assert first["OUTX"].shape == (2, 7, 3) and not final
    assert isinstance(error, ServerError) and last


def test_without_reshapes_the_scheduler_is_not_wrapped_and_a_misfit_output_is_an_internal_error() -> None:
    inner = _EchoScheduler()
    plain = parse_config_text('name: "p" input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]', Path("c"))
    assert with_reshape(inner, plain) is inner
    plan = ReshapePlan.from_config(_plan_config(0))
    assert plan is not None
    with pytest.raises(InternalError, match=r"model 'r' produced output 'OUTX' of shape \[6\]"):
        plan.to_client({"OUTX": np.zeros(6, np.float32)})


# --- classification ---------------------------------------------------------------------------


def test_classes_are_formatted_as_triton_does_with_labels_where_there_are() -> None:
    scores = np.array([[1.1, 3.3, 0.5, 2.4], [0.0, -1.0, 7.25, 7.25]], np.float32)
    result = classify(scores, 2, batching=True, labels=[b"apple", b"", b"pickle"])
    assert result.shape == (2, 2) and result.dtype == object
    # "%f" values; index 1 has an empty label (none), index 3 is past the labels (none).
    assert result.tolist() == [[b"3.300000:1", b"2.400000:3"], [b"7.250000:2:pickle", b"7.250000:3"]]


def test_integers_print_as_integers_and_a_count_past_the_elements_gives_them_all() -> None:
    result = classify(np.array([1, 5, 10, 4], np.int32), 9, batching=False)
    assert result.tolist() == [b"10:2", b"5:1", b"4:3", b"1:0"]  # the extension document's example
    assert classify(np.array([[200, 3]], np.uint8), 1, batching=True).tolist() == [[b"200:0"]]


def _outputs(text: str) -> dict[str, mc.ModelOutput]:
    config = parse_config_text(text, Path("c"))
    return {o.name: o for o in config.output}


def test_requested_classes_refuse_what_triton_refuses() -> None:
    outputs = _outputs(
        'output [ { name: "P" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "S" data_type: TYPE_STRING dims: [ 1 ] },'
        ' { name: "H" data_type: TYPE_FP16 dims: [ 4 ] }, { name: "BIG" data_type: TYPE_INT8 dims: [ 1001, 1000 ] } ]'
    )

    def ask(name: str, count: Any) -> dict[str, int]:
        return requested_classes("m", [v2.RequestedOutput(name, parameters={"classification": count})], outputs)

    assert ask("P", 3) == {"P": 3}
    assert ask("P", 0) == {}  # a count of 0 asks for the tensor itself, as over Triton's HTTP
    with pytest.raises(InvalidArgument, match="class result not available for output due to unsupported type 'BYTES'"):
        ask("S", 1)
    with pytest.raises(InvalidArgument, match="unsupported type 'FP16'"):
        ask("H", 1)
    with pytest.raises(InvalidArgument, match="classification output tensor too large"):
        ask("BIG", 1)
    with pytest.raises(InvalidArgument, match=r"invalid value for 'classification' parameter of output 'P'"):
        ask("P", -1)
    with pytest.raises(InvalidArgument, match="invalid value type for 'classification' parameter"):
        ask("P", "3")
    both = v2.RequestedOutput("P", parameters={"classification": 1, "shared_memory_region": "r"})
    with pytest.raises(InvalidArgument, match="Output can't set both 'shared_memory_region' and 'classification'"):
        requested_classes("m", [both], outputs)


def test_labels_are_read_by_line_and_must_stay_in_the_model_folder(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes(b"TENCH\nGOLDFISH\n")
    config = parse_config_text(
        'name: "m" output [ { name: "P" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]',
        Path("c"),
    )
    assert read_labels(config, tmp_path) == {"P": [b"TENCH", b"GOLDFISH"]}
    config.output[0].label_filename = "../labels.txt"
    with pytest.raises(Unsupported, match=r"label file path .* for output 'P' in model 'm' is outside model directory"):
        read_labels(config, tmp_path / "sub")
    config.output[0].label_filename = "missing.txt"
    with pytest.raises(ModelConfigError, match="failed to open text file for read .*missing.txt"):
        read_labels(config, tmp_path)


# --- file: override folders -------------------------------------------------------------------


def test_override_files_are_staged_beside_the_config_and_replaced_on_the_next_load() -> None:
    folders = OverrideFolders()
    config = parse_config_text('name: "m" backend: "onnxruntime"', Path("c"))
    first = folders.stage("m", config, {"file:1/model.onnx": b"onnx", "file:labels.txt": b"a\n"})
    assert first.name == "m"
    assert (first / "1" / "model.onnx").read_bytes() == b"onnx"
    assert 'name: "m"' in (first / "config.pbtxt").read_text()
    folders.commit("m", first)
    second = folders.stage("m", config, {"file:1/model.onnx": b"other"})
    folders.commit("m", second)
    assert not first.exists() and second.exists()
    folders.commit("m", None)  # unloaded
    assert not second.exists()


@pytest.mark.parametrize(
    ("files", "has_config", "message"),
    [
        ({"file:../x": b"x"}, True, r"Invalid file parameter 'file:\.\./x' with normalized path '.*' must stay within"),
        ({"file:1/../../../etc/x": b"x"}, True, "must stay within model directory"),
        ({"file:/etc/x": b"x"}, True, "must stay within model directory"),
        ({"file:1/model.onnx": b"x"}, False, "Load parameter 'config' must be specified for model file override"),
        ({"file:1/model.onnx": "text"}, True, "File parameter 'file:1/model.onnx' must have bytes type"),
        ({"file:1": b"x", "file:1/model.onnx": b"y"}, True, "directory has been created as a file"),
    ],
)
def test_override_files_that_cannot_be_staged_are_refused(
    files: dict[str, Any], has_config: bool, message: str
) -> None:
    folders = OverrideFolders()
    config = parse_config_text('name: "m"', Path("c")) if has_config else None
    # Triton 2.51's words for all of these, then the reason.
    with pytest.raises(InvalidArgument, match=message) as caught:
        folders.stage("m", config, files)
    assert str(caught.value).startswith("failed to load 'm', failed to poll from model repository: ")
    if folders._root is not None:  # nothing is left behind by a refused load
        assert list(folders._root.iterdir()) == []


class _RecordingInstance:
    name = "densenet_onnx_0"

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def run(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        self.shapes.append(inputs["data_0"].shape)
        return {}


def test_warmup_samples_have_the_dims_and_reach_the_model_reshaped(tmp_path: Path) -> None:
    config = parse_config_text(
        DENSENET_CONFIG
        + 'model_warmup [ { name: "z" batch_size: 1 inputs { key: "data_0" value { data_type: TYPE_FP32 '
        "dims: [ 3, 224, 224 ] zero_data: true } } } ]",
        CONFIG_PATH,
    )
    instance = _RecordingInstance()
    assert run_warmup(config, [instance], tmp_path) == 1
    assert instance.shapes == [(1, 3, 224, 224)]


def test_a_variable_output_too_large_to_rank_is_refused_when_it_comes() -> None:
    with pytest.raises(InvalidArgument, match="classification output tensor too large"):
        classify(np.zeros(1_000_001, np.float32), 1, batching=False)


def test_an_escaping_path_is_refused_before_any_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[str] = []
    real_open = open

    def recording_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            written.append(str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", recording_open)
    folders = OverrideFolders()
    config = parse_config_text('name: "m"', Path("c"))
    with pytest.raises(InvalidArgument, match="must stay within model directory"):
        folders.stage("m", config, {"file:1/model.onnx": b"first", "file:../x": b"x"})
    assert written == []
