"""Sequence models for the tests: the python accumulator (`perfkit.testing.sequence_models`), and an
ONNX accumulator whose running total is Triton's implicit state."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from perfkit.testing.sequence_models import expected_totals, write_accumulator

__all__ = [
    "CORRELATION",
    "ENSEMBLE_CONFIG",
    "expected_totals",
    "write_accumulator",
    "write_decoupled_accumulator",
    "write_state_accumulator",
]

#: An ensemble (no sequence batcher of its own) whose one step is the accumulator: the request's
#: sequence id and flags reach the step, as Triton passes them to composing models.
ENSEMBLE_CONFIG = """\
name: "sequence_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "CONTROLS" data_type: TYPE_INT32 dims: [ 3 ] } ]
ensemble_scheduling { step [ { model_name: "accumulator" model_version: -1
  input_map { key: "INPUT" value: "INPUT" }
  output_map [ { key: "OUTPUT" value: "OUTPUT" }, { key: "CONTROLS" value: "CONTROLS" } ] } ] }
"""

#: Answers what Triton's python backend shows a model of its request: correlation_id(), flags(), and
#: parameters() (where the sequence parameters must not appear).
CORRELATION = """\
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seen = json.dumps([request.correlation_id(), request.flags(), json.loads(request.parameters())])
            out = pb_utils.Tensor("OUTPUT", np.zeros((1, 1), np.int32))
            text = pb_utils.Tensor("SEEN", np.array([[seen.encode()]], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out, text]))
        return responses
"""


def write_state_accumulator(repository: Path, name: str = "onnx_state") -> Path:
    """An ONNX model with implicit state: OUTPUT = INPUT + INPUT_STATE, and OUTPUT_STATE the same, so
    each response is the sequence's running total only if the batcher carries the state. START
    reaches the graph too (the state is what the batcher resets, so START only has to be accepted)."""
    batch = "batch"
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["SUM"]),
            helper.make_node("Identity", ["SUM"], ["OUTPUT"]),
            helper.make_node("Identity", ["SUM"], ["OUTPUT_STATE"]),
            helper.make_node("Identity", ["START"], ["START_SEEN"]),
        ],
        name,
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [batch, 2]),
            helper.make_tensor_value_info("INPUT_STATE", TensorProto.FLOAT, [batch, 2]),
            helper.make_tensor_value_info("START", TensorProto.INT32, [batch, 1]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [batch, 2]),
            helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.FLOAT, [batch, 2]),
            helper.make_tensor_value_info("START_SEEN", TensorProto.INT32, [batch, 1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
        "sequence_batching {\n"
        "  oldest { max_candidate_sequences: 4 }\n"
        '  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]\n'
        '  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        "}\n"
    )
    return folder


#: A decoupled sequence model: per request, two responses (the running total, then ten times it),
#: then the final flag alone; the total is kept per correlation_id().
DECOUPLED_ACCUMULATOR = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            key = request.correlation_id()
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().sum())
            total = (0 if start else self.totals.get(key, 0)) + value
            self.totals[key] = total
            for out in (total, 10 * total):
                tensor = pb_utils.Tensor("OUTPUT", np.full((1, 1), out, dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([tensor]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def write_decoupled_accumulator(repository: Path, name: str = "decoupled_accumulator") -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(DECOUPLED_ACCUMULATOR)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "model_transaction_policy { decoupled: true }\n"
        "sequence_batching { }\n"
    )
    return folder
