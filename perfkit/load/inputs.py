"""Request inputs, with perf_analyzer's semantics (`--input-data`, `-b`, `--shape`, `--string-length`).

`build_requests` turns a model's metadata and config (the HTTP JSON shapes) into the requests a run
sends round-robin:

- `random` (the default) and `zero`: one request. As perf_analyzer does, one batch-1 row is
  generated per input and repeated to fill the batch. Random floats are standard normal, integers
  lie in [0, 100) (safe as indices and in every integer type), BOOL is uniform, and BYTES elements
  are random alphanumeric strings of `--string-length` characters. `zero` gives zeros, False, and
  BYTES elements of `--string-length` "0" characters.
- a JSON file in perf_analyzer's schema: `{"data": [step, ...]}`, each step a batch-1 request
  mapping input names to a flat row-major list, `{"b64": ...}` (little-endian bytes; BYTES
  elements with their 4-byte length prefix), or `{"content": list | {"b64": ...}, "shape": [...]}`
  (the shape, without the batch dimension, overrides `--shape` for that step). There is one request
  per step: request `s` holds the rows of steps `s, s+1, ..., s+b-1` (mod the step count), which is
  how perf_analyzer fills a batch (infer_data_manager.cc `UpdateInputs`).

Shapes exclude the batch dimension throughout, as `--shape` does: with `max_batch_size > 0` the
model's first dimension is the batch, and requests carry `-b` there.
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

__all__ = ["build_requests", "parse_shape_flag", "parse_shape_flags"]

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
    config: Mapping[str, Any],
    *,
    model: str,
    version: str = "",
    batch_size: int = 1,
    shapes: Mapping[str, list[int]] = {},  # read only
    input_data: str = "random",
    seed: int = 0,
    string_length: int = 128,
    outputs: Sequence[str] = (),
) -> list[v2.InferRequest]:
    """The requests to send, round-robin, for `input_data` ("random", "zero" or a JSON file)."""
    max_batch = config.get("max_batch_size", 0)
    if not isinstance(max_batch, int) or max_batch < 0:
        raise TargetError(f"model '{model}' config has an invalid max_batch_size {max_batch!r}")
    if batch_size < 1:
        raise PerfkitError(f"-b must be at least 1, got {batch_size}")
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
    batch = batch_size if max_batch > 0 else None

    if input_data in ("random", "zero"):
        rng = np.random.default_rng(seed)
        tensors = []
        for spec in inputs:
            shape = _fixed_shape(spec, shapes)
            row = _generate(spec.datatype, shape, rng, input_data == "zero", string_length)
            tensors.append(_batched(spec, [row] * (batch or 1), batch))
        return [v2.InferRequest(model, version, inputs=tensors, outputs=requested)]

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


# --- the model's inputs ---------------------------------------------------------------------------


def _model_inputs(metadata: Mapping[str, Any], config: Mapping[str, Any], model: str, batched: bool) -> list[_Input]:
    entries = metadata.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise TargetError(f"model '{model}' metadata lists no inputs")
    optional = {
        c.get("name"): bool(c.get("optional", False)) for c in config.get("input", []) if isinstance(c, Mapping)
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
    known = [str(o.get("name")) for o in metadata.get("outputs", []) if isinstance(o, Mapping)]
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


def _load_steps(path_text: str, inputs: list[_Input], shapes: Mapping[str, list[int]]) -> list[dict[str, np.ndarray]]:
    """Each step of a perf_analyzer JSON data file as {input: batch-1 row, shape without batch}."""
    flag = f"--input-data {path_text}"
    path = Path(path_text)
    if path.is_dir():
        raise PerfkitError(f"{flag}: directories of raw input files are not supported; give a JSON data file")
    if not path.is_file():
        raise PerfkitError(f"{flag}: no such file; expected random, zero, or a JSON data file")
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PerfkitError(f"{flag}: cannot read a JSON data file: {exc}") from None
    steps = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(steps, list) or not steps:
        raise PerfkitError(
            f'{flag}: expected a JSON object with a non-empty "data" list: {{"data": [{{"INPUT0": [...]}}]}}'
        )
    by_name = {spec.name: spec for spec in inputs}
    rows = []
    for s, step in enumerate(steps):
        where = f"{flag}: data[{s}]"
        if isinstance(step, list):
            raise PerfkitError(f"{where} is a list: sequence streams (lists of steps) are not supported")
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
        rows.append(row)
    return rows


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
