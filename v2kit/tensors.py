"""KServe v2 tensors without the messages around them: the datatypes and their numpy dtypes, and
a tensor's binary and JSON forms.

Binary is the tensor data extension's: little-endian, row-major, BYTES elements as a 4-byte length
then the bytes. JSON is v2's `data` array, nested or flat. `v2kit.codec` builds the request and
response bodies from these, and re-exports the first group of `__all__`. The second group is what the
message codecs (`codec`, `grpc_proto`) check tensors and word their errors with; each takes `what`,
the words an error message starts with ("input 'x'").

BYTES tensors have one representation in memory, as in Triton's python backend (pb_utils): a numpy
object array whose elements are `bytes`, exactly the bytes on the wire (NUL, empty and non-UTF-8
elements included). Every decoder returns that; encoders also take `str` elements (sent as UTF-8)
and numpy `S`/`U` arrays, though numpy drops the trailing NULs of those, so exact data belongs in
object arrays. JSON strings carry only text: a JSON BYTES element is its string's UTF-8 (`"\\u0000"`
is one NUL byte), and an element that is not UTF-8 cannot be written as JSON, so `tensor_to_json`
refuses it, naming the element and the fix (binary data); Triton 2.51 writes the raw bytes into its
JSON instead, and tritonclient then fails to read the reply.

Decoders raise only `CodecError` whatever the bytes, with a message that names the tensor. Sizes are
checked against the bytes actually present before anything is allocated, and numeric tensors decoded
from binary are zero-copy views of the buffer (read-only when it is `bytes`).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

__all__ = [
    "CodecError",
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
    # for the message codecs
    "check_count",
    "check_range",
    "element_count",
    "for_model",
    "format_shape",
    "json_type_name",
    "object_array",
    "reshape",
    "short_repr",
    "tensor_to_buffer",
]


class CodecError(ValueError):
    """The bytes or JSON do not form a valid v2 message; the message says what is wrong."""


_U32 = struct.Struct("<I")
_MAX_DIM = 2**63 - 1  # shapes are int64 on the wire

# Explicit little-endian dtypes: the wire is little-endian whatever the host is.
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(code)
    for name, code in [
        ("BOOL", "?"), ("UINT8", "<u1"), ("UINT16", "<u2"), ("UINT32", "<u4"), ("UINT64", "<u8"),
        ("INT8", "<i1"), ("INT16", "<i2"), ("INT32", "<i4"), ("INT64", "<i8"),
        ("FP16", "<f2"), ("FP32", "<f4"), ("FP64", "<f8"), ("BYTES", "O"),
    ]
}  # fmt: skip
_BY_KIND = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}
_VALID = ", ".join(DATATYPES)
_JSON_NOUN = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers", "U": "strings"}


def datatype_to_numpy(datatype: Any, what: str = "datatype") -> np.dtype:
    """The numpy dtype of a v2 datatype (BYTES → object); an error message starts with `what`."""
    try:
        return DATATYPES[datatype]
    except (KeyError, TypeError):
        raise CodecError(f"{what}: unknown datatype {short_repr(datatype)}; expected one of {_VALID}") from None


def numpy_to_datatype(dtype: Any) -> str:
    """The v2 datatype of a numpy dtype (object, bytes_ and str_ → BYTES)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise CodecError(f"{dtype!r} is not a numpy dtype") from None
    name = "BYTES" if dt.kind in "OSU" else _BY_KIND.get((dt.kind, dt.itemsize))
    if name is None:
        raise CodecError(f"numpy dtype {dt} has no v2 datatype; expected one of {_VALID}")
    return name


def config_type_to_datatype(name: str) -> str:
    """Model-config enum name (`TYPE_FP32`, `TYPE_STRING`, ...) → v2 datatype (`FP32`, `BYTES`)."""
    if name == "TYPE_STRING":
        return "BYTES"
    if isinstance(name, str) and name.startswith("TYPE_") and name[5:] in DATATYPES and name != "TYPE_BYTES":
        return name[5:]
    valid = ", ".join(datatype_to_config_type(d) for d in DATATYPES)
    raise CodecError(f"unknown model config data type {name!r}; expected one of {valid}")


