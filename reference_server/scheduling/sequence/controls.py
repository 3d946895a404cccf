"""What the sequence batcher adds to each request, from its `config.SequencePolicy`: the control
tensors (START, END, READY, CORRID: shape [1], [1, 1] with a batch dimension, as Triton's overrides in
`sequence_batch_scheduler.cc` `SetControlTensors`) and a sequence's first state."""

from __future__ import annotations

import numpy as np

from reference_server.errors import InvalidArgument
from reference_server.scheduling.execute import Tensor, Tensors
from reference_server.scheduling.sequence.config import Control, SequenceId, SequencePolicy
from v2kit import tensors as tt

__all__ = ["check_sequence_id", "control_tensors", "initial_states"]


def control_tensors(policy: SequencePolicy, start: bool, end: bool, sequence_id: SequenceId) -> Tensors:
    """The control inputs of one request: READY true, START and END as flagged, CORRID its id."""
    shape = (1, 1) if policy.max_batch_size > 0 else (1,)
    out: Tensors = {}
    for control in policy.controls:
        if control.kind == "CORRID":
            out[control.name] = _corrid(control, sequence_id, shape)
            continue
        on = {"START": start, "END": end, "READY": True}[control.kind]
        dtype = tt.datatype_to_numpy(control.datatype)
        out[control.name] = np.full(shape, control.values[1 if on else 0], dtype=dtype)
    return out


def check_sequence_id(policy: SequencePolicy, sequence_id: SequenceId) -> None:
    """Refuse a string id for a numeric CORRID control, before the sequence takes a slot."""
    for control in policy.controls:
        if control.kind == "CORRID" and control.datatype != "BYTES" and isinstance(sequence_id, str):
            raise InvalidArgument(
                f"inference request for sequence {sequence_id} to model '{policy.model}': the model's CORRID "
                f"control '{control.name}' is {control.datatype}, so the sequence id must be an unsigned "
                "integer, not a string"
            )


def initial_states(policy: SequencePolicy) -> Tensors:
    """Each state's value at a sequence's START: its `initial_state`, else zeros."""
    out: Tensors = {}
    for state in policy.states:
        if state.initial is not None:
            value = state.initial
        else:
            dims = [max(d, 1) for d in state.dims]  # a variable dim starts with one element
            value = np.zeros(dims, dtype=tt.datatype_to_numpy(state.datatype))
            if state.datatype == "BYTES":
                value = np.full(dims, b"", dtype=object)
        out[state.input_name] = value[np.newaxis] if policy.max_batch_size > 0 else value
    return out


def _corrid(control: Control, sequence_id: SequenceId, shape: tuple[int, ...]) -> Tensor:
    if control.datatype == "BYTES":
        text = sequence_id if isinstance(sequence_id, str) else str(sequence_id)
        return np.full(shape, text.encode(), dtype=object)
    assert isinstance(sequence_id, int), "checked at admission (check_sequence_id)"
    # Triton copies the id's low bytes into the control's type.
    dtype = tt.datatype_to_numpy(control.datatype)
    return np.array(sequence_id & ((1 << (8 * dtype.itemsize)) - 1), dtype=np.uint64).astype(dtype).reshape(shape)
