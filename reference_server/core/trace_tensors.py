"""Trace level TENSORS: a traced request's tensors, as tritonserver 2.51 writes them.

Each tensor is one object of the trace file's array, after its request's timestamps:
`{"id":..,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":..,"data":..,"shape":..,"dtype":..}}`,
with `data` and `shape` comma-separated in one string each (tritonserver's src/tracer.cc,
`TraceTensorActivity`). Recorded here as Triton records them for a python or onnxruntime model:
each input as the request was queued (`TENSOR_QUEUE_INPUT`), and each output of each response
(`TENSOR_BACKEND_OUTPUT`); no `TENSOR_BACKEND_INPUT`, which only some backends report. Elements are
written as C++'s stream writes them: integers in decimal, BOOL as 1 or 0, INT8 and UINT8 as the
character of that code (Triton writes the byte; here it is JSON-escaped, so the file stays JSON),
FP32 and FP64 as printf's `%g`, BYTES each in double quotes, FP16 and BF16 not at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from v2kit.tensors import CodecError, numpy_to_datatype

__all__ = ["BACKEND_OUTPUT", "QUEUE_INPUT", "tensor_records"]

QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"


def tensor_records(activity: str, tensors: Mapping[str, np.ndarray]) -> list[str]:
    """One record per tensor: its object's JSON without the leading `{"id":..,` (the trace's id
    is known when the trace is written)."""
    records = []
    for name, array in tensors.items():
        array = np.asarray(array)
        try:
            datatype = numpy_to_datatype(array.dtype)
        except CodecError:
            continue  # a datatype Triton writes nothing for
        tensor = {"name": name, "data": _data(array, datatype), "shape": ",".join(map(str, array.shape)),
                  "dtype": datatype}  # fmt: skip
        text = json.dumps({"activity": activity, "tensor": tensor}, separators=(",", ":"), ensure_ascii=False)
        records.append(text[1:])
    return records


def _data(array: np.ndarray, datatype: str) -> str:
    values = array.reshape(-1).tolist()
    if datatype in ("FP16", "BF16"):
        return ""
    if datatype in ("FP32", "FP64"):
        return ",".join(f"{value:g}" for value in values)
    if datatype == "BOOL":
        return ",".join("1" if value else "0" for value in values)
    if datatype in ("INT8", "UINT8"):
        return ",".join(chr(value & 0xFF) for value in values)
    if datatype == "BYTES":
        return ",".join(f'"{_text(value)}"' for value in values)
    return ",".join(map(str, values))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
