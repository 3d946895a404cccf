"""The `sequence_batching` part of a model config: strategy, slots, control inputs and implicit state.

Read once per model version (`SequencePolicy.from_config`) and checked with the messages of Triton's
`model_config_utils.cc` (`GetBooleanSequenceControlProperties`, `GetTypedSequenceControlProperties`)
and `sequence_batch_scheduler.cc` (initial state); `controls` builds from it what the batcher adds to
each request, and `batcher.SequenceScheduler` holds the slots.

Control inputs and state tensors are the batcher's, never the client's: `hidden_tensors` names them
so that a config's completion from the model file leaves them out of `input`/`output`, which is
where Triton's metadata and request checks look.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import Tensor
from reference_server.scheduling.policy import BatchingPolicy
from v2kit import tensors as tt

__all__ = ["DEFAULT_IDLE_US", "Control", "SequenceId", "SequencePolicy", "State", "hidden_tensors"]

#: A request's sequence id: an unsigned 64-bit integer or a string (0 and "" mean none).
SequenceId = int | str

#: Triton's default `max_sequence_idle_microseconds` (constants.h SEQUENCE_IDLE_DEFAULT_MICROSECONDS).
DEFAULT_IDLE_US = 1_000_000

_KINDS = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "START",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "END",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "READY",
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_CORRID_TYPES = {"TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING"}


@dataclass(frozen=True, slots=True)
class Control:
    """One control input: its tensor name, kind (START, END, READY, CORRID), dtype, and for the
    boolean kinds the (false, true) values."""

    name: str
    kind: str
    datatype: str  # v2 datatype: INT32, FP32, BOOL; for CORRID, UINT64 ... BYTES
    values: tuple[object, object] = (0, 1)


@dataclass(frozen=True, slots=True)
class State:
    """One implicit state: fed as `input_name`, read back from the model's `output_name`."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: Tensor | None  # None: zeros


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    """What the sequence batcher of one model version needs from its config."""

    model: str
    max_batch_size: int
    oldest: bool
    #: Sequences each instance holds at once: `max_batch_size` (at least 1) for direct, or oldest's
    #: `max_candidate_sequences` when set (Triton's `seq_slot_cnt_`).
    slots_per_instance: int
    idle_ns: int
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    #: How each instance's requests are batched across the sequences it holds.
    batching: BatchingPolicy
    #: `iterative_sequence`: a request without an id starts a sequence of its own, which ends when
    #: the model releases it without rescheduling (core's IterativeSequencer).
    iterative: bool = False

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> SequencePolicy:
        """Read and check `config.sequence_batching`; raises ModelConfigError as Triton words it."""
        sb = config.sequence_batching
        name = config.name
        controls = tuple(_controls(sb, name))
        states = tuple(_state(s, name) for s in sb.state)
        seen: set[str] = set()
        for state in states:
            if state.input_name in seen:
                raise ModelConfigError(f"State input name '{state.input_name}' specified more than once.")
            seen.add(state.input_name)
        mbs = config.max_batch_size
        oldest = sb.HasField("oldest")
        slots = max(1, mbs)
        if oldest:
            if sb.oldest.max_candidate_sequences > 0:
                slots = sb.oldest.max_candidate_sequences
            for size in sb.oldest.preferred_batch_size:
                if size <= 0:
                    raise ModelConfigError(f"sequence batching preferred batch size must be positive for {name}")
                if size > mbs:
                    raise ModelConfigError(
                        f"sequence batching preferred batch size must be <= max batch size for {name}"
                    )
            delay_us = sb.oldest.max_queue_delay_microseconds
            preferred = tuple(sorted(set(sb.oldest.preferred_batch_size)))
        else:
            utilization = sb.direct.minimum_slot_utilization
            if not 0.0 <= utilization <= 1.0:
                raise ModelConfigError(
                    f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
                )
            delay_us = sb.direct.max_queue_delay_microseconds
            preferred = ()
        batching = BatchingPolicy(
            max_batch_size=mbs,
            dynamic=mbs > 0,
            preferred_batch_sizes=preferred,
            max_queue_delay_ns=delay_us * 1000,
            preserve_ordering=oldest and sb.oldest.preserve_ordering,
        )
        idle_us = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
        return cls(name, mbs, oldest, slots, idle_us * 1000, controls, states, batching, sb.iterative_sequence)