def datatype_to_config_type(datatype: str) -> str:
    """v2 datatype → model-config enum name (`BYTES` → `TYPE_STRING`)."""
    datatype_to_numpy(datatype)
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


# --- checks and message pieces for the message codecs --------------------------------------------


def format_shape(shape: Any) -> str:
    """`[2, 3]`, as error messages write a shape."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def short_repr(value: Any) -> str:
    """The repr of a client's value, cut to 80 characters for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type ("array", "object", ...)."""
    if isinstance(value, bool):
        return "boolean"
    names = {int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), "null")


def element_count(shape: Any, what: str) -> int:
    """Validates a shape; its element count as a Python int, which cannot overflow."""
    if type(shape) is list:  # the common case, a JSON list of ints, checked in one pass
        count = 1
        for d in shape:
            if type(d) is not int or not 0 <= d <= _MAX_DIM:
                break
            count *= d
        else:
            return count
    bad = not isinstance(shape, (list, tuple))
    bad = bad or any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) for d in shape)
    if bad:
        raise CodecError(f"{what}: shape must be a list of non-negative integers, got {short_repr(shape)}")
    for d in shape:
        if d < 0:
            raise CodecError(f"{what}: negative dimension {d} in shape {format_shape(shape)}")
        if d > _MAX_DIM:
            raise CodecError(f"{what}: dimension {d} in shape {format_shape(shape)} exceeds int64")
    return math.prod(int(d) for d in shape)


def check_count(data: Any, shape: Any, what: str) -> None:
    """That `data` holds exactly the elements a valid `shape` needs."""
    count, size = element_count(shape, what), np.size(data)
    if size != count:
        raise CodecError(f"{what}: shape {format_shape(shape)} needs {count} elements but data has {size}")


def reshape(arr: np.ndarray, shape: Any, what: str) -> np.ndarray:
    """`arr` in `shape`, whose element count was checked."""
    try:
        return arr.reshape([int(d) for d in shape])
    except (ValueError, OverflowError) as e:
        raise CodecError(f"{what}: cannot build a tensor of shape {format_shape(shape)}: {e}") from None


def check_range(lo: int, hi: int, dtype: np.dtype, datatype: str, what: str) -> None:
    """That integers from `lo` to `hi` fit the integer `dtype` of `datatype`."""
    info = np.iinfo(dtype)
    if lo < info.min or hi > info.max:
        raise CodecError(f"{what}: value {lo if lo < info.min else hi} is out of range for {datatype}")


def _as_dtype(arr: Any, datatype: str, what: str) -> np.ndarray:
    """C-contiguous `arr` in `datatype`'s dtype; casts within a kind (float64 → FP32), never across."""
    dtype = datatype_to_numpy(datatype, what)
    arr = np.asarray(arr)
    if arr.dtype != dtype:
        if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise CodecError(f"{what}: cannot send a {arr.dtype} array as {datatype}")
        with np.errstate(all="ignore"):  # overflow becomes inf, as a C cast would
            arr = arr.astype(dtype)
    return np.ascontiguousarray(arr)


# --- BYTES and raw tensors -----------------------------------------------------------------------


def serialize_bytes_tensor(arr: Any) -> bytes:
    """Row-major BYTES elements, each a 4-byte little-endian length then the bytes (str → UTF-8)."""
    pack = _U32.pack
    parts: list[bytes] = []
    for i, x in enumerate(np.asarray(arr, dtype=object).ravel()):
        if isinstance(x, str):
            try:
                x = x.encode()
            except UnicodeEncodeError:
                raise CodecError(f"BYTES element {i} is a str that is not valid Unicode: {short_repr(x)}") from None
        elif not isinstance(x, (bytes, bytearray)):
            raise CodecError(f"BYTES elements must be bytes or str, got {type(x).__name__}")
        parts += (pack(len(x)), x)
    return b"".join(parts)


