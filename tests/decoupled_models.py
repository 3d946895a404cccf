"""Decoupled python-backend models (`model_transaction_policy { decoupled: true }`) for the
streaming tests, served by real tritonserver and by ours.

- `repeat`: IN INT32 [-1] → one response per element (OUT = the element, IDX = its index), then
  the FINAL flag alone. An empty IN gives no response at all; a negative element gives an error
  response in its place, and the stream goes on.
- `silent`: no response, the FINAL flag alone.
- `late`: execute returns at once; a thread sends OUT = IN after `LATE_DELAY_MS` milliseconds (or
  the request parameter `delay_ms`) in one response that carries the FINAL flag itself.

The sources run in Triton's stub (Debian's Python 3.11 with numpy): nothing from the checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["LATE_DELAY_MS", "write_decoupled_models"]

#: How long `late` waits, after execute has returned, before it answers.
LATE_DELAY_MS = 200

_REPEAT = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            for index, value in enumerate(values):
                if value < 0:
                    error = pb_utils.TritonError(f"repeat: element {index} is negative ({value})")
                    sender.send(pb_utils.InferenceResponse(error=error))
                    continue
                outputs = [
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                ]
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_SILENT = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

_LATE = f"""\
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DELAY_MS = {LATE_DELAY_MS}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            delay_s = json.loads(request.parameters() or "{{}}").get("delay_ms", DELAY_MS) / 1000.0
            # A daemon: a request that was given up on does not hold up the model's unloading.
            threading.Thread(target=self._answer, args=(sender, value, delay_s), daemon=True).start()
        return None

    def _answer(self, sender, value, delay_s):
        time.sleep(delay_s)
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value.astype(np.int32))])
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

_IO = {
    "repeat": (
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "output [\n"
        '  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }\n'
        "]\n"
    ),
    "silent": (
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    ),
    "late": (
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    ),
}
_SOURCES = {"repeat": _REPEAT, "silent": _SILENT, "late": _LATE}


def write_decoupled_models(repository: Path) -> list[str]:
    """Write `repeat`, `silent` and `late` into `repository`; returns their names."""
    for name, source in _SOURCES.items():
        folder = repository / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "1" / "model.py").write_text(source)
        (folder / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{_IO[name]}'
            "model_transaction_policy { decoupled: true }\n"
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        )
    return list(_SOURCES)
