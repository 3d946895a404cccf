"""Request inputs, with perf_analyzer's semantics (`--input-data`, `-b`, `--shape`, `--string-length`).

`build_requests` turns a model's metadata and config (the HTTP JSON shapes) into the requests a run
sends round-robin (`build_sequence_streams`, for a sequence model, into streams of steps):

- `random` (the default) and `zero`: one request. As perf_analyzer does, one batch-1 row is
  generated per input and repeated to fill the batch. Random floats are standard normal, integers
  lie in [0, 100) (safe as indices and in every integer type), BOOL is uniform, and BYTES elements
  are random alphanumeric strings of `--string-length` characters. `zero` gives zeros, False, and
  BYTES elements of `--string-length` "0" characters. `--string-data S` makes every BYTES element S.
- a JSON file in perf_analyzer's schema: `{"data": [step, ...]}`, each step a batch-1 request
  mapping input names to a flat row-major list, `{"b64": ...}` (little-endian bytes; BYTES
  elements with their 4-byte length prefix), or `{"content": list | {"b64": ...}, "shape": [...]}`
  (the shape, without the batch dimension, overrides `--shape` for that step). There is one request
  per step: request `s` holds the rows of steps `s, s+1, ..., s+b-1` (mod the step count), which is
  how perf_analyzer fills a batch (infer_data_manager.cc `UpdateInputs`). For a sequence model
  "data" may instead hold streams, `{"data": [[step, ...], [step, ...]]}`: each new sequence takes
  a stream, its steps in order (perfkit.load.sequences).
- a directory, perf_analyzer's older form (its `--data-directory`): one file per input, named as the
  input, holding one batch-1 row: raw row-major bytes (little-endian), or for a BYTES input one
  string a line. It is one step, as a data file of one step would be.

Shapes exclude the batch dimension throughout, as `--shape` does: with `max_batch_size > 0` the
model's first dimension is the batch, and requests carry `-b` there. Where the server gives no model
config (no model configuration extension: MLServer, KServe), a leading -1 on every input's metadata
shape is the batch dimension (`batch_dimension`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfkit.errors import PerfkitError, TargetError
from v2kit import codec as v2

__all__ = [
    "batch_dimension",
    "build_requests",
    "build_sequence_streams",
    "has_streams",
    "parse_request_parameter",
    "parse_shape_flag",
    "parse_shape_flags",
]

_ALPHANUMERIC = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", dtype=np.uint8)
_INT_HIGH = 100  # random integers lie in [0, _INT_HIGH)


@dataclass(frozen=True, slots=True)
class _Input:
    name: str
    datatype: str
    dims: list[int]  # without the batch dimension; -1 where variable
    optional: bool


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def parse_shape_flag(text: str) -> tuple[str, list[int]]:
    """`--shape NAME:D1,D2,...` → (NAME, [D1, D2, ...]). The name may itself hold colons."""
    name, colon, dims = text.rpartition(":")
    if not colon or not name:
        raise PerfkitError(f"--shape expects NAME:D1,D2,... (e.g. INPUT0:3,224,224), got '{text}'")
    shape = []
    for part in dims.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            value = 0
        if value <= 0:
            raise PerfkitError(f"--shape {text}: dimension '{part}' is not a positive integer")
        shape.append(value)
    return name, shape


# Parameters with a meaning of their own: the sequence flags set the first three.
_RESERVED_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "binary_data_output")


def parse_request_parameter(text: str) -> tuple[str, bool | int | str]:
    """`--request-parameter NAME:VALUE:TYPE` (TYPE bool, int or string, any case) → (NAME, value)."""
    name, _, rest = text.partition(":")
    value, colon, kind = rest.rpartition(":")
    kind = kind.lower()
    if not name or not colon:
        raise PerfkitError(f"--request-parameter expects NAME:VALUE:TYPE (e.g. max_tokens:256:int), got '{text}'")
    if name in _RESERVED_PARAMETERS:
        fix = "use the sequence flags (--sequence-length, ...)" if name.startswith("sequence") else "drop it"
        raise PerfkitError(f"--request-parameter {name}: perfkit sets '{name}' itself; {fix}")
    if kind == "string":
        return name, value
    if kind == "int":
        try:
            return name, int(value)
        except ValueError:
            raise PerfkitError(f"--request-parameter {text}: '{value}' is not an integer") from None
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise PerfkitError(f"--request-parameter {text}: a bool is true or false, got '{value}'")
        return name, value.lower() == "true"
    raise PerfkitError(f"--request-parameter {text}: TYPE must be bool, int or string, got '{kind}'")


def parse_shape_flags(values: Sequence[str]) -> dict[str, list[int]]:
    """Every `--shape` of a command line; naming one input twice is an error."""
    shapes: dict[str, list[int]] = {}
    for text in values:
        name, shape = parse_shape_flag(text)
        if name in shapes:
            raise PerfkitError(f"--shape names input '{name}' twice; pass one --shape per input")
        shapes[name] = shape
    return shapes


def build_requests(
    metadata: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    *,
    model: str,
    version: str = "",
    batch_size: int = 1,
    shapes: Mapping[str, list[int]] = {},  # read only
    input_data: str = "random",
    seed: int = 0,
    string_length: int = 128,
    string_data: str | None = None,
    outputs: Sequence[str] = (),
) -> list[v2.InferRequest]:
    """The requests to send, round-robin, for `input_data` ("random", "zero" or a JSON file).
    `config` None: the server gives none, and the metadata's shapes say where the batch goes."""
    inputs, requested, batch = _prelude(metadata, config, model, batch_size, shapes, string_length, outputs)
    if input_data in ("random", "zero"):
        return [_generated_request(inputs, requested, batch, model, version, shapes, input_data, seed,
                                   string_length, string_data)]  # fmt: skip

    steps = _load_steps(input_data, inputs, shapes)
    requests = []
    for s in range(len(steps)):
        rows = [steps[(s + i) % len(steps)] for i in range(batch or 1)]
        tensors = []
        for spec in inputs:
            present = [row[spec.name] for row in rows if spec.name in row]
            if not present:
                continue  # an optional input no step of this batch gives
            if len(present) != len(rows):
                raise PerfkitError(
                    f"--input-data {input_data}: optional input '{spec.name}' is in some of data[{s}] to "
                    f"data[{(s + len(rows) - 1) % len(steps)}] but not all; with -b {batch_size} every step "
                    "of a batch must give the same inputs"
                )
            shapes_seen = {tuple(a.shape) for a in present}
            if len(shapes_seen) > 1:
                a, b = sorted(shapes_seen)[:2]
                raise PerfkitError(
                    f"--input-data {input_data}: cannot batch input '{spec.name}' of data[{s}] to "
                    f"data[{(s + len(rows) - 1) % len(steps)}] together: shapes {_fmt(a)} and {_fmt(b)} differ; "
                    "give every step the same shape or use -b 1"
                )
            tensors.append(_batched(spec, present, batch))
        requests.append(v2.InferRequest(model, version, inputs=tensors, outputs=requested))
    return requests


