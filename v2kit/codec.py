"""Sans-I/O codec for the KServe v2 inference protocol (Triton's dialect).

No sockets, no event loop: bytes in, objects out. The load generator and the reference server both
use it. This module holds the request and response messages and their HTTP bodies: v2 JSON, and the
binary tensor data extension (`Inference-Header-Content-Length` plus appended tensors). The tensors
themselves, datatypes, the datatype ↔ numpy mapping and the binary and JSON tensor forms, are in
`v2kit.tensors` and re-exported here. gRPC protos ↔ dataclasses are in `v2kit.grpc_proto`.

Decoders raise only `CodecError` whatever the bytes, with a message fit for an HTTP 400 body
(`error_body`) or an INVALID_ARGUMENT status. Sizes are checked against the bytes actually present
before anything is allocated, and numeric tensors decoded from binary are zero-copy views of the body
(read-only when it is `bytes`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from v2kit.tensors import (
    DATATYPES,
    CodecError,
    check_count,
    config_type_to_datatype,
    datatype_to_config_type,
    datatype_to_numpy,
    deserialize_bytes_tensor,
    element_count,
    format_shape,
    json_type_name,
    numpy_to_datatype,
    object_array,
    serialize_bytes_tensor,
    short_repr,
    tensor_from_json,
    tensor_from_raw,
    tensor_to_buffer,
    tensor_to_json,
    tensor_to_raw,
)

__all__ = [
    "HEADER_LENGTH",
    "CodecError",
    "InferTensor",
    "RequestedOutput",
    "InferRequest",
    "InferResponse",
    "DATATYPES",
    "datatype_to_numpy",
    "numpy_to_datatype",
    "config_type_to_datatype",
    "datatype_to_config_type",
    "serialize_bytes_tensor",
    "deserialize_bytes_tensor",
    "tensor_to_raw",
    "tensor_from_raw",
    "tensor_from_json",
    "tensor_to_json",
    "decode_infer_request",
    "decode_raw_binary_request",
    "encode_infer_response",
    "encode_infer_request",
    "decode_infer_response",
    "decode_error",
    "error_body",
    "SHARED_MEMORY_REGION",
    "SharedMemoryRef",
    "shared_memory_ref",
]


#: The binary tensor data extension's header: the length of the JSON that starts the body.
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(slots=True)
class InferTensor:
    """One input or output tensor. `data` is a numpy array of `shape`; BYTES tensors hold `object`
    arrays of `bytes`, byte for byte what the wire carried (`v2kit.tensors` says how JSON and `str`
    elements map to them)."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for. `binary` is the per-output `binary_data` parameter, or None
    when the client did not say (the request-level `binary_data_output` then decides)."""

    name: str
    binary: bool | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[InferTensor] = field(default_factory=list)
    # None: all outputs, with the request-level binary default.
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[InferTensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor's bytes are in a registered shared-memory region (Triton's shared memory
    extensions): the `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size`
    parameters of an input or a requested output."""

    region: str
    offset: int
    byte_size: int


#: The tensor parameter that names a shared-memory region (`shared_memory_ref`).
SHARED_MEMORY_REGION = "shared_memory_region"
_SHM_OFFSET, _SHM_SIZE = "shared_memory_offset", "shared_memory_byte_size"