def _deserialize(buf: Any, count: int | None, what: str) -> np.ndarray:
    data = buf if isinstance(buf, bytes) else bytes(buf)
    n = len(data)
    # Each element needs a 4-byte prefix: this also bounds what a hostile shape can allocate.
    if count is not None and count * 4 > n:
        raise CodecError(f"{what}: {n} bytes cannot hold {count} BYTES elements (4-byte length prefix each)")
    unpack = _U32.unpack_from
    items: list[bytes] = []
    off = 0
    while off < n:
        if off + 4 > n:
            raise CodecError(
                f"{what}: truncated BYTES element {len(items)}: {n - off} bytes where a 4-byte length belongs"
            )
        (length,) = unpack(data, off)
        off += 4
        if off + length > n:
            raise CodecError(f"{what}: truncated BYTES element {len(items)}: declares {length} bytes, {n - off} remain")
        items.append(data[off : off + length])
        off += length
    if count is not None and len(items) != count:
        raise CodecError(f"{what}: expected {count} BYTES elements, got {len(items)}")
    return object_array(items)


def object_array(items: list[Any]) -> np.ndarray:
    """A flat object array of BYTES elements."""
    arr = np.empty(len(items), dtype=object)
    arr[:] = items  # element-wise, so bytes never turn into a 2-D array
    return arr


def deserialize_bytes_tensor(buf: bytes, count: int | None = None) -> np.ndarray:
    """Inverse of `serialize_bytes_tensor`: a flat object array of bytes (`count` checked if given)."""
    return _deserialize(buf, count, "BYTES tensor")


