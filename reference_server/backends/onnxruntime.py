"""The ONNX Runtime backend: one InferenceSession per model instance, on CPU or a GPU.

String tensors. The server carries BYTES tensors as object arrays of `bytes` (`v2kit.tensors`), but
onnxruntime's Python API carries string tensors as text: it turns a `bytes` element into the text of
its repr (b"a" becomes "b'a'"), cuts numpy `S` and `U` arrays at a NUL, refuses `str` holding lone
surrogates, and decodes its string outputs as UTF-8. So a TYPE_STRING input is decoded as strict
UTF-8 into an object array of `str` (exact, NUL included) and each string output is encoded back to
`bytes`; an element that is not UTF-8 cannot reach the model unchanged, so the request is refused
(InvalidArgument) with the model, input, element and reason, before it joins a batch, rather than
silently altered. The C API (`libonnxruntime.so`'s FillStringTensor) takes any bytes, but the wheel's
Python session is a separate, statically linked copy of the runtime, so that route would mean
driving a second runtime through ctypes for every model: not worth it for non-UTF-8 strings.
Models without string tensors pay nothing: the string inputs and outputs are found once, at load.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.context import BackendContext
from reference_server.backends.placement import Placement
from reference_server.errors import InternalError, InvalidArgument, ModelConfigError, ServerError
from reference_server.scheduling.execute import TensorSignature
from v2kit.tensors import object_array

# The names a config.pbtxt gives this backend (Triton: backend "onnxruntime", platform "onnxruntime_onnx").
ONNX_BACKEND = "onnxruntime"
ONNX_PLATFORM = "onnxruntime_onnx"

# ORT's element type strings → config DataType names. Anything else (sequences, maps, optional
# types) becomes TYPE_INVALID and complete_config refuses the model with the file names.
_ORT_TO_CONFIG_TYPE = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}


def session_options(config: mc.ModelConfig, config_path: Path | None = None) -> ort.SessionOptions:
    """Session options from the model config's parameters, with Triton ORT backend key names."""
    options = ort.SessionOptions()
    params = {key: value.string_value for key, value in config.parameters.items()}
    for key, attribute in (("intra_op_thread_count", "intra_op_num_threads"),
                           ("inter_op_thread_count", "inter_op_num_threads")):  # fmt: skip
        if key in params:
            text = params[key]
            if not text.isdigit() or int(text) > 1024:
                raise ModelConfigError(
                    f"{config_path or 'config.pbtxt'}: model '{config.name}': parameter {key} must be a whole number of threads (0-1024), got '{text}'"
                )
            setattr(options, attribute, int(text))
    if params.get("enable_mem_arena") == "0":
        options.enable_cpu_mem_arena = False
    # Several instances already run in parallel; ORT's own spinning threads would fight them.
    options.add_session_config_entry("session.intra_op.allow_spinning", params.get("allow_spinning", "0"))
    options.log_severity_level = 3
    return options


def create_instances(
    config: mc.ModelConfig,
    model_path: Path,
    placements: Sequence[Placement],
    config_path: Path,
    context: BackendContext | None = None,
) -> tuple[list[OnnxInstance], tuple[list[TensorSignature], list[TensorSignature]]]:
    """One session per placement, and the graph's (inputs, outputs) in config terms."""
    options = session_options(config, config_path)
    instances = [OnnxInstance(p, model_path, options, model_name=config.name) for p in placements]
    return instances, signature_from_session(instances[0].session)


def signature_from_session(
    session: ort.InferenceSession,
) -> tuple[list[TensorSignature], list[TensorSignature]]:
    """The (inputs, outputs) of a loaded ONNX model, in config terms."""
    return (
        [_signature(arg.name, arg.type, arg.shape) for arg in session.get_inputs()],
        [_signature(arg.name, arg.type, arg.shape) for arg in session.get_outputs()],
    )


def _signature(name: str, ort_type: str, shape: Sequence[Any] | None) -> TensorSignature:
    # ORT reports a symbolic dim as its name (str) and an unknown one as None; both are dynamic.
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (shape or ()))
    return TensorSignature(name, _ORT_TO_CONFIG_TYPE.get(ort_type, "TYPE_INVALID"), dims)


