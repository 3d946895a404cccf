"""Triton model configuration: parse it, print it as Triton does, and check it against an ONNX graph.

A model in a Triton repository is a folder `<name>/` holding an optional `config.pbtxt` (a text
`inference.ModelConfig`, the schema tritonclient ships as `model_config_pb2`) and numbered version
folders with the model file. This module turns that text (parsed by `v2kit.model_config`), or the
JSON a client sends to the repository load API, into a complete, validated `ModelConfig`.

Theory of operation:

1. Parse. `parse_config_text` / `read_config` (config.pbtxt) and `config_from_json` (load API)
   give a raw `ModelConfig`; syntax errors name the file, line and column.
2. Complete and validate. `complete_config` does what Triton's onnxruntime backend auto-complete
   does with the graph's signature (`backends.onnxruntime.signature_from_session`): fill the name,
   backend, platform, missing inputs/outputs, and (for a config without tensors whose graph
   batches) the default max_batch_size plus `dynamic_batching {}`. It then applies the normalisations Triton's core
   applies (we saw them in `GET /v2/models/{m}/config` of Triton 2.51) and rejects configs that
   contradict the graph, naming the config file, the model file and the tensor. A tensor with a
   `reshape { shape }` is the reshape to the graph and its `dims` to clients: the reshape must
   hold as many elements as the dims (`reshape_problem`, Triton's ValidateIOShape rules), and the
   graph is checked against the reshape.
3. Print. `config_to_json` renders the completed config the way Triton's config endpoint does,
   which is what perf_analyzer and model_analyzer parse.

Where Triton 2.51 accepts something that looks wrong, we accept it too, so that a repository
that loads on Triton loads here: `dynamic_batching` with `max_batch_size: 0` (requests are queued
and run one at a time) and an instance_group `count` below 1 (Triton serves one instance).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tritonclient.grpc import model_config_pb2

from reference_server.backends.onnxruntime import ONNX_BACKEND, ONNX_PLATFORM
from reference_server.backends.placement import Placement, show_placed_kinds
from reference_server.backends.python import PYTHON_BACKEND, PYTHON_MODEL_FILENAME
from reference_server.errors import ModelConfigError, raising_server_errors
from reference_server.scheduling.execute import TensorSignature
from reference_server.scheduling.sequence.config import DEFAULT_IDLE_US, SequencePolicy, hidden_tensors
from v2kit import model_config as text
from v2kit.model_config import CONFIG_FILENAME, ModelConfig, config_parameter, config_to_json

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MODEL_FILENAME",
    "ModelConfig",
    "TensorSignature",
    "available_versions",
    "complete_config",
    "config_from_json",
    "config_parameter",
    "config_to_json",
    "model_file",
    "normalize",
    "parse_config_text",
    "read_config",
    "reshape_problem",
    "select_versions",
]

DEFAULT_MODEL_FILENAME = "model.onnx"

_VERSION_DIR = re.compile(r"^[0-9]+$")


# --------------------------------------------------------------------------------------------
# Parsing: v2kit.model_config's readers, failing with ModelConfigError (a 400 / INVALID_ARGUMENT)

parse_config_text = raising_server_errors(text.parse_config_text)
read_config = raising_server_errors(text.read_config)
config_from_json = raising_server_errors(text.config_from_json)


# --------------------------------------------------------------------------------------------
# Auto-complete and validation


@dataclass(frozen=True, slots=True)
class _Where:
    """The two files every completion error names."""

    config_path: Path
    model_path: Path

    def error(self, message: str) -> ModelConfigError:
        return ModelConfigError(f"{self.config_path}: {message} (model file {self.model_path})")


def complete_config(
    config: ModelConfig | None,
    inputs: Sequence[TensorSignature],
    outputs: Sequence[TensorSignature],
    *,
    model_name: str,
    config_path: Path,
    model_path: Path,
    default_max_batch_size: int = 4,
    placements: Sequence[Placement] = (),
) -> ModelConfig:
    """Return a new config completed from the graph signature and checked against it; with the
    `placements` of its instances, a KIND_AUTO group shows the kind it was placed with.

    Raises ModelConfigError naming `config_path`, `model_path` and the offending tensor when the
    config contradicts the graph or is invalid. `config` itself is not modified.
    """
    where = _Where(config_path, model_path)
    completed = ModelConfig()
    if config is not None:
        completed.CopyFrom(config)

    _complete_identity(completed, model_name, where)
    # The sequence batcher's control and state tensors are fed by the server, not declared inputs.
    if completed.backend == ONNX_BACKEND:
        _check_controls(completed, inputs, where)
        _check_states(completed, inputs, outputs, where)
    hidden_inputs, hidden_outputs = hidden_tensors(completed)
    inputs = [sig for sig in inputs if sig.name not in hidden_inputs]
    outputs = [sig for sig in outputs if sig.name not in hidden_outputs]
    for sig in (*inputs, *outputs):
        if sig.datatype == "TYPE_INVALID":
            raise where.error(f"tensor '{sig.name}' is not a tensor of a supported element type")
    if completed.max_batch_size < 0:
        raise where.error(f"max_batch_size must be >= 0, got {completed.max_batch_size}")

    # Triton's onnxruntime backend: a config that names no tensors, for a graph whose every
    # input and output has a dynamic first dim, gets default-max-batch-size and, when that is
    # above 1 and no scheduler is given, dynamic batching.
    if (
        completed.max_batch_size == 0
        and not completed.input
        and not completed.output
        and inputs
        and all(sig.dims and sig.dims[0] == -1 for sig in (*inputs, *outputs))
    ):
        completed.max_batch_size = default_max_batch_size
        scheduled = completed.HasField("dynamic_batching") or completed.HasField("sequence_batching")
        if default_max_batch_size > 1 and not scheduled:
            completed.dynamic_batching.SetInParent()

    if completed.max_batch_size > 0:
        for sig in (*inputs, *outputs):
            if not sig.dims or sig.dims[0] != -1:
                raise where.error(
                    f"max_batch_size {completed.max_batch_size} needs a dynamic first dimension on every "
                    f"model input and output, but tensor '{sig.name}' has shape {list(sig.dims)}; "
                    "set max_batch_size: 0 or export the model with a dynamic batch dimension"
                )

    _complete_tensors(completed.input, inputs, "input", completed.max_batch_size, where, model_name)
    _complete_tensors(completed.output, outputs, "output", completed.max_batch_size, where, model_name)
    _complete_dynamic_batching(completed, where)
    _complete_sequence_batching(completed, where)
    _complete_instance_groups(completed)
    show_placed_kinds(completed, placements)
    _complete_version_policy(completed, where)
    _complete_optimization(completed)
    if not completed.default_model_filename:
        completed.default_model_filename = _default_filename(completed)
    return completed


def normalize(config: ModelConfig, placements: Sequence[Placement]) -> None:
    """Fill in `config` what Triton's NormalizeModelConfig fills before the backend sees it (what a
    python model's auto_complete_config is given): the version policy, the pinned-memory
    optimization and the instance groups (named, counted, KIND_AUTO shown as placed)."""
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    _complete_optimization(config)
    _complete_instance_groups(config)
    show_placed_kinds(config, placements)


def _complete_optimization(config: ModelConfig) -> None:
    # Triton turns pinned memory on unless the config says otherwise; the rest stay at their defaults.
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _default_filename(config: ModelConfig) -> str:
    return PYTHON_MODEL_FILENAME if config.backend == PYTHON_BACKEND else DEFAULT_MODEL_FILENAME


def _complete_identity(config: ModelConfig, model_name: str, where: _Where) -> None:
    if config.name and config.name != model_name:
        raise where.error(
            f"the configuration's name '{config.name}' does not match the model folder name '{model_name}'"
        )
    config.name = model_name
    if config.backend == PYTHON_BACKEND and not config.platform:
        return  # Triton reports a python model with its backend only
    if config.backend not in ("", ONNX_BACKEND) or config.platform not in ("", ONNX_PLATFORM):
        given = (("backend", config.backend), ("platform", config.platform))
        got = ", ".join(f"{field} '{value}'" for field, value in given if value)
        raise where.error(
            f"only ONNX Runtime models (backend '{ONNX_BACKEND}', platform '{ONNX_PLATFORM}') and python models "
            f"(backend '{PYTHON_BACKEND}') are served; got {got}"
        )
    # Triton's onnxruntime backend reports both.
    config.backend = ONNX_BACKEND
    config.platform = ONNX_PLATFORM


def _complete_tensors(
    declared: Any,  # RepeatedCompositeFieldContainer[ModelInput] or [ModelOutput]
    graph: Sequence[TensorSignature],
    kind: str,
    max_batch_size: int,
    where: _Where,
    model_name: str,
) -> None:
    by_name = {sig.name: sig for sig in graph}
    seen: set[str] = set()
    for tensor in declared:
        if tensor.name in seen:
            raise where.error(f"{kind} '{tensor.name}' is declared more than once")
        seen.add(tensor.name)
        sig = by_name.get(tensor.name)
        if sig is None:
            raise where.error(f"{kind} '{tensor.name}' is not a model {kind}; the model's {kind}s are {_names(graph)}")
        if tensor.data_type == model_config_pb2.TYPE_INVALID:
            tensor.data_type = model_config_pb2.DataType.Value(sig.datatype)
        declared_type = model_config_pb2.DataType.Name(tensor.data_type)
        if declared_type != sig.datatype:
            raise where.error(f"{kind} '{tensor.name}' has data_type {declared_type} but the model's is {sig.datatype}")
        model_dims = list(tensor.dims)
        if tensor.HasField("reshape"):
            # The client sees `dims`, the model the reshape: the graph is checked against the reshape.
            model_dims = list(tensor.reshape.shape)
            problem = reshape_problem(model_dims, list(tensor.dims), max_batch_size)
            if problem:
                raise where.error(f"model '{model_name}': model {kind} '{tensor.name}' {problem}")
        field = "reshape" if tensor.HasField("reshape") else "dims"
        _check_dims(tensor.name, kind, model_dims, sig.dims, max_batch_size, where, field)
    # Tensors the config leaves out are filled from the graph, in graph order.
    for sig in graph:
        if sig.name not in seen:
            tensor = declared.add()
            tensor.name = sig.name
            tensor.data_type = model_config_pb2.DataType.Value(sig.datatype)
            tensor.dims.extend(sig.dims[1:] if max_batch_size > 0 else sig.dims)


def _check_dims(
    name: str,
    kind: str,
    dims: list[int],
    graph_dims: tuple[int, ...],
    max_batch_size: int,
    where: _Where,
    field: str = "dims",
) -> None:
    if any(d < -1 for d in dims):
        raise where.error(f"{kind} '{name}' has dims {dims}; each dimension must be >= -1")
    full = [-1, *dims] if max_batch_size > 0 else dims
    shown = f"{field} {dims}" + (" plus the batch dimension" if max_batch_size > 0 else "")
    if len(full) != len(graph_dims):
        hint = ""
        if max_batch_size == 0 and len(graph_dims) == len(full) + 1 and graph_dims[0] == -1:
            hint = "; the model has a leading batch dimension: set max_batch_size > 0 or list it in dims"
        raise where.error(
            f"{kind} '{name}' has {shown} (rank {len(full)}) but the model's shape is "
            f"{list(graph_dims)} (rank {len(graph_dims)}){hint}"
        )
    # -1 in the config is "variable" and a fixed config dim may narrow a dynamic graph dim; only
    # two different fixed values contradict each other.
    for config_dim, graph_dim in zip(full, graph_dims):
        if config_dim != -1 and graph_dim != -1 and config_dim != graph_dim:
            raise where.error(f"{kind} '{name}' has {shown} but the model's shape is {list(graph_dims)}")


def reshape_problem(reshape: list[int], dims: list[int], max_batch_size: int) -> str:
    """What is wrong with a tensor's `reshape { shape }` for its `dims`, in Triton's words
    (ValidateIOShape) followed by both shapes; "" when it fits.

    Both must hold the same number of elements; with variable (-1) dimensions, the same number of
    them, and the fixed runs between them must hold the same counts ([2,4,-1,6] fits [8,-1,1,6]).
    An empty reshape holds one element.
    """
    shapes = f"dims {_fmt(dims)}, reshape {_fmt(reshape)}"
    if not reshape and max_batch_size == 0:
        return f"cannot have empty reshape for non-batching model as scalar tensors are not supported ({shapes})"
    if any(d < 1 and d != -1 for d in reshape):
        return f"reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension ({shapes})"
    dims_runs, reshape_runs = _runs(dims), _runs(reshape)
    if dims_runs == reshape_runs:
        return ""
    if len(dims_runs) > 1 and len(reshape_runs) > 1 and len(dims_runs) != len(reshape_runs):
        return f"has different number of variable-size dimensions for dims and reshape ({shapes})"
    if len(dims_runs) == len(reshape_runs) == 1:
        return (
            f"has different size for dims and reshape: dims {_fmt(dims)} hold {dims_runs[0]} elements, "
            f"reshape {_fmt(reshape)} holds {reshape_runs[0]}"
        )
    return f"has different size for dims and reshape ({shapes})"


def _runs(shape: list[int]) -> list[int]:
    """The element counts of the fixed runs between variable (-1) dimensions."""
    runs, current = [], 1
    for dim in shape:
        if dim == -1:
            runs.append(current)
            current = 1
        else:
            current *= dim
    return [*runs, current]


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _complete_dynamic_batching(config: ModelConfig, where: _Where) -> None:
    if not config.HasField("dynamic_batching"):
        return
    batching = config.dynamic_batching
    for size in batching.preferred_batch_size:
        if size <= 0 or size > config.max_batch_size:
            raise where.error(
                f"dynamic_batching preferred_batch_size {size} must be between 1 and "
                f"max_batch_size ({config.max_batch_size})"
            )
    # Triton fills the preferred size with max_batch_size; it batches the same way either way.
    if not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)


def _check_controls(config: ModelConfig, graph: Sequence[TensorSignature], where: _Where) -> None:
    """Triton's onnxruntime backend's checks of each control input against the graph, in its words."""
    if not config.HasField("sequence_batching"):
        return
    by_name = {sig.name: sig for sig in graph}
    for control_input in config.sequence_batching.control_input:
        name = control_input.name
        for control in control_input.control:
            sig = by_name.get(name)
            if sig is None:
                raise where.error(
                    f"configuration specified sequence control '{name}', but model does not provide that input"
                )
            dims = list(sig.dims[1:] if config.max_batch_size > 0 else sig.dims)
            if dims != [1]:
                raise where.error(
                    f"unable to load model '{config.name}', sequence control '{name}' in model has dims "
                    f"[{','.join(map(str, dims))}] but dims [1] is expected"
                )
            if control.int32_false_true:
                expected = "TYPE_INT32"
            elif control.fp32_false_true:
                expected = "TYPE_FP32"
            elif control.bool_false_true:
                expected = "TYPE_BOOL"
            else:
                expected = model_config_pb2.DataType.Name(control.data_type)
            if sig.datatype != expected:
                raise where.error(
                    f"unable to load model '{config.name}', sequence control '{name}', the model expects data-type "
                    f"{sig.datatype} but the model configuration specifies data-type {expected}"
                )


def _check_states(
    config: ModelConfig, inputs: Sequence[TensorSignature], outputs: Sequence[TensorSignature], where: _Where
) -> None:
    """Each implicit state must be a graph input and a graph output of its data type."""
    if not config.HasField("sequence_batching"):
        return
    for state in config.sequence_batching.state:
        datatype = model_config_pb2.DataType.Name(state.data_type)
        for kind, name, graph in (("input", state.input_name, inputs), ("output", state.output_name, outputs)):
            sig = next((g for g in graph if g.name == name), None)
            if sig is None:
                raise where.error(
                    f"sequence_batching state {kind} '{name}' is not a model {kind}; the model's {kind}s are "
                    f"{_names(graph)}"
                )
            if sig.datatype != datatype:
                raise where.error(
                    f"sequence_batching state {kind} '{name}' has data_type {datatype} but the model's is {sig.datatype}"
                )


def _complete_sequence_batching(config: ModelConfig, where: _Where) -> None:
    """Triton's checks of the controls and states, at load, and its defaults for what is left out."""
    if not config.HasField("sequence_batching"):
        return
    try:
        SequencePolicy.from_config(config)
    except ModelConfigError as exc:
        raise where.error(str(exc)) from None
    batching = config.sequence_batching
    if not batching.max_sequence_idle_microseconds:
        batching.max_sequence_idle_microseconds = DEFAULT_IDLE_US
    if batching.HasField("oldest") and not batching.oldest.preferred_batch_size and config.max_batch_size > 0:
        batching.oldest.preferred_batch_size.append(config.max_batch_size)


