"""A python-backend sequence model that real tritonserver and the reference server both serve: an
accumulator whose running total per sequence shows whether the sequence batcher kept each sequence's
requests together and in order (the tests and bench/sequence_vs_triton.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["ACCUMULATOR", "expected_totals", "write_accumulator"]

#: Adds each request's INPUT to its sequence's total, kept per CORRID in the model (as Triton's python
#: backend examples do: the backend keeps no state). CONTROLS echoes START, END, READY as it got them.
#: Each execution first sleeps DELAY_S (`write_accumulator`'s delay_ms), a fixed service time that
#: makes the server, not the client, set a measurement's pace.
ACCUMULATOR = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils

DELAY_S = 0.0


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        if DELAY_S:
            time.sleep(DELAY_S)
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            controls = [pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("START", "END", "READY")]
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0]
            key = corrid.decode() if isinstance(corrid, bytes) else int(corrid)
            start, end = int(controls[0].reshape(-1)[0]), int(controls[1].reshape(-1)[0])
            total = (0 if start else self.totals.get(key, 0)) + int(value.sum())
            self.totals[key] = total
            if end:
                self.totals.pop(key, None)
            out = np.full(value.shape, total, dtype=np.int32)
            flags = np.concatenate([c.astype(np.int32) for c in controls], axis=-1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("CONTROLS", flags)]))
        return responses
"""

_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "CONTROLS" data_type: TYPE_INT32 dims: [ 3 ] }} ]
sequence_batching {{
  {strategy}
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
}}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def write_accumulator(
    repository: Path,
    name: str,
    *,
    max_batch_size: int = 8,
    strategy: str = "direct { }",
    idle_us: int = 5_000_000,
    corrid: str = "TYPE_UINT64",
    count: int = 1,
    delay_ms: float = 0.0,
) -> Path:
    """The python accumulator as `name` in `repository`, sleeping `delay_ms` per execution."""
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(ACCUMULATOR.replace("DELAY_S = 0.0", f"DELAY_S = {delay_ms / 1000!r}"))
    (folder / "config.pbtxt").write_text(
        _CONFIG.format(
            name=name, max_batch_size=max_batch_size, strategy=strategy, idle_us=idle_us, corrid=corrid, count=count
        )
    )
    return folder


def expected_totals(values: list[int]) -> list[int]:
    """What the accumulator answers to one sequence of `values`: the running totals."""
    return [int(x) for x in np.cumsum(values)]
