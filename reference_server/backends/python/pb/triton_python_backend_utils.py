"""`triton_python_backend_utils`, for model files served by perfkit-server's python backend.

Model files import it as Triton's own: `import triton_python_backend_utils as pb_utils`. The names,
signatures and behaviour follow Triton's python backend (its README and
src/resources/triton_python_backend_utils.py, plus the classes its stub defines in C++:
Tensor, InferenceRequest, InferenceResponse, InferenceResponseSender, TritonError, Logger); the
code is this server's. It runs inside the stub process, which installs `_runtime`: the bridge that
sends responses, BLS requests and log lines to the server.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from reference_server.backends.python.pb import dlpack
from reference_server.backends.python.pb.datatypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from reference_server.backends.python.pb.metrics import Metric, MetricFamily, MetricKind
from reference_server.backends.python.pb.model_config import ModelConfig
from reference_server.backends.python.pb.model_control import is_model_ready, load_model, unload_model
from reference_server.backends.python.pb.release import RequestRelease
from reference_server.backends.python.pb.response_sender import InferenceResponseSender

__all__ = [
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_MEMORY_CPU",
    "PreferredMemory",
    "MemoryType",
    "InferenceTrace",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "ResponseIterator",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class _Runtime(Protocol):
    """What the stub provides to this module (see stub.py)."""

    def send_response(self, token: int, response: InferenceResponse | None, flags: int) -> None: ...

    def infer(self, request: InferenceRequest) -> list[InferenceResponse]: ...

    def infer_stream(self, request: InferenceRequest) -> ResponseIterator: ...

    def infer_async(self, request: InferenceRequest) -> Awaitable[InferenceResponse]: ...

    def infer_stream_async(self, request: InferenceRequest) -> Awaitable[ResponseIterator]: ...

    def is_cancelled(self, token: int) -> bool: ...

    def in_execute(self, token: int) -> bool: ...

    def call_server(self, call: str, args: dict[str, Any], tensors: dict[str, Any] | None = None) -> Any: ...

    def log(self, level: str, message: str) -> None: ...


_runtime: _Runtime | None = None


def _bridge() -> _Runtime:
    if _runtime is None:
        raise TritonModelException("triton_python_backend_utils is only usable inside a model served by the server")
    return _runtime


def _expect(what: str, argument: str, value: Any, kind: type | tuple[type, ...]) -> None:
    """TypeError, as pybind11 raises for Triton's C++ classes, unless `value` is of `kind`."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(f"{what}: {argument} must be a {names}, got {type(value).__name__}")


# --- errors ----------------------------------------------------------------------------------------


class TritonModelException(Exception):
    """Raised by the utilities on misuse (Triton's pb_utils.TritonModelException)."""

    def message(self) -> str:
        return str(self)