def _complete_instance_groups(config: ModelConfig) -> None:
    # Simpler than Triton: one instance per group when count is unset or below 1 (Triton's
    # onnxruntime backend gives KIND_CPU groups without a count 2). KIND_AUTO is resolved where the
    # devices are known (`placement.show_placed_kinds`).
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_AUTO
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1


def _complete_version_policy(config: ModelConfig, where: _Where) -> None:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice is None:
        policy.latest.num_versions = 1
    elif choice == "latest" and policy.latest.num_versions < 1:
        raise where.error("version_policy latest must set num_versions >= 1")
    elif choice == "specific" and not policy.specific.versions:
        raise where.error("version_policy specific must list at least one version")


def _names(graph: Iterable[TensorSignature]) -> str:
    return ", ".join(f"'{sig.name}'" for sig in graph) or "(none)"


# --------------------------------------------------------------------------------------------
# Versions and files


def available_versions(model_dir: Path) -> list[int]:
    """The numeric version folders under `model_dir`, ascending; other entries are ignored."""
    if not model_dir.is_dir():
        return []
    return sorted(int(entry.name) for entry in model_dir.iterdir() if _VERSION_DIR.match(entry.name) and entry.is_dir())


def select_versions(config: ModelConfig, available: Sequence[int]) -> list[int]:
    """The versions `config.version_policy` serves out of `available`, ascending.

    latest {num_versions: n} (the default, n = 1) takes the n highest, all {} takes all, and
    specific {versions} takes those listed that exist. An empty result means the model cannot
    load; Triton then says "at least one version must be available under the version policy".
    """
    versions = sorted(set(available))
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return versions
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in versions if v in wanted]
    count = policy.latest.num_versions if choice == "latest" else 1
    return versions[-max(count, 1) :] if versions else []


def model_file(model_dir: Path, version: int, config: ModelConfig) -> Path:
    """`<model_dir>/<version>/<default_model_filename or model.onnx>`.

    The file name may come from a client (the load API), so it must stay inside the version
    folder: absolute names and '..' are refused.
    """
    name = config.default_model_filename or _default_filename(config)
    relative = PurePosixPath(name)
    if relative.is_absolute() or "\\" in name or any(part == ".." for part in relative.parts):
        raise ModelConfigError(
            f"{model_dir / CONFIG_FILENAME}: model '{config.name}': default_model_filename '{name}' must be a path "
            "inside the version folder"
        )
    return model_dir / str(version) / name
