"""The python-backend calls the generative demo models make: copied beside their model.py, since
it imports `triton_python_backend_utils`, which exists only inside a python-backend stub."""

from __future__ import annotations

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
