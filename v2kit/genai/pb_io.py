"""The python-backend calls the generative demo models make: copied beside their model.py, since
it imports `triton_python_backend_utils`, which exists only inside a python-backend stub."""

from __future__ import annotations

import os
from typing import Any

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def input_array(request: Any, name: str) -> Any:
    """The request's input `name` as a numpy array, or None when the request leaves it out."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def send(sender: Any, outputs: dict[str, Any], final: bool) -> None:
    """One response of `outputs` (name -> array), with the final flag when `final`."""
    tensors = [pb_utils.Tensor(name, array) for name, array in outputs.items()]
    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)


def onnx_session(args: dict[str, Any]) -> Any:
    """The model version's `model.onnx` in an onnxruntime session on the CPU with one thread each
    way, so that a demo model leaves the cores to the server and the load it measures."""
    import onnxruntime as ort  # here: sim_llm shares this module and runs no graph

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