def hidden_tensors(config: mc.ModelConfig) -> tuple[frozenset[str], frozenset[str]]:
    """The (inputs, outputs) of the model file that the sequence batcher feeds and reads, which the
    config's `input`/`output` leave out: control inputs, state inputs; state outputs."""
    if not config.HasField("sequence_batching"):
        return frozenset(), frozenset()
    sb = config.sequence_batching
    inputs = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    return frozenset(inputs), frozenset(s.output_name for s in sb.state)


def _controls(sb: mc.ModelSequenceBatching, model: str) -> Iterable[Control]:
    seen_tensors: set[str] = set()
    seen_kinds: set[str] = set()
    for control_input in sb.control_input:
        if not control_input.name:
            raise ModelConfigError(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in seen_tensors:
            raise ModelConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple control "
                f"kinds for {model}"
            )
        seen_tensors.add(control_input.name)
        for c in control_input.control:
            kind = _KINDS[c.kind]
            full = mc.ModelSequenceBatching.Control.Kind.Name(c.kind)
            if kind in seen_kinds:
                raise ModelConfigError(f"sequence batching specifies multiple {full} tensors for {model}")
            seen_kinds.add(kind)
            given = [(f, v) for f, v in (("int32_false_true", c.int32_false_true),
                                         ("fp32_false_true", c.fp32_false_true),
                                         ("bool_false_true", c.bool_false_true)) if len(v)]  # fmt: skip
            if kind == "CORRID":
                if given:
                    raise ModelConfigError(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {full} for {model}"
                    )
                type_name = mc.DataType.Name(c.data_type)
                if type_name not in _CORRID_TYPES:
                    raise ModelConfigError(
                        f"unexpected data type for control {full} for {model}. Allowed data types are "
                        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                    )
                yield Control(control_input.name, kind, tt.config_type_to_datatype(type_name))
                continue
            if not given:
                raise ModelConfigError(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {full} for {model}"
                )
            if len(given) > 1:
                raise ModelConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                    f"'bool_false_true' for {full} for {model}"
                )
            field, values = given[0]
            if len(values) != 2:
                raise ModelConfigError(
                    f"sequence batching control '{field}' must have exactly 2 entries for {full} for {model}"
                )
            datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}[field]
            yield Control(control_input.name, kind, datatype, (values[0], values[1]))


def _state(state: mc.ModelSequenceBatching.State, model: str) -> State:
    datatype = tt.config_type_to_datatype(mc.DataType.Name(state.data_type))
    dims = tuple(state.dims)
    if len(state.initial_state) > 1:
        raise ModelConfigError(
            f"initial_state field for state input '{state.input_name}' must contain exactly one or zero element. "
            f"Found '{len(state.initial_state)}' elements."
        )
    if not state.initial_state:
        return State(state.input_name, state.output_name, datatype, dims, None)
    init = state.initial_state[0]
    if init.data_type != state.data_type:
        raise ModelConfigError(
            f"The data type used for 'initial_state' field of state '{state.input_name}' does not match the "
            "state data type."
        )
    if not init.name:
        raise ModelConfigError(
            f"Field 'name' must be set when using initial_state for state input '{state.input_name}'."
        )
    if len(init.dims) != len(dims):
        raise ModelConfigError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state "
            f"input '{state.input_name}'. {len(init.dims)} != {len(dims)}"
        )
    for init_dim, dim in zip(init.dims, dims):
        if init_dim == -1:
            raise ModelConfigError(
                f"'initial_state' field for state input name '{state.input_name}' contains variable dimensions."
            )
        if dim != -1 and init_dim != dim:
            raise ModelConfigError(
                f"'initial_state' dim for input name '{state.input_name}' doesn't match 'state' dim description. "
                f"{init_dim} != {dim}"
            )
    if init.WhichOneof("state_data") != "zero_data":
        raise ModelConfigError(
            f"initial_state '{init.name}' of state '{state.input_name}' in model '{model}': only zero_data is "
            "supported by this server; data_file is not"
        )
    dtype = tt.datatype_to_numpy(datatype)
    initial = np.full(tuple(init.dims), b"", dtype=object) if datatype == "BYTES" else np.zeros(init.dims, dtype)
    return State(state.input_name, state.output_name, datatype, dims, initial)