class TritonError:
    """An error to put in an InferenceResponse: its message and TRITONSERVER_Error_Code."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


# --- tensors ---------------------------------------------------------------------------------------


class Tensor:
    """A named tensor: a numpy array on the CPU (BYTES: an object array of bytes), or, from
    `from_dlpack`, a tensor left on its CUDA device (`is_cpu()` False), copied to the host only
    when the response is sent."""

    __slots__ = ("_name", "_array", "_gpu")

    def __init__(self, name: str, data: Any) -> None:
        # A wrong type is a TypeError, as pybind11 raises for Triton's C++ class; a bad value is not.
        _expect("Tensor()", "name", name, str)
        _expect("Tensor()", "data", data, np.ndarray)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if data.dtype.kind in "SU":
            data = _bytes_array(data)
        elif data.dtype.kind not in "biufO":
            raise TritonModelException(f"tensor '{name}': numpy dtype {data.dtype} has no Triton data type")
        self._name = name
        self._array: npt.NDArray[Any] = data
        self._gpu: dlpack.GpuTensor | None = None

    @classmethod
    def _of(cls, name: str, array: npt.NDArray[Any]) -> Tensor:
        """A tensor the stub built from shared memory: already checked, so no checks."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._gpu = None
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        if self._gpu is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def _host_array(self) -> npt.NDArray[Any]:
        """The data in host memory, wherever the tensor is: what crosses to the server."""
        return self._array if self._gpu is None else self._gpu.host()

    def shape(self) -> list[int]:
        return list(self._array.shape) if self._gpu is None else list(self._gpu.shape)

    def triton_dtype(self) -> int:
        dtype = self._array.dtype if self._gpu is None else self._gpu.dtype
        return numpy_to_triton_type(dtype) or 0

    def is_cpu(self) -> bool:
        return self._gpu is None

    def to_dlpack(self) -> Any:
        """A "dltensor" capsule over the tensor's memory (a copy's, for a read-only array, which the
        capsule's DLPack version cannot mark read-only)."""
        if self._gpu is not None:
            return self._gpu.to_dlpack()
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not have support for string tensors.")
        array = self._array if self._array.flags.writeable else np.array(self._array)
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._gpu is not None:
            return self._gpu.to_dlpack(stream=stream, **kwargs)
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not have support for string tensors.")
        return self._array.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.CPU, 0) if self._gpu is None else (dlpack.CUDA, self._gpu.device_id)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule (`torch.utils.dlpack.to_dlpack(t)`) or from any object with
        `__dlpack__` and `__dlpack_device__` (a torch tensor, a numpy array), on the CPU or a GPU."""
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        try:
            data = dlpack.from_dlpack(tensor)
        except dlpack.DlpackError as error:
            raise TritonModelException(str(error)) from None
        if isinstance(data, np.ndarray):
            return Tensor(name, data)
        if numpy_to_triton_type(data.dtype) is None:
            raise TritonModelException(f"tensor '{name}': dtype {data.dtype} has no Triton data type")
        result = Tensor._of(name, np.empty(0, dtype=data.dtype))
        result._gpu = data
        return result

    def __repr__(self) -> str:
        where = "" if self._gpu is None else f", on GPU {self._gpu.device_id}"
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype}{where})"


def _bytes_array(data: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out = np.empty(data.shape, dtype=object)
    flat = out.reshape(-1)
    for index, item in enumerate(data.reshape(-1)):
        flat[index] = item.encode() if isinstance(item, str) else bytes(item)
    return out


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


# --- requests and responses ------------------------------------------------------------------------


class InferenceResponse:
    """Outputs for one request, or an error."""

    __slots__ = ("_tensors", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        _expect("InferenceResponse()", "output_tensors", output_tensors, (list, tuple))
        tensors = list(output_tensors)
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"InferenceResponse error must be a pb_utils.TritonError, got {type(error).__name__}"
            )
        self._tensors = tensors
        self._error = error
        if isinstance(parameters, str):
            self._parameters = parameters
        else:
            self._parameters = json.dumps(parameters) if parameters else "{}"

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


class MemoryType(enum.IntEnum):
    """Where a BLS call's outputs are wanted (`PreferredMemory`), as Triton numbers them."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU, TRITONSERVER_MEMORY_CPU = (
    MemoryType.TRITONSERVER_MEMORY_GPU,
    MemoryType.TRITONSERVER_MEMORY_CPU,
)