def build_sequence_streams(
    metadata: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    model: str,
    version: str = "",
    shapes: Mapping[str, list[int]] = {},  # read only
    input_data: str = "random",
    seed: int = 0,
    string_length: int = 128,
    string_data: str | None = None,
    outputs: Sequence[str] = (),
) -> tuple[list[list[v2.InferRequest]], bool]:
    """A sequence model's batch-1 requests as streams of steps, and whether they came from a data
    file (perfkit.load.sequences): generated data is one stream of one step."""
    inputs, requested, batch = _prelude(metadata, config, model, 1, shapes, string_length, outputs)
    if input_data in ("random", "zero"):
        request = _generated_request(inputs, requested, batch, model, version, shapes, input_data, seed,
                                     string_length, string_data)  # fmt: skip
        return [[request]], False
    streams = []
    for stream in _load_streams(input_data, inputs, shapes):
        steps = []
        for row in stream:
            tensors = [_batched(spec, [row[spec.name]], batch) for spec in inputs if spec.name in row]
            steps.append(v2.InferRequest(model, version, inputs=tensors, outputs=requested))
        streams.append(steps)
    return streams, True


def _prelude(
    metadata: Mapping[str, Any],
    config: Mapping[str, Any] | None,
    model: str,
    batch_size: int,
    shapes: Mapping[str, list[int]],
    string_length: int,
    outputs: Sequence[str],
) -> tuple[list[_Input], list[v2.RequestedOutput] | None, int | None]:
    """The model's inputs, the requested outputs and the batch dimension, once the flags are checked.
    Without a config (None: the server has no model configuration extension) the metadata's shapes
    say it: a leading -1 on every input is the batch dimension, of a size the server does not tell."""
    if batch_size < 1:
        raise PerfkitError(f"-b must be at least 1, got {batch_size}")
    if config is None:
        batched = batch_dimension(metadata)
        if batch_size > 1 and not batched:
            raise PerfkitError(
                f"model '{model}' takes no batch dimension (its metadata shapes have no leading -1, and the server "
                "gives no model configuration to say otherwise); -b must be 1"
            )
        config = {"max_batch_size": batch_size if batched else 0}
    max_batch = config.get("max_batch_size", 0)
    if not isinstance(max_batch, int) or max_batch < 0:
        raise TargetError(f"model '{model}' config has an invalid max_batch_size {max_batch!r}")
    if max_batch == 0 and batch_size > 1:
        raise PerfkitError(f"model '{model}' does not support batching (max_batch_size 0); -b must be 1")
    if batch_size > max_batch > 0:
        raise PerfkitError(
            f"-b {batch_size} exceeds the max_batch_size {max_batch} of model '{model}'; pass -b {max_batch} or less"
        )
    if string_length < 0:
        raise PerfkitError(f"--string-length must be >= 0, got {string_length}")
    inputs = _model_inputs(metadata, config, model, batched=max_batch > 0)
    unknown = sorted(set(shapes) - {i.name for i in inputs})
    if unknown:
        names = ", ".join(i.name for i in inputs)
        raise PerfkitError(f"--shape names input '{unknown[0]}', but model '{model}' has inputs {names}")
    for spec in inputs:
        if spec.name in shapes:
            _check_shape(spec, shapes[spec.name], f"--shape {spec.name}:{','.join(map(str, shapes[spec.name]))}")
    requested = _requested_outputs(metadata, model, outputs)
    return inputs, requested, (batch_size if max_batch > 0 else None)