def tensor_to_buffer(arr: Any, datatype: str, what: str) -> bytes | memoryview:
    """`tensor_to_raw` without the copy where it can: a memoryview of numeric tensors."""
    # A memoryview spares numeric tensors a copy on the HTTP path, where bytes.join takes it as is.
    if datatype == "BYTES":
        return serialize_bytes_tensor(arr)
    return memoryview(_as_dtype(arr, datatype, what).reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def tensor_to_raw(arr: np.ndarray, datatype: str, what: str = "tensor") -> bytes:
    """Little-endian, row-major bytes of `arr` as `datatype` (BYTES length-prefixed)."""
    buf = tensor_to_buffer(arr, datatype, what)
    return buf if isinstance(buf, bytes) else buf.tobytes()


def tensor_from_raw(
    buf: Any, datatype: str, shape: Any, name: str, *, kind: str = "input", model: str = ""
) -> np.ndarray:
    """A tensor from its binary form, sizes checked exactly; numeric ones are zero-copy views of `buf`.
    With `model` (a server decoding a request) a size mismatch is worded as Triton words it."""
    what = f"{kind} {name!r}"
    dtype = datatype_to_numpy(datatype, what)
    count = element_count(shape, what)
    if datatype == "BYTES":
        return reshape(_deserialize(buf, count, what), shape, what)
    size, expected = memoryview(buf).nbytes, count * dtype.itemsize
    if size != expected:
        detail = f"expected {expected} bytes for shape {format_shape(shape)} {datatype}, got {size}"
        if model:
            raise CodecError(f"{kind} byte size mismatch for {what}{for_model(model)}. Expected {expected}, got {size}")
        raise CodecError(f"{what}: {detail}")
    arr = np.frombuffer(buf, dtype=dtype) if expected else np.empty(0, dtype)
    if datatype == "BOOL" and expected and arr.view(np.uint8).max() > 1:
        raise CodecError(f"{what}: BOOL bytes must be 0 or 1")
    return reshape(arr, shape, what)


# --- JSON tensors --------------------------------------------------------------------------------


def _flatten_strings(data: list[Any], what: str) -> list[bytes]:
    if all(type(x) is str for x in data):
        return [x.encode() for x in data]
    out: list[bytes] = []

    def walk(node: Any) -> tuple[int, ...]:  # returns the sub-shape, so ragged arrays show up
        if isinstance(node, str):
            out.append(node.encode())
            return ()
        if not isinstance(node, list):
            raise CodecError(f"{what}: BYTES data must hold JSON strings, got a {json_type_name(node)}")
        subs = {walk(item) for item in node}
        if len(subs) > 1:
            raise CodecError(f"{what}: data is a ragged array")
        return (len(node), *(subs.pop() if subs else ()))

    walk(data)
    return out


def _numeric_from_json(data: list[Any], datatype: str, dtype: np.dtype, what: str) -> np.ndarray:
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise CodecError(f"{what}: data must be a regular (not ragged) array of {datatype} values") from None
    if raw.size == 0:
        return np.empty(0, dtype)
    k = raw.dtype.kind
    if dtype.kind in "iu" and k in "fO":
        # numpy makes float64 of int64 mixed with uint64-only values, and object past 64 bits:
        # re-read such integers exactly.
        ints = np.asarray(data, dtype=object).ravel().tolist()
        if all(type(x) is int for x in ints):
            check_range(min(ints), max(ints), dtype, datatype, what)
            return np.array(ints, dtype=dtype)
    if k not in {"b": "b", "f": "iuf"}.get(dtype.kind, "iu"):
        got = "non-integer numbers" if k == "f" else _JSON_NOUN.get(k, "mixed or out-of-range values")
        raise CodecError(f"{what}: {datatype} data must be JSON {_JSON_NOUN[dtype.kind]}, got {got}")
    if dtype.kind in "iu":
        check_range(int(raw.min()), int(raw.max()), dtype, datatype, what)
    with np.errstate(over="ignore"):
        arr = raw.astype(dtype).ravel()
    if dtype.kind == "f" and k == "f" and np.any(np.isinf(arr) & np.isfinite(raw.ravel())):
        raise CodecError(f"{what}: a value is out of range for {datatype}")
    return arr


def tensor_from_json(
    data: Any, datatype: str, shape: Any, name: str, *, kind: str = "input", model: str = ""
) -> np.ndarray:
    """A tensor from v2 JSON `data`, nested or flat (row-major). FP16 is binary-only."""
    what = f"{kind} {name!r}"
    dtype = datatype_to_numpy(datatype, what)
    if datatype == "FP16":
        raise CodecError(f"{what}: FP16 cannot be sent as JSON; use binary tensor data (binary_data_size)")
    count = element_count(shape, what)
    if not isinstance(data, list):
        raise CodecError(f"{what}: 'data' must be a JSON array, got a {json_type_name(data)}")
    try:
        if datatype == "BYTES":
            arr = object_array(_flatten_strings(data, what))
        else:
            arr = _numeric_from_json(data, datatype, dtype, what)
    except UnicodeEncodeError:
        raise CodecError(f"{what}: BYTES data holds a string that is not valid Unicode") from None
    except RecursionError:
        raise CodecError(f"{what}: data is nested too deeply") from None
    if arr.size != count:
        detail = f"{what}: shape {format_shape(shape)} needs {count} elements but data has {arr.size}"
        # With a model (a server decoding a request): Triton's words first.
        raise CodecError(
            f"Unable to parse 'data': Shape does not match true shape of 'data' field; {detail}" if model else detail
        )
    return reshape(arr, shape, what)


def for_model(model: str) -> str:
    """ " for model 'NAME'", as Triton's messages name a model; empty where none is known."""
    return f" for model '{model}'" if model else ""


def tensor_to_json(arr: Any, datatype: str, *, name: str = "", kind: str = "output") -> list[Any]:
    """Flat row-major JSON values of `arr`. FP16, and BYTES that are not UTF-8, raise CodecError."""
    what = f"{kind} {name!r}" if name else kind
    if datatype == "FP16":
        if kind == "output":  # Triton's words (a python model may answer FP16 for an FP32 output)
            raise CodecError(
                f"sending FP16 data via JSON is not supported. Please use the binary data format for output ({what})"
            )
        raise CodecError(f"{what}: FP16 cannot be sent as JSON; use binary tensor data (binary_data)")
    if datatype != "BYTES":
        values: list[Any] = _as_dtype(arr, datatype, what).ravel().tolist()
        return values
    out = []
    for i, x in enumerate(np.asarray(arr, dtype=object).ravel()):
        if isinstance(x, (bytes, bytearray)):
            try:
                x = x.decode()
            except UnicodeDecodeError as e:
                fix = "send it as binary data" if kind == "input" else "ask for it as binary data (binary_data: true)"
                raise CodecError(
                    f"{what}: BYTES element {i} is not valid UTF-8 ({e.reason} at byte {e.start}), so it cannot "
                    f"be sent as JSON; {fix}"
                ) from None
        elif not isinstance(x, str):
            raise CodecError(f"{what}: BYTES elements must be bytes or str, got {type(x).__name__}")
        out.append(x)
    return out