def why_no_cuda() -> str | None:
    """None when this onnxruntime has the CUDA execution provider, else what to install."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return None
    return f"onnxruntime {ort.__version__} here has no CUDA execution provider (pip install onnxruntime-gpu)"


#: How onnxruntime's Python binding words an OrtStatus: "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : ...".
_ORT_STATUS = re.compile(r"^\[ONNXRuntimeError\] : (\d+) : \w+ : (.*)$", re.DOTALL)


def ort_load_error(model_path: Path, exc: Exception) -> ServerError:
    """onnxruntime's refusal of a model file as Triton's onnxruntime backend words it (an Internal
    "onnx runtime error 7: Load model from ... failed:Protobuf parsing failed.")."""
    match = _ORT_STATUS.match(str(exc))
    if match is None:
        return ModelConfigError(f"{model_path}: onnxruntime cannot load the model: {exc}")
    return InternalError(f"onnx runtime error {match.group(1)}: {match.group(2)}")


class OnnxInstance:
    """One onnxruntime InferenceSession; `run` blocks and is called from the instance's worker thread."""

    def __init__(
        self, placement: Placement, model_path: Path, options: ort.SessionOptions, *, model_name: str = ""
    ) -> None:
        self.name = placement.name
        self.model_name = model_name or model_path.parent.parent.name
        self.placement = placement
        if not model_path.is_file():
            raise ModelConfigError(f"{model_path}: model file not found")
        if placement.device == "GPU":
            providers: list[str | tuple[str, dict[str, str]]] = [
                ("CUDAExecutionProvider", {"device_id": str(placement.gpu)}),
                "CPUExecutionProvider",
            ]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(os.fspath(model_path), options, providers=providers)
        except Exception as exc:
            raise ort_load_error(model_path, exc) from exc
        if placement.device == "GPU" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise ModelConfigError(
                f"{model_path}: instance '{self.name}' needs the CUDA execution provider on GPU "
                f"{placement.gpu}, but onnxruntime could not create it (is onnxruntime-gpu's CUDA runtime installed?)"
            )
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._string_inputs = frozenset(i.name for i in self.session.get_inputs() if i.type == _STRING)
        self._string_outputs = frozenset(o.name for o in self.session.get_outputs() if o.type == _STRING)
        if self._string_inputs:
            # The scheduler calls it on each request before batching (scheduling/execute.py).
            self.prepare_inputs = self._decode_inputs
        self._run_options = ort.RunOptions()
        # The binding's own run, without the Python wrapper's checks per call (a WebGPU graph
        # capture query, the feed's names against the graph's, each value's owner): 8-30 us a run
        # on a 2-core box, 3-10% of the demo MLP's, and nothing they check can be wrong here (the
        # scheduler feeds the graph's inputs, as numpy arrays; no WebGPU). On a GPU the wrapper
        # stays: it falls back to the CPU provider when the CUDA one fails at run time.
        # `_sess` is onnxruntime's own attribute, not its API: a release without it runs the wrapper.
        binding = getattr(self.session, "_sess", None)
        cpu_run = getattr(binding, "run", None) if placement.device == "CPU" else None
        self._session_run = cpu_run if callable(cpu_run) else self.session.run
        # With one intra-op thread the calling thread does all the work and no pool threads spin
        # after it, so a short run may execute on the event loop (scheduler.INLINE_MAX_NS); with
        # more, the pool's threads compete with the loop for the cores.
        self.runs_on_loop = placement.device == "CPU" and options.intra_op_num_threads == 1

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        names = list(output_names) or self.output_names
        if self._string_inputs:
            # Requests arrive decoded by prepare_inputs; warmup and direct callers may pass bytes.
            inputs = self._decode_inputs(inputs)
        results = self._session_run(names, inputs, self._run_options)
        if self._string_outputs:
            results = [_encoded(r) if n in self._string_outputs else r for n, r in zip(names, results)]
        return dict(zip(names, results))

    def _decode_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`inputs` with each string input as an object array of `str`, or InvalidArgument."""
        decoded = dict(inputs)
        for name in self._string_inputs.intersection(inputs):
            decoded[name] = _decoded(inputs[name], self.model_name, name)
        return decoded


_STRING = "tensor(string)"


def _decoded(arr: np.ndarray, model: str, name: str) -> np.ndarray:
    """An object array of `str` from BYTES elements (`bytes`, or already `str`), strict UTF-8."""
    items = arr.reshape(-1).tolist()
    try:
        texts = [x if isinstance(x, str) else x.decode("utf-8") for x in items]
    except (UnicodeDecodeError, AttributeError):
        raise _not_text(items, model, name) from None
    return object_array(texts).reshape(arr.shape)


def _not_text(items: list[Any], model: str, name: str) -> InvalidArgument:
    where = f"inference input '{name}' for model '{model}'"
    for i, x in enumerate(items):
        if not isinstance(x, (bytes, bytearray, str)):
            return InvalidArgument(f"{where}: element {i} is a {type(x).__name__}, not bytes")
        try:
            if not isinstance(x, str):
                x.decode("utf-8")
        except UnicodeDecodeError as e:
            return InvalidArgument(
                f"{where}: element {i} is not valid UTF-8 ({e.reason} at byte {e.start}); onnxruntime's "
                "Python API carries string tensors as UTF-8 text, so this model cannot take arbitrary bytes"
            )
    return InvalidArgument(f"{where}: a string element cannot be passed to onnxruntime")


def _encoded(arr: np.ndarray) -> np.ndarray:
    """onnxruntime's string output (`str` elements) as an object array of UTF-8 `bytes`."""
    items = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in arr.reshape(-1).tolist()]
    return object_array(items).reshape(arr.shape)