def shared_memory_ref(parameters: dict[str, Any], what: str) -> SharedMemoryRef | None:
    """The shared-memory reference in a tensor's `parameters`, None when it names no region.

    Raises CodecError when the parameters are malformed: an offset or size without a region, a
    region without a byte size, or values of the wrong type.
    """
    if not parameters:
        return None  # the common case, on every tensor of every request
    region = parameters.get(SHARED_MEMORY_REGION)
    if region is None:
        stray = [k for k in (_SHM_OFFSET, _SHM_SIZE) if k in parameters]
        if stray:
            raise CodecError(f"{what}: parameter {stray[0]} needs {SHARED_MEMORY_REGION}")
        return None
    if not isinstance(region, str) or not region:
        raise CodecError(f"{what}: {SHARED_MEMORY_REGION} must be a non-empty string, got {short_repr(region)}")
    offset, size = parameters.get(_SHM_OFFSET, 0), parameters.get(_SHM_SIZE)
    if size is None:
        raise CodecError(f"{what}: {SHARED_MEMORY_REGION} '{region}' needs {_SHM_SIZE}")
    for key, value in ((_SHM_OFFSET, offset), (_SHM_SIZE, size)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise CodecError(f"{what}: {key} must be an integer >= 0, got {short_repr(value)}")
    return SharedMemoryRef(region, offset, size)


def _without_shared_memory(parameters: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in parameters.items() if k not in (SHARED_MEMORY_REGION, _SHM_OFFSET, _SHM_SIZE)}


# --- shared helpers ------------------------------------------------------------------------------


#: One encoder for every message: `json.dumps` with separators builds a new one per call (about
#: 5 us of a small response's 20).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(doc: Any, what: str) -> bytes:
    try:
        return _ENCODER.encode(doc).encode()
    except (TypeError, ValueError) as e:
        raise CodecError(f"cannot encode {what} as JSON: {e}") from None


# --- HTTP bodies: JSON header, then binary sections ----------------------------------------------


def _header_length(value: Any, size: int) -> int | None:
    if value is None:
        return None
    try:  # the raw header string is welcome too
        value = int(value) if isinstance(value, str) else value
    except ValueError:
        pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise CodecError(f"{HEADER_LENGTH} must be an integer, got {short_repr(value)}")
    if not 0 <= value <= size:
        raise CodecError(f"{HEADER_LENGTH} {value} is outside the {size}-byte body")
    return value


def _split_body(body: Any, header_length: Any, what: str) -> tuple[dict[str, Any], memoryview | None]:
    mv = memoryview(body).cast("B")
    n = _header_length(header_length, len(mv))
    header, rest = (mv, None) if n is None else (mv[:n], mv[n:])
    try:
        doc = json.loads(str(header, "utf-8"))
    except UnicodeDecodeError as e:
        raise CodecError(f"{what} JSON is not valid UTF-8: {e}") from None
    except (ValueError, RecursionError) as e:
        raise CodecError(f"failed to parse the {what} JSON buffer: {e}") from None  # Triton's words
    if not isinstance(doc, dict):
        raise CodecError(f"{what} JSON must be an object, got a {json_type_name(doc)}")
    return doc, rest


def _params(container: dict[str, Any], what: str) -> dict[str, Any]:
    params = container.get("parameters", {})
    if not isinstance(params, dict):
        raise CodecError(f"{what}: 'parameters' must be a JSON object")
    return params


def _triton_size_error(sized: list[tuple[str, int]], available: int, kind: str, model: str) -> str:
    """Triton's words for binary data that does not match the sizes announced: the first tensor
    the data runs out in and how many bytes it still expects, or the data left over."""
    end = 0
    for name, size in sized:
        end += size
        if end > available:
            missing = min(size, end - available)
            return f"unexpected size for {kind} {name!r}, expecting {missing} additional bytes for model '{model}'"
    return f"unexpected additional {kind} data for model '{model}'"


#: One tensor of a parsed header: (name, datatype, shape, parameters, JSON data, binary size,
#: whether in shared memory).
_Spec = tuple[str, Any, Any, dict[str, Any], Any, "int | None", bool]


def _parse_tensors(items: Any, kind: str, rest: memoryview | None, model: str = "") -> list[InferTensor]:
    """Validates every `inputs`/`outputs` entry and the binary sizes, then decodes the data."""
    return _build_tensors(_parse_specs(items, kind, model), kind, rest, model)


def _parse_specs(items: Any, kind: str, model: str) -> list[_Spec]:
    """Validates every `inputs`/`outputs` entry of a header."""
    if not isinstance(items, list):
        raise CodecError(f"'{kind}s' must be a JSON array")
    specs: list[_Spec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise CodecError(f"{kind}s[{i}] must be a JSON object with a non-empty string 'name'")
        name = item["name"]
        what = f"{kind} {name!r}"
        if name in seen:
            raise CodecError(f"duplicate {kind} name {name!r}")
        seen.add(name)
        try:
            datatype_to_numpy(item.get("datatype"), what)
        except CodecError as exc:
            if not model:
                raise
            raise CodecError(f"invalid datatype for {kind} {name}; {exc}") from None  # Triton's words first
        if "shape" not in item:
            raise CodecError(f"{what}: missing 'shape'")
        element_count(item["shape"], what)
        shape = [int(d) for d in item["shape"]]
        params = _params(item, what)
        size = params.get("binary_data_size")
        if kind == "input" and shared_memory_ref(params, what) is not None:
            # The bytes are in a registered region: the server reads them before it validates.
            if "data" in item or size is not None:
                raise CodecError(f"{what}: has both shared_memory_region and data; send one")
            specs.append((name, item["datatype"], shape, params, None, None, True))
            continue
        if size is not None:
            if "data" in item:
                raise CodecError(f"{what}: has both 'data' and parameters.binary_data_size; send one")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise CodecError(f"{what}: binary_data_size must be an integer >= 0, got {short_repr(size)}")
            params = {k: v for k, v in params.items() if k != "binary_data_size"}
        elif "data" not in item:
            raise CodecError(f"{what}: has neither 'data' nor parameters.binary_data_size")
        specs.append((name, item["datatype"], shape, params, item.get("data"), size, False))
    return specs


def _build_tensors(specs: list[_Spec], kind: str, rest: memoryview | None, model: str) -> list[InferTensor]:
    """The tensors of validated `specs`, their binary data cut from `rest`, sizes checked."""
    sized = [(spec[0], spec[5]) for spec in specs if spec[5] is not None]
    total, available = sum(size for _, size in sized if size is not None), 0 if rest is None else len(rest)
    if total != available:
        listed = ", ".join(f"{kind} {n!r}: {s}" for n, s in sized) or "none"
        where = (
            "the body has no binary part (no Inference-Header-Content-Length)"
            if rest is None
            else (f"{available} bytes follow the JSON header")
        )
        detail = f"binary_data_size values ({listed}) add up to {total} bytes but {where}"
        raise CodecError(f"{_triton_size_error(sized, available, kind, model)}; {detail}" if model else detail)
    tensors, off = [], 0
    for name, datatype, shape, params, data, size, shared in specs:
        if shared:
            arr = _shared_memory_placeholder(datatype)
        elif size is None:
            arr = tensor_from_json(data, datatype, shape, name, kind=kind, model=model)
        else:
            section = rest[off : off + size]  # type: ignore[index]  # sizes matched, so rest is there
            arr = tensor_from_raw(section, datatype, shape, name, kind=kind, model=model)
            off += size
        # Each tensor its own shape list and parameters: a parsed header may serve many requests.
        tensors.append(InferTensor(name, datatype, list(shape), arr, dict(params) if params else {}))
    return tensors


def _shared_memory_placeholder(datatype: str) -> np.ndarray:
    """The data of a tensor whose bytes are in shared memory until the server reads them."""
    return np.empty(0, datatype_to_numpy(datatype))


def _parse_requested_outputs(items: Any) -> list[RequestedOutput] | None:
    if items is None:
        return None
    if not isinstance(items, list):
        raise CodecError("'outputs' must be a JSON array")
    outputs: dict[str, RequestedOutput] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise CodecError(f"outputs[{i}] must be a JSON object with a non-empty string 'name'")
        what = f"output {item['name']!r}"
        if item["name"] in outputs:
            raise CodecError(f"duplicate requested output name {item['name']!r}")
        params = _params(item, what)
        binary, classes = params.get("binary_data"), params.get("classification")
        if binary is not None and not isinstance(binary, bool):
            raise CodecError(f"{what}: binary_data must be true or false, got {short_repr(binary)}")
        if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 0):
            raise CodecError(f"{what}: classification must be a non-negative integer")
        if shared_memory_ref(params, what) is not None and binary is True:
            raise CodecError("Output can't set both 'shared_memory_region' and 'binary_data'")  # Triton's words
        params = {k: v for k, v in params.items() if k != "binary_data"}
        outputs[item["name"]] = RequestedOutput(item["name"], binary, params)
    return list(outputs.values()) or None  # `"outputs": []` names nothing, like no list: all outputs


def _parse_common(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    rid, params = doc.get("id", ""), _params(doc, "request")
    if not isinstance(rid, str):
        raise CodecError(f"'id' must be a string, got a {json_type_name(rid)}")
    if not isinstance(params.get("binary_data_output", False), bool):
        raise CodecError("parameter binary_data_output must be true or false")
    return rid, params


def decode_infer_request(
    body: bytes, header_length: int | str | None, model_name: str, model_version: str = ""
) -> InferRequest:
    """Server side: an HTTP infer body. `header_length` is Inference-Header-Content-Length, as a number
    or the header's text (None when absent). Length 0 means a raw binary request, which needs `decode_raw_binary_request`."""
    mv = memoryview(body).cast("B")
    n = _header_length(header_length, len(mv))
    if n == 0:
        raise CodecError(
            "Inference-Header-Content-Length: 0 (raw binary request) needs the model's input metadata; "
            "the server must decode it with decode_raw_binary_request"
        )
    key = None
    if n is not None and n <= _PARSED_KEY_MAX:
        key = bytes(mv[:n])
        parsed = _PARSED.get(key)
        if parsed is not None:
            return _request_from(parsed, mv[n:], model_name, model_version)
    doc, rest = _split_body(body, header_length, "request")
    rid, params = _parse_common(doc)
    if "inputs" not in doc:
        raise CodecError("request JSON has no 'inputs'")
    # No inputs is the model's business: the server words it with the count the model wants.
    specs = _parse_specs(doc["inputs"], "input", model_name)
    requested = _parse_requested_outputs(doc.get("outputs"))
    outputs = None if requested is None else [(o.name, o.binary, o.parameters) for o in requested]
    parsed = _ParsedHeader(rid, params, specs, outputs)
    if key is not None and all(spec[4] is None for spec in specs):  # no JSON data: the same for every body
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = parsed
    return _request_from(parsed, rest, model_name, model_version)


#: Parsed request headers by their JSON bytes. A client sends the same header with every request
#: of a kind (perf_analyzer, tritonclient: only the binary data differs), so each is validated
#: once: a hit skips `json.loads` and the checks, about 10 us of a small request's CPU. Headers
#: with JSON data or over `_PARSED_KEY_MAX` bytes are parsed each time; the cache is bounded by
#: `_PARSED_MAX` entries and starts again empty when full. Each hit builds fresh objects.
_PARSED: dict[bytes, _ParsedHeader] = {}
_PARSED_MAX = 256
_PARSED_KEY_MAX = 2048


@dataclass(frozen=True, slots=True)
class _ParsedHeader:
    id: str
    parameters: dict[str, Any]
    inputs: list[_Spec]
    outputs: list[tuple[str, bool | None, dict[str, Any]]] | None


def _request_from(parsed: _ParsedHeader, rest: memoryview | None, model_name: str, model_version: str) -> InferRequest:
    inputs = _build_tensors(parsed.inputs, "input", rest, model_name)
    outputs = None
    if parsed.outputs is not None:
        outputs = [
            RequestedOutput(name, binary, dict(params) if params else {}) for name, binary, params in parsed.outputs
        ]
    params = dict(parsed.parameters) if parsed.parameters else {}
    return InferRequest(model_name, model_version, parsed.id, inputs, outputs, params)


def decode_raw_binary_request(
    body: bytes, model_name: str, model_version: str, input_name: str, datatype: str, shape: list[int]
) -> InferRequest:
    """Server side: a raw binary request (Inference-Header-Content-Length: 0) to a one-input model with
    input `shape`, where one -1 is deduced from the size. BYTES needs a shape of one element ([1], or
    [1, 1] with the batch dimension): the body is the element, with no length prefix. All outputs
    are asked for, binary."""
    what = f"input {input_name!r}"
    dtype, shape = datatype_to_numpy(datatype, what), list(shape)
    if datatype == "BYTES":
        if any(d not in (1, -1) for d in shape) or shape.count(-1) > 1:
            raise CodecError(f"{what}: a raw binary request needs BYTES shape [1], not {format_shape(shape)}")
        shape = [1] * len(shape)
        data = object_array([bytes(body)]).reshape(shape)
    else:
        variable = [i for i, d in enumerate(shape) if d == -1]
        if len(variable) > 1:
            raise CodecError(f"{what}: a raw binary request allows one variable dimension, not {format_shape(shape)}")
        if variable:
            n, row = memoryview(body).nbytes, math.prod(d for d in shape if d != -1) * dtype.itemsize
            if (n and not row) or (row and n % row):
                raise CodecError(f"{what}: {n} bytes is not a whole number of {format_shape(shape)} {datatype} rows")
            shape[variable[0]] = n // row if row else 0
        data = tensor_from_raw(body, datatype, shape, input_name)
    tensor = InferTensor(input_name, datatype, shape, data)
    return InferRequest(model_name, model_version, "", [tensor], None, {"binary_data_output": True})


def _encode_tensor(t: InferTensor, binary: bool, kind: str, parts: list[Any]) -> dict[str, Any]:
    what = f"{kind} {t.name!r}"
    entry: dict[str, Any] = {"name": t.name, "shape": [int(d) for d in t.shape], "datatype": t.datatype}
    if shared_memory_ref(t.parameters, what) is not None:
        # In shared memory, no data: an input names its region, and an output the server wrote
        # there leaves without parameters, as Triton's do.
        params = dict(t.parameters) if kind == "input" else _without_shared_memory(t.parameters)
        if params:
            entry["parameters"] = params
        return entry
    check_count(t.data, t.shape, what)
    params = dict(t.parameters)
    if binary:
        parts.append(tensor_to_buffer(t.data, t.datatype, what))
        params["binary_data_size"] = len(parts[-1])
    if params:
        entry["parameters"] = params
    if not binary:
        entry["data"] = tensor_to_json(t.data, t.datatype, name=t.name, kind=kind)
    return entry


def encode_infer_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """Server side: (body, Inference-Header-Content-Length), or (JSON body, None) when no output is
    binary. An output's own `binary` wins over the request's `binary_data_output` (default false)."""
    default = request.parameters.get("binary_data_output", False) is True
    chosen = {o.name: o.binary for o in request.outputs or ()}
    if not response.id and not response.parameters:
        answer = _binary_answer(response, chosen, default)
        if answer is not None:
            return answer
    return _encode_response(response, chosen, default)


def _encode_response(
    response: InferResponse, chosen: dict[str, bool | None], default: bool
) -> tuple[bytes, int | None]:
    parts: list[Any] = []
    outputs = []
    for t in response.outputs:
        binary = chosen.get(t.name)
        outputs.append(_encode_tensor(t, default if binary is None else binary, "output", parts))
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = _dumps(doc, "response")
    return (b"".join([header, *parts]), len(header)) if parts else (header, None)


#: Encoded response headers of answers whose outputs are all binary and numeric, by (model,
#: version, each output's name, datatype and shape): a model answers the same header for every
#: request of the same shapes, so it is encoded once. Bounded as `_PARSED` is.
_ENCODED: dict[tuple[Any, ...], tuple[bytes, tuple[int, ...]]] = {}


def _binary_answer(response: InferResponse, chosen: dict[str, bool | None], default: bool) -> tuple[bytes, int] | None:
    """`encode_infer_response`'s answer from a header encoded before, or None where it cannot be
    (an output in JSON, with parameters or BYTES, an id or parameters on the response, no outputs,
    a header not seen yet). Sizes are checked as `_encode_tensor` checks the element count."""
    key: list[Any] = [response.model_name, response.model_version]
    for t in response.outputs:
        binary = chosen.get(t.name)
        if not (default if binary is None else binary) or t.parameters or t.datatype == "BYTES":
            return None
        key.append((t.name, t.datatype, tuple(t.shape)))
    if len(key) == 2:
        return None
    cached = _ENCODED.get(tuple(key))
    if cached is None:
        body, length = _encode_response(response, chosen, default)
        if length is None:
            return None
        sizes: list[int] = []
        for t in response.outputs:
            what = f"output {t.name!r}"
            sizes.append(element_count(t.shape, what) * datatype_to_numpy(t.datatype, what).itemsize)
        if len(_ENCODED) >= _PARSED_MAX:
            _ENCODED.clear()
        _ENCODED[tuple(key)] = body[:length], tuple(sizes)
        return body, length
    header, expected = cached
    parts: list[Any] = [header]
    for t, size in zip(response.outputs, expected):
        try:
            buffer = tensor_to_buffer(t.data, t.datatype, "output")
        except CodecError:
            return None  # the full path words the error
        if len(buffer) != size:
            return None  # data that does not fit its shape: the full path words the error
        parts.append(buffer)
    return b"".join(parts), len(header)


def encode_infer_request(
    request: InferRequest, binary_inputs: bool = True, binary_outputs: bool = True
) -> tuple[bytes, int | None]:
    """Client side: (body, Inference-Header-Content-Length or None), byte for byte what tritonclient
    sends. The model stays in the URL; outputs whose `binary` is None get `binary_outputs`."""
    parts: list[Any] = []
    inputs = [_encode_tensor(t, binary_inputs, "input", parts) for t in request.inputs]
    doc: dict[str, Any] = {"id": request.id} if request.id else {}
    doc["inputs"] = inputs
    params = dict(request.parameters)
    if request.outputs:
        doc["outputs"] = []
        for o in request.outputs:
            if shared_memory_ref(o.parameters, f"output {o.name!r}") is not None:
                # Written into its region: Triton refuses binary_data beside shared_memory_region.
                doc["outputs"].append({"name": o.name, "parameters": dict(o.parameters)})
                continue
            binary = binary_outputs if o.binary is None else o.binary
            doc["outputs"].append({"name": o.name, "parameters": {**o.parameters, "binary_data": binary}})
    elif binary_outputs:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    header = _dumps(doc, "request")
    return (b"".join([header, *parts]), len(header)) if binary_inputs else (header, None)


def decode_infer_response(body: bytes, header_length: int | str | None) -> InferResponse:
    """Client side: an HTTP infer response body. Raises only CodecError (an error body included)."""
    doc, rest = _split_body(body, header_length, "response")
    doc = {k: v for k, v in doc.items() if v is not None}  # KServe's python server writes an absent field as null
    if isinstance(doc.get("error"), str) and "outputs" not in doc:
        raise CodecError(f"server error: {doc['error']}")
    rid, params = _parse_common(doc)
    name, version, outputs = doc.get("model_name", ""), doc.get("model_version", ""), doc.get("outputs", [])
    if not isinstance(name, str) or not isinstance(version, str):
        raise CodecError("'model_name' and 'model_version' must be strings")
    if isinstance(outputs, list):  # its outputs' parameters too
        outputs = [{k: v for k, v in o.items() if v is not None} if isinstance(o, dict) else o for o in outputs]
    return InferResponse(name, version, rid, _parse_tensors(outputs, "output", rest), params)


def error_body(message: str) -> bytes:
    """The KServe REST error body `{"error": message}`."""
    return json.dumps({"error": message}).encode()


def decode_error(body: bytes) -> str:
    """The server's words: KServe's `error`, FastAPI's `detail` (as JSON if a list), a traceback's last line."""
    text = bytes(body).decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    found = next((doc[key] for key in ("error", "detail") if key in doc), None) if isinstance(doc, dict) else None
    if found is not None:
        return found if isinstance(found, str) else json.dumps(found, separators=(",", ":"))
    return text.splitlines()[-1].strip() if text.startswith("Traceback (most recent call last)") else text
