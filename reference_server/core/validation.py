"""A request checked against the model version that serves it, in Triton's words.

The checks run in Triton's order (`InferenceRequest::ValidateRequestInputs`, then each input's
name, datatype and shape): first the count of inputs, then each one. Batch dimension rules: with
`max_batch_size > 0` every input leads with the same batch size, 1 to `max_batch_size`; the
remaining dims match the config's (`-1` takes any size). Requested outputs must exist.
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.model_version import ModelVersion
from reference_server.errors import InvalidArgument
from v2kit import codec as v2

__all__ = ["datatype_of", "validated_inputs", "validated_outputs"]


def datatype_of(data_type: int) -> str:
    """The protocol's datatype name of a config `DataType` value."""
    return v2.config_type_to_datatype(mc.DataType.Name(data_type))


def validated_inputs(served: ModelVersion, request: v2.InferRequest) -> dict[str, np.ndarray]:
    """The request's inputs as arrays, after Triton's checks: names, datatypes, shapes, batch size.

    The words are Triton core's (`InferenceRequest::Normalize`), with its `[request id: ...] `
    prefix where it puts one; an unknown input's message adds the inputs there are."""
    name = served.name
    max_batch = served.config.max_batch_size
    arrays: dict[str, np.ndarray] = {}
    batch_size: int | None = None
    _check_input_count(served, request)
    types = served.input_types
    for tensor in request.inputs:
        spec = types.get(tensor.name)
        if spec is None:
            raise InvalidArgument(
                f"unexpected inference input '{tensor.name}' for model '{name}'; "
                f"expected inputs: {sorted(served.inputs)}"
            )
        expected_type, dims = spec
        if tensor.datatype != expected_type:
            raise InvalidArgument(
                f"{_request(request)}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{name}' expects '{expected_type}'"
            )
        shape = tensor.shape
        if max_batch > 0:
            if not shape:
                raise InvalidArgument(
                    f"{_request(request)}input '{tensor.name}' has no shape but model requires batch dimension "
                    f"for '{name}'"
                )
            if batch_size is None:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise InvalidArgument(
                    f"{_request(request)}input '{tensor.name}' batch size does not match other inputs for '{name}'"
                )
            if not 1 <= shape[0] <= max_batch:
                raise InvalidArgument(
                    f"{_request(request)}inference request batch-size must be "
                    f"{'<= ' + str(max_batch) if shape[0] > max_batch else '>= 1'} for '{name}'"
                )
            shape = shape[1:]
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape)):
            expected = ([-1] if max_batch > 0 else []) + list(dims)
            raise InvalidArgument(
                f"{_request(request)}unexpected shape for input '{tensor.name}' for model '{name}'. "
                f"Expected {_fmt(expected)}, got {_fmt(tensor.shape)}. {_BATCH_NOTE if max_batch > 0 else ''}"
            )
        arrays[tensor.name] = tensor.data
    if len(arrays) == len(types):
        return arrays  # every input there: nothing can be missing (the common case, on every request)
    missing = [n for n, spec in served.inputs.items() if n not in arrays and not spec.optional]
    if missing:
        raise InvalidArgument(f"model '{name}' expects input(s) {missing} that the request does not carry")
    return arrays


#: What Triton adds to a shape error for a model with max_batch_size > 0.
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


def _request(request: v2.InferRequest) -> str:
    """Triton's prefix for a request's errors (InferenceRequest::LogRequest)."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _check_input_count(served: ModelVersion, request: v2.InferRequest) -> None:
    """Triton's first check (InferenceRequest::ValidateRequestInputs), in its words: as many inputs
    as the model has, or between its required and all of them where some are optional."""
    given, total = len(request.inputs), len(served.inputs)
    if given == total:  # every input: nothing to count (the common case, on every request)
        return
    required = [n for n, spec in served.inputs.items() if not spec.optional]
    if len(required) <= given <= total:
        return
    expected = f"{total} inputs" if len(required) == total else f"number of inputs between {len(required)} and {total}"
    names = sorted({t.name for t in request.inputs})
    missing = [n for n in required if n not in names]
    raise InvalidArgument(
        f"{_request(request)}expected {expected} but got {given} inputs for model '{served.name}'. Got input(s) "
        f"{_names(names)}, but missing required input(s) {_names(missing)}. Please provide all required input(s)."
    )


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def validated_outputs(served: ModelVersion, request: v2.InferRequest) -> list[str]:
    """The names of the outputs the request asks for (every output when it names none), each one the model has."""
    if request.outputs is None:
        return list(served.outputs)
    names = []
    for output in request.outputs:
        if output.name not in served.outputs:
            raise InvalidArgument(
                f"unexpected inference output '{output.name}' for model '{served.name}'; "
                f"outputs: {sorted(served.outputs)}"
            )
        names.append(output.name)
    return names


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
