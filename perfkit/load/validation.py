"""Output validation: the `validation_data` of an `--input-data` JSON file, as perf_analyzer reads it.

`{"data": [...], "validation_data": [...]}`: entry i of "validation_data" gives the outputs
expected for step i of "data" (for sequence streams, a list of lists aligned with the streams),
each output as the inputs are given: a flat row-major list, `{"b64": ...}` (little-endian bytes;
BYTES elements with their 4-byte length prefix) or `{"content": ..., "shape": ...}`. An output a
step does not name is not checked. As in perf_analyzer (infer_context.cc `ValidateOutputs`), an
answer's output must equal, byte for byte, the expected rows of the steps its request carried; a
mismatch is counted as an error of its own kind, "validation mismatch", beside the transport's.

The expected bytes travel with each pre-encoded request (`Prepared.expected`); the client compares
them once the answer is in, so only a run that asks for validation decodes outputs.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perfkit.errors import PerfkitError
from v2kit import codec as v2

__all__ = ["Expected", "batch_expected", "read_validation_data"]

Expected = dict[str, bytes]  # output name -> its bytes as raw_output_contents carries them


def read_validation_data(path_text: str, metadata: Mapping[str, Any], *, streams: bool) -> list[Any] | None:
    """The expected outputs of each step (`streams`: of each stream's steps), None when the file
    has no "validation_data". Its layout must follow "data"'s."""
    if path_text in ("random", "zero") or Path(path_text).is_dir():  # a data directory has no expected outputs
        return None
    flag = f"--input-data {path_text}"
    try:
        doc = json.loads(Path(path_text).read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PerfkitError(f"{flag}: cannot read a JSON data file: {exc}") from None
    if not isinstance(doc, dict) or "validation_data" not in doc:
        return None
    entries, data = doc["validation_data"], doc.get("data")
    if not isinstance(entries, list) or not isinstance(data, list) or len(entries) != len(data):
        raise PerfkitError(f'{flag}: "validation_data" must be a list with one entry per entry of "data"')
    outputs = {str(o.get("name")): str(o.get("datatype")) for o in metadata.get("outputs") or () if isinstance(o, dict)}
    if not streams or not any(isinstance(step, list) for step in data):
        expected = [_expected_step(e, outputs, f"{flag}: validation_data[{i}]") for i, e in enumerate(entries)]
        return [expected] if streams else expected
    result = []
    for k, (stream, steps) in enumerate(zip(entries, data)):
        if not isinstance(stream, list) or len(stream) != len(steps):
            raise PerfkitError(f"{flag}: validation_data[{k}] must be a list as long as data[{k}]")
        result.append([_expected_step(e, outputs, f"{flag}: validation_data[{k}][{s}]") for s, e in enumerate(stream)])
    return result


def batch_expected(steps: Sequence[Expected]) -> Expected:
    """What a request carrying these steps' rows must answer: each output's rows in order (an
    output checked only where every step gives it)."""
    names = set(steps[0]).intersection(*steps[1:]) if steps else set()
    return {name: b"".join(step[name] for step in steps) for name in sorted(names)}


def _expected_step(entry: Any, outputs: Mapping[str, str], where: str) -> Expected:
    if not isinstance(entry, dict):
        raise PerfkitError(f"{where} must be a JSON object mapping output names to data")
    expected = {}
    for name, value in entry.items():
        if name not in outputs:
            raise PerfkitError(f"{where} names '{name}', which is not an output (outputs: {', '.join(outputs)})")
        expected[name] = _raw(value, outputs[name], f"{where}: output '{name}'")
    return expected


def _raw(value: Any, datatype: str, where: str) -> bytes:
    if isinstance(value, dict) and "content" in value:
        value = value["content"]
    if isinstance(value, dict) and "b64" in value:
        try:
            return base64.b64decode(str(value["b64"]), validate=True)
        except binascii.Error as exc:
            raise PerfkitError(f"{where}: invalid base64: {exc}") from None
    if not isinstance(value, list):
        raise PerfkitError(f'{where}: expected a list of values, {{"b64": ...}} or {{"content": ..., "shape": ...}}')
    flat = np.asarray(value, dtype=object).reshape(-1).tolist() if value else []
    try:
        json_type = "FP32" if datatype == "FP16" else datatype
        tensor = v2.tensor_from_json(flat, json_type, [len(flat)], where)
        if datatype == "FP16":
            tensor = tensor.astype(np.float16)
        return v2.tensor_to_raw(tensor, datatype, where)
    except v2.CodecError as exc:
        raise PerfkitError(f"{where}: {exc}") from None
