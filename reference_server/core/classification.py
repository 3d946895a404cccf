"""Triton's classification extension: an output returned as its top-k classes instead of its values.

A client asks for it per output: the `classification` parameter (HTTP: `"parameters":
{"classification": k}` on the requested output; gRPC: `InferRequestedOutputTensor.parameters
["classification"].int64_param`; tritonclient: `InferRequestedOutput(name, class_count=k)`). The
output then comes back as BYTES of shape `[batch, min(k, n)]` (`[min(k, n)]` for a model that
does not batch), where n is the element count of one batch entry: per entry, its n values ranked
highest first, each as "value:index" or "value:index:label". Values print as C++'s
`std::to_string` prints them (floats "%f": "0.750000", integers as integers), which is what
Triton's `TopkClassifications` (server/src/classification.cc) does. Equal values keep index order.

Labels come from the output's `label_filename` in the model folder, one per line (Triton's
LabelProvider): read once at load, refused when the path leaves the model folder (Triton:
UNSUPPORTED, "... is outside model directory"). An index past the last label, or an empty line,
gets no label.

Triton classifies the numeric types only (not FP16, BF16 or BYTES: "class result not available for
output due to unsupported type ..."), and at most 1,000,000 elements per batch entry; both are
refused here before the model runs, with Triton's words.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import InvalidArgument, ModelConfigError, Unsupported
from reference_server.scheduling.execute import Tensor
from v2kit import codec as v2
from v2kit.tensors import object_array

__all__ = ["CLASSIFICATION", "Labels", "classify", "read_labels", "requested_classes"]

#: The requested output's parameter that asks for classes.
CLASSIFICATION = "classification"

#: Triton's kMaxClassificationElements.
MAX_CLASSIFICATION_ELEMENTS = 1_000_000

#: Output name -> its labels, by class index.
Labels = Mapping[str, Sequence[bytes]]

_CLASSIFIABLE = frozenset({
    "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64",
})  # fmt: skip


def read_labels(config: mc.ModelConfig, model_dir: Path) -> dict[str, list[bytes]]:
    """The labels of each output with a `label_filename`, read from the model folder."""
    labels: dict[str, list[bytes]] = {}
    root = os.path.realpath(model_dir)
    for output in config.output:
        if not output.label_filename:
            continue
        path = os.path.join(model_dir, output.label_filename)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise Unsupported(
                f"label file path '{path}' for output '{output.name}' in model '{config.name}' is outside "
                "model directory"
            )
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ModelConfigError(
                f"failed to open text file for read {path}: {exc.strerror or exc} (label_filename of output "
                f"'{output.name}' in model '{config.name}')"
            ) from None
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()  # the newline that ends the last line starts no label
        labels[output.name] = lines
    return labels


def requested_classes(
    model_name: str, requested: Sequence[v2.RequestedOutput] | None, outputs: Mapping[str, mc.ModelOutput]
) -> dict[str, int]:
    """Output name -> class count, for the requested outputs that ask for classes.

    A count of 0 asks for the tensor itself, as over Triton's HTTP (tritonclient sends no parameter
    then). Refused with InvalidArgument: a count that is not a non-negative integer, an output whose
    type cannot be ranked, one whose entries hold more elements than Triton ranks, one that also
    asks for shared memory.
    """
    classes: dict[str, int] = {}
    for output in requested or ():
        count = output.parameters.get(CLASSIFICATION)
        if count is None:
            continue
        where = f"output '{output.name}' of model '{model_name}'"
        if v2.SHARED_MEMORY_REGION in output.parameters:
            # Classes are computed from the output, so they cannot be written where the output goes.
            raise InvalidArgument(f"Output can't set both '{v2.SHARED_MEMORY_REGION}' and '{CLASSIFICATION}' ({where})")
        if not isinstance(count, int) or isinstance(count, bool):
            raise InvalidArgument(
                f"invalid value type for '{CLASSIFICATION}' parameter of {where}, expected an integer class "
                f"count, got {type(count).__name__}"
            )
        if count < 0:
            raise InvalidArgument(f"invalid value for '{CLASSIFICATION}' parameter of {where}, expected >= 0")
        if count == 0:
            continue
        config = outputs[output.name]
        datatype = v2.config_type_to_datatype(mc.DataType.Name(config.data_type))
        if datatype not in _CLASSIFIABLE:
            raise InvalidArgument(
                f"class result not available for output due to unsupported type '{datatype}' ({where}; classes "
                "rank numeric outputs only)"
            )
        dims = list(config.dims)
        if -1 not in dims and math.prod(dims) > MAX_CLASSIFICATION_ELEMENTS:
            raise InvalidArgument(f"classification output tensor too large ({where}: {math.prod(dims)} elements)")
        classes[output.name] = count
    return classes


def classify(array: Tensor, count: int, batching: bool, labels: Sequence[bytes] = ()) -> Tensor:
    """The top `count` classes of each batch entry of `array` (the whole array if not `batching`),
    as a BYTES (object) array of shape [batch, k] or [k], k = min(count, entry elements)."""
    entries = array.reshape((array.shape[0], -1)) if batching and array.ndim > 0 else array.reshape((1, -1))
    elements = entries.shape[1]
    if elements > MAX_CLASSIFICATION_ELEMENTS:
        raise InvalidArgument(f"classification output tensor too large ({elements} elements per entry)")
    k = min(count, elements)
    is_float = entries.dtype.kind == "f"
    rows = []
    for entry in entries:
        # Highest first, equal values in index order: a stable ascending sort of the reversed entry.
        order = (elements - 1 - np.argsort(entry[::-1], kind="stable")[::-1])[:k]
        row = []
        for index in order.tolist():
            value = entry[index]
            text = (f"{float(value):f}" if is_float else str(int(value))).encode() + b":" + str(index).encode()
            label = labels[index] if index < len(labels) else b""
            row.append(text + b":" + label if label else text)
        rows.append(row)
    result = object_array([item for row in rows for item in row])
    return result.reshape((len(rows), k) if batching and array.ndim > 0 else (k,))
