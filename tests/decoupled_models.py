"""Decoupled python-backend models (`model_transaction_policy { decoupled: true }`) for the
streaming tests, served by real tritonserver and by ours.

- `repeat`: IN INT32 [-1] → one response per element (OUT = the element, IDX = its index), then
  the FINAL flag alone. An empty IN gives no response at all; a negative element gives an error
  response in its place, and the stream goes on.
- `silent`: no response, the FINAL flag alone.
- `late`: execute returns at once; a thread sends OUT = IN after `LATE_DELAY_MS` milliseconds (or
  the request parameter `delay_ms`) in one response that carries the FINAL flag itself.

`write_paced` writes a decoupled model that sends a fixed number of responses a fixed time apart,
then the FINAL flag alone, or never (`final=False`: a model that never ends its requests).

`write_decoupled_ensemble` adds `times10` (Y = 10 * X, not decoupled) and the ensemble
`repeat_times10`: `repeat`, then `times10` on each of its responses (RESULT = 10 * OUT, INDEX = IDX).

The sources run in Triton's stub (Debian's Python 3.11 with numpy): nothing from the checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["LATE_DELAY_MS", "write_decoupled_ensemble", "write_decoupled_models", "write_paced"]

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


_TIMES10 = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 10).astype(np.int32))]))
        return responses
"""

_TIMES10_CONFIG = """\
name: "times10"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_ENSEMBLE_CONFIG = """\
name: "repeat_times10"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "RESULT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "INDEX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "value" } output_map { key: "IDX" value: "INDEX" } },
  { model_name: "times10" model_version: -1
    input_map { key: "X" value: "value" } output_map { key: "Y" value: "RESULT" } }
] }
"""


def write_decoupled_ensemble(repository: Path) -> str:
    """Write `times10` and the ensemble `repeat_times10` (beside `write_decoupled_models`' `repeat`)."""
    (repository / "times10" / "1").mkdir(parents=True, exist_ok=True)
    (repository / "times10" / "1" / "model.py").write_text(_TIMES10)
    (repository / "times10" / "config.pbtxt").write_text(_TIMES10_CONFIG)
    (repository / "repeat_times10" / "1").mkdir(parents=True, exist_ok=True)
    (repository / "repeat_times10" / "config.pbtxt").write_text(_ENSEMBLE_CONFIG)
    return "repeat_times10"


_PACED = """\
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.responses = int(params["responses"]["string_value"])
        self.gap_s = float(params["gap_ms"]["string_value"]) / 1000.0
        self.final = params["final"]["string_value"] == "1"
        self.held = []  # without the final flag, senders kept: their requests stay open, never ended

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().astype(np.int32)
            for index in range(self.responses):
                if index:
                    time.sleep(self.gap_s)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)]))
            if self.final:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.held.append(sender)
        return None
"""


def write_paced(repository: Path, name: str, *, responses: int, gap_ms: float, final: bool = True) -> None:
    """A decoupled model (IN INT32 [-1] → OUT = IN): `responses` responses `gap_ms` apart, then the
    FINAL flag alone (or never, with `final=False`: the model keeps the sender, so the request stays
    open, as a model that forgets its final flag leaves it)."""
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(_PACED)
    parameters = {"responses": responses, "gap_ms": gap_ms, "final": int(final)}
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{_IO["late"]}'
        "model_transaction_policy { decoupled: true }\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    )
