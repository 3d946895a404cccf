"""Triton's data types on the numpy side, as `triton_python_backend_utils` exports them: type numbers
and names to numpy types and back, and BYTES tensors' wire layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "deserialize_bytes_tensor",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType values (BOOL = 1 ... BYTES = 13), as triton_to_numpy_type numbers them.
_TRITON_TYPES: list[Any] = [
    np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
    np.float16, np.float32, np.float64, np.object_,
]  # fmt: skip


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_TYPES[data_type - 1] if 1 <= data_type <= len(_TRITON_TYPES) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type == np.bytes_:
        return 13
    dtype = np.dtype(data_type)
    for index, candidate in enumerate(_TRITON_TYPES):
        if dtype == np.dtype(candidate):
            return index + 1
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: npt.NDArray[Any]) -> npt.NDArray[Any] | None:
    """BYTES elements as Triton lays them out (4-byte little-endian length, then the bytes), as a
    uint8 array; None for an empty tensor."""
    if input_tensor.size == 0:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        raw = item.encode() if isinstance(item, str) else bytes(item)
        parts += [len(raw).to_bytes(4, "little"), raw]
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> npt.NDArray[Any]:
    items = []
    offset = 0
    while offset < len(encoded_tensor):
        length = int.from_bytes(encoded_tensor[offset : offset + 4], "little")
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
