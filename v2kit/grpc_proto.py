"""KServe v2 over gRPC: tritonclient's generated `inference` protos ↔ the codec's dataclasses, and
any of its protos (ModelConfig included) as the JSON Triton's HTTP API shows.

Sans-I/O like `v2kit.codec`: ModelInferRequest/Response messages in, dataclasses out, and back.
Decoders raise only `CodecError` (an INVALID_ARGUMENT status for a server).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import service_pb2

from v2kit.codec import CodecError, InferRequest, InferResponse, InferTensor, RequestedOutput, shared_memory_ref
from v2kit.tensors import (
    check_count,
    check_range,
    datatype_to_numpy,
    element_count,
    for_model,
    format_shape,
    object_array,
    reshape,
    short_repr,
    tensor_from_raw,
    tensor_to_raw,
)

__all__ = [
    "map_json_scalars",
    "message_to_json",
    "parameters_from_proto",
    "parameters_to_proto",
    "request_from_proto",
    "request_to_proto",
    "response_to_proto",
    "response_from_proto",
]

_CONTENTS = {  # datatype → (typed contents field, that field's numpy dtype)
    "BOOL": ("bool_contents", "?"), "INT8": ("int_contents", "i4"), "INT16": ("int_contents", "i4"),
    "INT32": ("int_contents", "i4"), "INT64": ("int64_contents", "i8"), "UINT8": ("uint_contents", "u4"),
    "UINT16": ("uint_contents", "u4"), "UINT32": ("uint_contents", "u4"), "UINT64": ("uint64_contents", "u8"),
    "FP32": ("fp32_contents", "f4"), "FP64": ("fp64_contents", "f8"), "BYTES": ("bytes_contents", "O"),
}  # fmt: skip
_CONTENT_FIELDS = sorted({f for f, _ in _CONTENTS.values()})
_INT64_CPP_TYPES = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)

#: `fn(field, value)` for one scalar of a JSON-shaped message.
ScalarMap = Callable[[FieldDescriptor, Any], Any]


def message_to_json(message: Any) -> dict[str, Any]:
    """A proto as Triton's HTTP API shows it (its `GET /v2/models/{m}/config`, metadata, statistics).

    Observed on Triton 2.51: snake_case field names, enums by name, every scalar, repeated and map
    field printed even at its default, unset sub-messages and oneofs left out, and 64-bit integers
    (dims, max_queue_delay_microseconds, ...) as JSON numbers, not protobuf's strings.
    """
    document = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return map_json_scalars(document, message.DESCRIPTOR, _int64_as_number)


def _int64_as_number(field: FieldDescriptor, value: Any) -> Any:
    if field.cpp_type in _INT64_CPP_TYPES and isinstance(value, str):
        return int(value)
    return value


def map_json_scalars(document: dict[str, Any], descriptor: Descriptor, fn: ScalarMap) -> dict[str, Any]:
    """Apply `fn(field, value)` to every scalar in a JSON-shaped message, guided by its schema.

    Keys the schema does not know are kept as they are, so that json_format reports them.
    """
    fields = {**descriptor.fields_by_name, **{f.json_name: f for f in descriptor.fields}}
    result: dict[str, Any] = {}
    for key, value in document.items():
        field = fields.get(key)
        result[key] = value if field is None else _map_field(field, value, fn)
    return result


def _map_field(field: FieldDescriptor, value: Any, fn: ScalarMap) -> Any:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        value_field = message.fields_by_name["value"]
        if isinstance(value, dict):
            return {k: _map_single(value_field, v, fn) for k, v in value.items()}
        return value
    if _is_repeated(field) and isinstance(value, list):
        return [_map_single(field, item, fn) for item in value]
    return _map_single(field, value, fn)


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5.28 has is_repeated and warns on label; older releases only have label.
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _map_single(field: FieldDescriptor, value: Any, fn: ScalarMap) -> Any:
    if field.message_type is not None:
        return map_json_scalars(value, field.message_type, fn) if isinstance(value, dict) else value
    return fn(field, value)


def parameters_from_proto(pb_map: Any) -> dict[str, Any]:
    """`map<string, InferParameter>` → dict of bool/int/str/float (entries with nothing set are skipped)."""
    if not pb_map:
        return {}  # the common case; items() of an empty map still costs three Python calls
    out = {}
    for key, p in pb_map.items():
        which = p.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(p, which)
    return out


def parameters_to_proto(params: Mapping[str, Any], target: Any) -> None:
    """Fills the `map<string, InferParameter>` field `target` from bool/int/str/float values (ints past
    int64 go as uint64_param)."""
    for key, value in params.items():
        if not isinstance(key, str):
            raise CodecError(f"parameter names must be strings, got {short_repr(key)}")
        p = target[key]
        if isinstance(value, (bool, np.bool_)):
            p.bool_param = bool(value)
        elif isinstance(value, (int, np.integer)):
            if not -(2**63) <= int(value) < 2**64:
                raise CodecError(f"parameter {key!r}: {value} does not fit int64 or uint64")
            if value < 2**63:
                p.int64_param = int(value)
            else:
                p.uint64_param = int(value)
        elif isinstance(value, str):
            p.string_param = value
        elif isinstance(value, (float, np.floating)):
            p.double_param = float(value)
        else:
            raise CodecError(f"parameter {key!r}: a {type(value).__name__} is not a bool, int, str or float")


def _from_contents(t: Any, present: list[str], raw_name: str, what: str, model: str) -> np.ndarray:
    dtype, count = datatype_to_numpy(t.datatype, what), element_count(list(t.shape), what)
    if t.datatype == "FP16":
        raise CodecError(f"{what}: FP16 data must be sent in {raw_name}")
    field, base = _CONTENTS[t.datatype]
    if [f for f in present if f != field]:
        raise CodecError(f"{what}: datatype {t.datatype} takes {field}, got {', '.join(present)}")
    values = getattr(t.contents, field)
    if len(values) != count:
        detail = f"shape {format_shape(t.shape)} needs {count} elements, {field} has {len(values)}"
        if t.datatype == "BYTES":
            raise CodecError(f"{what}: {detail}")
        size = dtype.itemsize  # Triton compares bytes, in its words
        mismatch = f"byte size mismatch for {what}{for_model(model)}. Expected {count * size}, got {len(values) * size}"
        raise CodecError(f"{what.split()[0]} {mismatch}; {detail}")
    if t.datatype == "BYTES":
        return reshape(object_array(list(values)), t.shape, what)
    arr = np.fromiter(values, dtype=base, count=count)
    if arr.dtype != dtype and count:
        check_range(int(arr.min()), int(arr.max()), dtype, t.datatype, what)
    return reshape(arr.astype(dtype, copy=False), t.shape, what)


def _tensors_from_proto(tensors: Any, raw: Any, kind: str, model: str) -> list[InferTensor]:
    raw_name = f"raw_{kind}_contents"
    out: list[InferTensor] = []
    seen: set[str] = set()
    used = 0  # raw entries taken: an input in shared memory has none (tritonclient sends none)
    raw_count = len(raw)
    for t in tensors:
        # Each field read of a protobuf message is a lookup of its own: read each once.
        name, datatype, shape = t.name, t.datatype, list(t.shape)
        what = f"{kind} {name!r}"
        if name in seen:
            raise CodecError(f"duplicate {kind} name {name!r}")
        seen.add(name)
        params = parameters_from_proto(t.parameters)
        present = [f for f in _CONTENT_FIELDS if len(getattr(t.contents, f))] if t.HasField("contents") else []
        if params and kind == "input" and shared_memory_ref(params, what) is not None:
            if present:
                raise CodecError(f"{what}: has both shared_memory_region and contents; send one")
            data = np.empty(0, datatype_to_numpy(datatype, what))
        elif raw_count:
            if present:
                raise CodecError(  # Triton's words
                    f"contents field must not be specified when using {raw_name} for {name!r}{for_model(model)}"
                )
            if used == raw_count:
                raise _raw_count_error(tensors, raw, kind, model, missing=name)
            data = tensor_from_raw(raw[used], datatype, shape, name, kind=kind, model=model)
            used += 1
        else:
            data = _from_contents(t, present, raw_name, what, model)
        out.append(InferTensor(name, datatype, shape, data, params))
    if used != raw_count:
        raise _raw_count_error(tensors, raw, kind, model)
    return out


def _raw_count_error(tensors: Any, raw: Any, kind: str, model: str, missing: str | None = None) -> CodecError:
    in_shm = sum(
        kind == "input" and shared_memory_ref(parameters_from_proto(t.parameters), kind) is not None for t in tensors
    )
    expected = len(tensors) - in_shm
    detail = f"raw_{kind}_contents has {len(raw)} entries for {expected} {kind}s; send one per {kind}"
    if missing is not None:  # Triton's words: it looks for that tensor's data and finds none
        detail = f"unable to find data for {kind} tensor {missing!r}{for_model(model)} in request. {detail}"
    return CodecError(detail)


def _tensors_to_proto(tensors: list[InferTensor], target: Any, raw: Any, kind: str) -> None:
    for t in tensors:
        what = f"{kind} {t.name!r}"
        pt = target.add(name=t.name, datatype=t.datatype, shape=[int(d) for d in t.shape])
        if shared_memory_ref(t.parameters, what) is not None:
            # In shared memory: an input names its region and has no raw entry; an output the
            # server wrote there has an empty one and no parameters, as Triton's has.
            if kind == "input":
                parameters_to_proto(t.parameters, pt.parameters)
            else:
                raw.append(b"")
            continue
        check_count(t.data, t.shape, what)
        parameters_to_proto(t.parameters, pt.parameters)
        raw.append(tensor_to_raw(t.data, t.datatype, what))  # protobuf wants bytes, not a view


def request_from_proto(pb: Any) -> InferRequest:
    """gRPC `ModelInferRequest` → InferRequest (raw or typed contents). Raises only CodecError."""
    # No inputs is the model's business: the server words it with the count the model wants.
    model = pb.model_name
    inputs = _tensors_from_proto(pb.inputs, pb.raw_input_contents, "input", model)
    outputs: dict[str, RequestedOutput] = {}
    for o in pb.outputs:
        name = o.name
        if name in outputs:
            raise CodecError(f"duplicate requested output name {name!r}")
        outputs[name] = RequestedOutput(name, None, parameters_from_proto(o.parameters))
    params, requested = parameters_from_proto(pb.parameters), list(outputs.values()) or None
    return InferRequest(model, pb.model_version, pb.id, inputs, requested, params)


def request_to_proto(req: InferRequest) -> Any:
    """InferRequest → gRPC `ModelInferRequest` with raw_input_contents (RequestedOutput.binary, an
    HTTP notion, is dropped)."""
    pb = service_pb2.ModelInferRequest(model_name=req.model_name, model_version=req.model_version, id=req.id)
    parameters_to_proto(req.parameters, pb.parameters)
    _tensors_to_proto(req.inputs, pb.inputs, pb.raw_input_contents, "input")
    for o in req.outputs or ():
        parameters_to_proto(o.parameters, pb.outputs.add(name=o.name).parameters)
    return pb


def response_to_proto(resp: InferResponse) -> Any:
    """InferResponse → gRPC `ModelInferResponse` with raw_output_contents."""
    pb = service_pb2.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    parameters_to_proto(resp.parameters, pb.parameters)
    _tensors_to_proto(resp.outputs, pb.outputs, pb.raw_output_contents, "output")
    return pb


def response_from_proto(pb: Any) -> InferResponse:
    """gRPC `ModelInferResponse` → InferResponse (raw or typed contents). Raises only CodecError."""
    outputs = _tensors_from_proto(pb.outputs, pb.raw_output_contents, "output", pb.model_name)
    params = parameters_from_proto(pb.parameters)
    return InferResponse(pb.model_name, pb.model_version, pb.id, outputs, params)