def _generated_request(
    inputs: list[_Input],
    requested: list[v2.RequestedOutput] | None,
    batch: int | None,
    model: str,
    version: str,
    shapes: Mapping[str, list[int]],
    input_data: str,
    seed: int,
    string_length: int,
    string_data: str | None,
) -> v2.InferRequest:
    """`random` or `zero` data: one batch-1 row per input, repeated to fill the batch."""
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in inputs:
        shape = _fixed_shape(spec, shapes)
        if spec.datatype == "BYTES" and string_data is not None:
            row = np.empty(math.prod(shape), dtype=object)
            row[:] = [string_data.encode()] * len(row)
            row = row.reshape(shape)
        else:
            row = _generate(spec.datatype, shape, rng, input_data == "zero", string_length)
        tensors.append(_batched(spec, [row] * (batch or 1), batch))
    return v2.InferRequest(model, version, inputs=tensors, outputs=requested)


# --- the model's inputs ---------------------------------------------------------------------------


def batch_dimension(metadata: Mapping[str, Any]) -> bool:
    """Whether the metadata's shapes lead with a batch dimension: -1 first on every input. What
    tells it where the server has no model configuration (KServe's and MLServer's [-1, 16])."""
    entries = metadata.get("inputs")
    shapes = [e.get("shape") for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []
    return bool(shapes) and all(isinstance(shape, list) and shape[:1] == [-1] for shape in shapes)


def _model_inputs(metadata: Mapping[str, Any], config: Mapping[str, Any], model: str, batched: bool) -> list[_Input]:
    entries = metadata.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise TargetError(f"model '{model}' metadata lists no inputs")
    optional = {
        c.get("name"): bool(c.get("optional", False)) for c in config.get("input") or () if isinstance(c, Mapping)
    }
    inputs = []
    for entry in entries:
        name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
        if not isinstance(name, str) or not isinstance(shape, list) or datatype not in v2.DATATYPES:
            raise TargetError(f"model '{model}' metadata has a malformed input: {entry!r}")
        if batched and not shape:
            raise TargetError(f"model '{model}' input '{name}' has no batch dimension although max_batch_size > 0")
        dims = [int(d) for d in (shape[1:] if batched else shape)]
        inputs.append(_Input(name, datatype, dims, optional.get(name, False)))
    return inputs


def _requested_outputs(
    metadata: Mapping[str, Any], model: str, names: Sequence[str]
) -> list[v2.RequestedOutput] | None:
    if not names:
        return None
    known = [str(o.get("name")) for o in metadata.get("outputs") or () if isinstance(o, Mapping)]
    for name in names:
        if name not in known:
            raise PerfkitError(
                f"requested output '{name}' is not an output of model '{model}' (outputs: {', '.join(known)})"
            )
    return [v2.RequestedOutput(name) for name in dict.fromkeys(names)]


def _check_shape(spec: _Input, shape: Sequence[int], where: str) -> None:
    """`shape` (no batch dimension) must have the model's rank and agree on every fixed dimension."""
    if len(shape) != len(spec.dims) or any(m != -1 and m != d for m, d in zip(spec.dims, shape)):
        raise PerfkitError(
            f"{where}: shape {_fmt(shape)} does not fit input '{spec.name}' dimensions {_fmt(spec.dims)}"
        )


def _fixed_shape(spec: _Input, shapes: Mapping[str, list[int]], hint: str = "") -> list[int]:
    if spec.name in shapes:
        return list(shapes[spec.name])
    if -1 in spec.dims:
        example = ",".join("D" + str(i + 1) for i in range(len(spec.dims)))
        raise PerfkitError(
            f"input '{spec.name}' has variable dimensions {_fmt(spec.dims)}; pass --shape {spec.name}:{example}{hint}"
        )
    return list(spec.dims)


def _batched(spec: _Input, rows: list[np.ndarray], batch: int | None) -> v2.InferTensor:
    data = rows[0] if batch is None else np.stack(rows)
    return v2.InferTensor(spec.name, spec.datatype, list(data.shape), data)


# --- generated data -------------------------------------------------------------------------------


def _generate(datatype: str, shape: list[int], rng: np.random.Generator, zero: bool, length: int) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        if zero:
            chars = np.full(count * length, ord("0"), dtype=np.uint8)
        else:
            chars = _ALPHANUMERIC[rng.integers(0, len(_ALPHANUMERIC), size=count * length)]
        flat = chars.tobytes()
        data = np.empty(count, dtype=object)
        data[:] = [flat[i * length : (i + 1) * length] for i in range(count)]
        return data.reshape(shape)
    dtype = v2.datatype_to_numpy(datatype)
    if zero:
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "f":
        return rng.standard_normal(size=shape).astype(dtype)
    return rng.integers(0, _INT_HIGH, size=shape).astype(dtype)


# --- data files -----------------------------------------------------------------------------------


def _read_data(path_text: str) -> list[Any]:
    """The "data" list of a perf_analyzer JSON data file."""
    flag = f"--input-data {path_text}"
    path = Path(path_text)
    if not path.is_file():
        raise PerfkitError(f"{flag}: no such file; expected random, zero, a JSON data file or a data directory")
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PerfkitError(f"{flag}: cannot read a JSON data file: {exc}") from None
    steps = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or not steps:
        raise PerfkitError(
            f'{flag}: expected a JSON object with a non-empty "data" list: {{"data": [{{"INPUT0": [...]}}]}}'
        )
    return steps


def has_streams(input_data: str) -> bool:
    """Whether `--input-data` is a JSON file whose "data" holds sequence streams (lists of steps)."""
    if input_data in ("random", "zero") or Path(input_data).is_dir():
        return False
    return any(isinstance(step, list) for step in _read_data(input_data))


def _load_steps(path_text: str, inputs: list[_Input], shapes: Mapping[str, list[int]]) -> list[dict[str, np.ndarray]]:
    """Each step of a perf_analyzer JSON data file as {input: batch-1 row, shape without batch}."""
    flag = f"--input-data {path_text}"
    if Path(path_text).is_dir():
        return [_directory_row(Path(path_text), inputs, shapes)]
    rows = []
    for s, step in enumerate(_read_data(path_text)):
        if isinstance(step, list):
            raise PerfkitError(
                f"{flag}: data[{s}] is a list: sequence streams are for sequence models; pass --sequence-length "
                "to send them as sequences, or give one object per step"
            )
        rows.append(_step_row(step, inputs, shapes, f"{flag}: data[{s}]"))
    return rows


def _load_streams(
    path_text: str, inputs: list[_Input], shapes: Mapping[str, list[int]]
) -> list[list[dict[str, np.ndarray]]]:
    """The streams of a data file: "data" as a list of lists of steps (a plain list of steps is one
    stream, as perf_analyzer reads it)."""
    flag = f"--input-data {path_text}"
    if Path(path_text).is_dir():
        return [[_directory_row(Path(path_text), inputs, shapes)]]
    data = _read_data(path_text)
    if not any(isinstance(step, list) for step in data):
        return [[_step_row(step, inputs, shapes, f"{flag}: data[{s}]") for s, step in enumerate(data)]]
    streams = []
    for k, stream in enumerate(data):
        if not isinstance(stream, list) or not stream:
            raise PerfkitError(f"{flag}: data[{k}] must be a non-empty list of steps, as every other stream is")
        streams.append([_step_row(step, inputs, shapes, f"{flag}: data[{k}][{s}]") for s, step in enumerate(stream)])
    return streams


def _directory_row(directory: Path, inputs: list[_Input], shapes: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    """The one step of a data directory: each input's file, named as the input, read as perf_analyzer
    reads it (raw bytes; a BYTES input's strings one a line)."""
    flag = f"--input-data {directory}"
    step: dict[str, Any] = {}
    for spec in inputs:
        path = directory / spec.name
        if not path.is_file():
            if spec.optional:
                continue
            raise PerfkitError(f"{flag}: no file '{spec.name}' for input '{spec.name}' (one file per input, named as it)")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise PerfkitError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
        if spec.datatype == "BYTES":
            step[spec.name] = raw.decode("utf-8", "surrogateescape").splitlines()
        else:
            step[spec.name] = {"b64": base64.b64encode(raw).decode("ascii")}
    return _step_row(step, inputs, shapes, flag)


def _step_row(step: Any, inputs: list[_Input], shapes: Mapping[str, list[int]], where: str) -> dict[str, np.ndarray]:
    by_name = {spec.name: spec for spec in inputs}
    if not isinstance(step, dict):
        raise PerfkitError(f"{where} must be a JSON object mapping input names to data")
    extra = sorted(set(step) - set(by_name))
    if extra:
        raise PerfkitError(f"{where} names '{extra[0]}', which is not an input (inputs: {', '.join(by_name)})")
    row = {}
    for spec in inputs:
        if spec.name not in step:
            if spec.optional:
                continue
            raise PerfkitError(f"{where} has no data for input '{spec.name}'")
        row[spec.name] = _step_tensor(step[spec.name], spec, shapes, where)
    return row


def _step_tensor(value: Any, spec: _Input, shapes: Mapping[str, list[int]], step_where: str) -> np.ndarray:
    where = f"{step_where}: input '{spec.name}'"
    shape: list[int] | None = None
    if isinstance(value, dict) and "content" in value:
        shape, value = value.get("shape"), value["content"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise PerfkitError(f'{where}: "shape" must be a list of integers next to "content"')
        _check_shape(spec, shape, where)
    if shape is None:
        shape = _fixed_shape(spec, shapes, f' or give {{"content": [...], "shape": [...]}} in the data file ({where})')
    try:
        if isinstance(value, dict) and "b64" in value:
            if not isinstance(value["b64"], str):
                raise PerfkitError(f'{where}: "b64" must be a base64 string')
            raw = base64.b64decode(value["b64"], validate=True)
            return v2.tensor_from_raw(raw, spec.datatype, shape, spec.name)
        if not isinstance(value, list):
            raise PerfkitError(
                f'{where}: expected a list of values, {{"b64": ...}} or {{"content": ..., "shape": ...}}'
            )
        if spec.datatype == "FP16":  # JSON has no FP16 on the wire, but a data file may hold FP16 values
            return v2.tensor_from_json(value, "FP32", shape, spec.name).astype(np.float16)
        return v2.tensor_from_json(value, spec.datatype, shape, spec.name)
    except binascii.Error as exc:
        raise PerfkitError(f"{where}: invalid base64: {exc}") from None
    except v2.CodecError as exc:  # its message names the input
        raise PerfkitError(f"{step_where}: {exc}") from None