class PreferredMemory:
    """A BLS request's preference for its outputs' memory. This server hands BLS outputs over in
    host memory whatever the preference (`is_cpu()` True), which Triton's README allows: it is a
    preference."""

    __slots__ = ("preferred_memory_type", "preferred_device_id")

    def __init__(self, preferred_memory_type: MemoryType | int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


class InferenceTrace:
    """A request's trace (`request.trace()`), to pass on to the BLS requests made for it."""

    __slots__ = ("_context",)

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        """The trace's context (OpenTelemetry's propagation headers, as JSON), or None untraced."""
        return self._context


class InferenceRequest(RequestRelease):
    """A request: one that `execute` receives, or one a model builds to call another model (BLS)."""

    __slots__ = (
        "_model_name", "_inputs", "_requested", "_request_id", "_correlation_id", "_flags", "_timeout",
        "_model_version", "_parameters", "_sender", "_trace",
    )  # fmt: skip

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
    ) -> None:
        what = "InferenceRequest()"
        _expect(what, "model_name", model_name, str)
        _expect(what, "inputs", inputs, (list, tuple))
        _expect(what, "requested_output_names", requested_output_names, (list, tuple))
        for output_name in requested_output_names:
            _expect(what, "requested_output_names[...]", output_name, str)
        _expect(what, "request_id", request_id, str)
        if correlation_id is None:
            raise TypeError(f"{what}: correlation_id must be an int or a str, got None")
        for argument, value in (("model_version", model_version), ("flags", flags), ("timeout", timeout)):
            _expect(what, argument, value, int)
        self._model_name = model_name
        self._inputs = list(inputs)
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceRequest inputs must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        self._requested = list(requested_output_names)
        self._request_id = request_id
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        self._correlation_id = correlation_id
        self._trace = trace
        self._flags = flags
        self._timeout = timeout
        self._model_version = model_version
        if parameters is None:
            self._parameters = "{}"
        elif isinstance(parameters, str):
            self._parameters = parameters
        else:
            self._parameters = json.dumps(parameters)
        self._sender: InferenceResponseSender | None = None

    @classmethod
    def _incoming(
        cls, model_name: str, inputs: list[Tensor], outputs: list[str], request_id: str, parameters: str,
        sender: InferenceResponseSender,
    ) -> InferenceRequest:  # fmt: skip
        """A request `execute` receives, built by the stub from checked parts: no checks, no copies."""
        request = cls.__new__(cls)
        request._model_name = model_name
        request._inputs = inputs
        request._requested = outputs
        request._request_id = request_id
        request._correlation_id = 0
        request._flags = 0
        request._timeout = 0
        request._model_version = -1
        request._parameters = parameters
        request._sender = sender
        return request

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def trace(self) -> InferenceTrace:
        """The request's trace: a BLS request made with `trace=request.trace()` carries it on. This
        server gives python models no trace context, so an incoming request's is empty."""
        trace = getattr(self, "_trace", None)
        return trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        """Whether the client gave this request up; False for a request the model built (BLS)."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("this request has no response sender: only requests given to execute() have one")
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run the request on the model it names and wait: an InferenceResponse, or with
        `decoupled=True` an iterator over the responses (the last one carries the final flag)."""
        if decoupled:
            return _bridge().infer_stream(self)
        return _bridge().infer(self)[0]

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """`exec` as an awaitable, for `async def execute`. With `decoupled=True`, as in Triton, it
        gives an iterator over the responses: the request is sent at once, and iterating waits for
        each response in turn."""
        if decoupled:
            return _bridge().infer_stream_async(self)
        return _bridge().infer_async(self)


class ResponseIterator:
    """The responses of a decoupled BLS call (`exec(decoupled=True)`), in order. When the model sent
    its final flag alone, the last one is empty (no outputs, no error), as on Triton."""

    __slots__ = ("_next", "_cancel", "_done")

    def __init__(self, next_response: Callable[[], InferenceResponse | None], cancel: Callable[[], None]) -> None:
        self._next = next_response
        self._cancel = cancel
        self._done = False

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        response = self._next()
        if response is None:
            self._done = True
            raise StopIteration
        return response

    def cancel(self) -> None:
        """Cancel the call: the model serving it sees `is_cancelled()`, and the call ends with the
        responses it sent before, then a CANCELLED error."""
        if not self._done:
            self._cancel()


# --- logging -----------------------------------------------------------------------------------------


class Logger:
    """Lines into the server's log, naming the model file and line that logged them (`Stub.log`);
    the server's log settings decide which are written."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE  # as Triton's
    _NAMES = {0: "INFO", 1: "WARNING", 2: "ERROR", 3: "VERBOSE"}

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _expect("Logger.log()", "message", message, str)
        _expect("Logger.log()", "level", level, Logger.LogLevel)  # a LogLevel, not a bare int, as Triton's
        _bridge().log(Logger._NAMES[level], message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


# --- config helpers ------------------------------------------------------------------------------------


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("input", []):
        if properties.get("name") == name:
            return dict(properties)
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []):
        if properties.get("name") == name:
            return dict(properties)
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))
