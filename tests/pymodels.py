"""Python-backend models for the tests: each a config.pbtxt and a model.py, written into a repository."""

from __future__ import annotations

import textwrap
from pathlib import Path

_ECHO = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = args

    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                array = tensor.as_numpy()
                MARKER
                outputs.append(pb_utils.Tensor(tensor.name().replace("INPUT", "OUTPUT"), array))
            outputs.append(pb_utils.Tensor("PID", np.array([[os.getpid()]] * array.shape[0], dtype=np.int64)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def _echo(marker: str = "pass") -> str:
    return _ECHO.replace("MARKER", marker)


def _config(name: str, body: str, datatype: str = "TYPE_FP32", count: int = 1) -> str:
    return (
        textwrap.dedent(
            f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: {datatype} dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ -1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """
        )
        + body
    )


_BATCH = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("COUNT", np.full((rows, 1), len(requests), dtype=np.int32)),
                pb_utils.Tensor("ID", np.array([[request.request_id().encode()]] * rows, dtype=object)),
                pb_utils.Tensor("PARAMS", np.array([[request.parameters().encode()]] * rows, dtype=object)),
            ]))
        return responses
"""

_BATCH_CONFIG = """\
name: "py_batch"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }
]
# Four requests make the preferred batch; the long delay only matters if they straggle.
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
"""

_BLS = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            onnx = pb_utils.InferenceRequest(
                model_name="identity", inputs=[x], requested_output_names=["OUTPUT0"]
            ).exec()
            python_call = pb_utils.InferenceRequest(
                model_name="py_identity", inputs=[x], requested_output_names=["OUTPUT0"], request_id="from-bls"
            ).async_exec()
            missing = pb_utils.InferenceRequest(
                model_name="no_such_model", inputs=[x], requested_output_names=["OUTPUT0"]
            )
            python_response, missing_response = await asyncio.gather(python_call, missing.async_exec())
            for response in (onnx, python_response):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            error = missing_response.error().message() if missing_response.has_error() else ""
            rows = x.as_numpy().shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT_ONNX", pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0").as_numpy()),
                pb_utils.Tensor("OUT_PY", pb_utils.get_output_tensor_by_name(python_response, "OUTPUT0").as_numpy()),
                pb_utils.Tensor("ERROR", np.array([[error.encode()]] * rows, dtype=object)),
            ]))
        return responses
"""

_BLS_CONFIG = """\
name: "py_bls"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUT_ONNX" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUT_PY" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

_BLS_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            call = pb_utils.InferenceRequest(model_name="py_decoupled", inputs=[n], requested_output_names=["OUT"])
            values = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.append(int(out.as_numpy()[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("VALUES", np.array(values + [-1], dtype=np.int32))]))
        return responses
"""

_BLS_STREAM_CONFIG = """\
name: "py_bls_stream"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUES" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

_DECOUPLED = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.held = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            if params.get("hold"):
                # Answered only when a later request says "release": after this execute returned.
                self.held.append((sender, n))
                continue
            if params.get("release"):
                for held, count in self.held:
                    self.respond(held, count, final_alone=True)
                self.held = []
            self.respond(sender, n, final_alone=params.get("final_alone", False))
        return None

    def respond(self, sender, n, final_alone):
        for i in range(n):
            last = i == n - 1 and not final_alone
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]),
                        flags=FINAL if last else 0)
        if final_alone or n == 0:
            sender.send(flags=FINAL)
"""

_DECOUPLED_CONFIG = """\
name: "py_decoupled"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

_AUTO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [2]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() * 2)]) for r in requests
        ]
"""

_FINALIZE = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy()),
                                            pb_utils.Tensor("PID", (r.inputs()[0].as_numpy()[:, :1] * 0).astype("int64") + os.getpid())])
                for r in requests]

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write("finalized")
"""

_ERROR = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = request.inputs()[0].as_numpy()
            if x.reshape(-1)[0] < 0:
                error = pb_utils.TritonError("the input must not be negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                pid = np.zeros((x.shape[0], 1), dtype=np.int64)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PID", pid)]))
        return responses
"""

#: name → (config.pbtxt, model.py)
MODELS: dict[str, tuple[str, str]] = {
    "py_identity": (_config("py_identity", "", count=2), _echo()),
    "py_bytes": (_config("py_bytes", "", "TYPE_STRING"), _echo()),
    "py_batch": (_BATCH_CONFIG, _BATCH),
    "py_bls": (_BLS_CONFIG, _BLS),
    "py_decoupled": (_DECOUPLED_CONFIG, _DECOUPLED),
    "py_bls_stream": (_BLS_STREAM_CONFIG, _BLS_STREAM),
    "py_auto": ('backend: "python"\n', _AUTO),
    "py_finalize": (_config("py_finalize", ""), _FINALIZE),
    "py_syntax": (
        _config("py_syntax", ""),
        "class TritonPythonModel:\n    def execute(self requests):\n        pass\n",
    ),
    "py_init_raises": (
        _config("py_init_raises", ""),
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('no weights in this folder')\n",
    ),
    "py_raises": (_config("py_raises", ""), _echo("if array.reshape(-1)[0] < 0: raise RuntimeError('negative input')")),
    "py_error": (_config("py_error", ""), _ERROR),
    "py_exit": (_config("py_exit", ""), _echo("if array.reshape(-1)[0] == 13: os._exit(3)")),
    "py_hang": (
        _config("py_hang", ""),
        _echo("if array.reshape(-1)[0] == 7:\n                    import time; time.sleep(3600)"),
    ),
}


def write_python_models(repository: Path) -> Path:
    """Write every model of MODELS into `repository` (version 1); return `repository`."""
    for name, (config, source) in MODELS.items():
        version = repository / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (repository / name / "config.pbtxt").write_text(config)
        (version / "model.py").write_text(source.lstrip())
    return repository
