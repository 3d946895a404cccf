"""The sequence batcher's state machine and config checks, against a fake instance: no server.

The fake runs on the loop thread (`runs_on_loop`, no worker) and records every request it ran with
the control tensors it got, so the tests read exactly what the model saw, in the order it saw it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.model_config import complete_config
from reference_server.errors import InvalidArgument, ModelConfigError, Unavailable, Unsupported
from reference_server.scheduling.execute import Tensors, TensorSignature
from reference_server.scheduling.sequence.batcher import SequenceScheduler, make_scheduler
from reference_server.scheduling.sequence.config import SequencePolicy, hidden_tensors
from reference_server.scheduling.sequence.controls import control_tensors
from reference_server.scheduling.stats import ModelStats

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def config(text: str, max_batch_size: int = 2) -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "seq" max_batch_size: {max_batch_size}\nsequence_batching {{ {text} }}', mc.ModelConfig()
    )


class Recorder:
    """Answers OUT = IN + STATE_IN (when fed a state) and keeps what each request carried."""

    runs_on_loop = True

    def __init__(self, name: str = "seq_0") -> None:
        self.name = name
        self.seen: list[dict[str, Any]] = []

    def run(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        for row in range(inputs["IN"].shape[0]):
            self.seen.append({k: v[row].tolist() for k, v in inputs.items()} | {"instance": self.name})
        out = inputs["IN"] + inputs.get("STATE_IN", 0)
        return {"OUT": out, "STATE_OUT": out}


def one(value: float) -> Tensors:
    return {"IN": np.array([[value]], dtype=np.float32)}


def params(sequence_id: int | str, start: bool = False, end: bool = False) -> dict[str, Any]:
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end, "custom": 1}


async def step(
    scheduler: SequenceScheduler, sequence_id: int | str, value: float, start: bool = False, end: bool = False
) -> float:
    out = await scheduler.infer(one(value), ["OUT"], parameters=params(sequence_id, start, end))
    return float(out["OUT"][0, 0])


def test_control_tensors_follow_the_config_kinds_and_types() -> None:
    policy = SequencePolicy.from_config(config(CONTROLS))
    tensors = control_tensors(policy, start=True, end=False, sequence_id=2**64 - 1)
    assert {k: (v.dtype.name, v.shape, v.tolist()) for k, v in tensors.items()} == {
        "START": ("int32", (1, 1), [[1]]),
        "END": ("float32", (1, 1), [[0.0]]),
        "READY": ("bool", (1, 1), [[True]]),
        "CORRID": ("uint64", (1, 1), [[2**64 - 1]]),
    }
    assert policy.slots_per_instance == 2 and policy.idle_ns == 1_000_000_000  # Triton's defaults
    unbatched = SequencePolicy.from_config(config(CONTROLS, max_batch_size=0))
    assert control_tensors(unbatched, True, True, 5)["CORRID"].shape == (1,)
    assert hidden_tensors(config(CONTROLS)) == (frozenset({"START", "END", "READY", "CORRID"}), frozenset())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]',
         "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
         "CONTROL_SEQUENCE_START for seq"),
        ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]',
         "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START"),
        ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
         "unexpected data type for control CONTROL_SEQUENCE_CORRID for seq. Allowed data types are TYPE_UINT64"),
        ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },'
         ' { name: "S" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]',
         "sequence batching control tensor 'S' is specified for multiple control kinds for seq"),
        ("oldest { preferred_batch_size: [ 4 ] }", "sequence batching preferred batch size must be <= max batch size"),
        ('state [ { input_name: "A" output_name: "B" data_type: TYPE_FP32 dims: [ 1 ] },'
         ' { input_name: "A" output_name: "C" data_type: TYPE_FP32 dims: [ 1 ] } ]',
         "State input name 'A' specified more than once."),
    ],
)  # fmt: skip
def test_bad_sequence_configs_are_refused_as_triton_words_them(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        SequencePolicy.from_config(config(text))


def test_sequences_keep_their_slot_order_and_controls() -> None:
    async def scenario() -> tuple[list[float], list[dict[str, Any]]]:
        instances = [Recorder("seq_0"), Recorder("seq_1")]
        scheduler = make_scheduler(config(CONTROLS, max_batch_size=1), instances, ModelStats())
        assert isinstance(scheduler, SequenceScheduler)
        # Sent together: the scheduler, not the client, keeps each sequence's order.
        answers = await asyncio.gather(
            scheduler.infer(one(1), ["OUT"], parameters=params(7, start=True)),
            scheduler.infer(one(2), ["OUT"], parameters=params(8, start=True)),
            scheduler.infer(one(3), ["OUT"], parameters=params(7)),
            scheduler.infer(one(4), ["OUT"], parameters=params(7, end=True)),
        )
        await scheduler.close(0)
        return [float(a["OUT"][0, 0]) for a in answers], instances[0].seen + instances[1].seen

    answers, seen = asyncio.run(scenario())
    assert answers == [1.0, 2.0, 3.0, 4.0]
    by_sequence: dict[int, list[tuple[list[float], list[int], list[float], str]]] = {}
    for row in seen:
        assert row["READY"] == [True] and "custom" not in row  # parameters are not inputs
        by_sequence.setdefault(row["CORRID"][0], []).append((row["IN"], row["START"], row["END"], row["instance"]))
    assert by_sequence[7] == [([1.0], [1], [0.0], "seq_0"), ([3.0], [0], [0.0], "seq_0"), ([4.0], [0], [1.0], "seq_0")]
    assert by_sequence[8] == [([2.0], [1], [0.0], "seq_1")]  # the other free slot: the other instance


def test_unknown_sequences_and_bad_parameters_get_tritons_errors() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(config(CONTROLS), [Recorder()], ModelStats())
        with pytest.raises(InvalidArgument, match="inference request for sequence 9 to model 'seq' must specify the "
                                                  "START flag on the first request of the sequence"):  # fmt: skip
            await step(scheduler, 9, 1.0)
        with pytest.raises(InvalidArgument, match="must specify a non-zero or non-empty correlation ID"):
            await step(scheduler, "", 1.0, start=True)
        with pytest.raises(InvalidArgument, match="Unable to parse 'sequence_id'.*unsigned 64-bit integer or a string"):
            await step(scheduler, -3, 1.0, start=True)
        with pytest.raises(Unsupported, match="string correlation ID cannot be longer than 128 characters"):
            await step(scheduler, "x" * 129, 1.0, start=True)
        for _ in range(3):  # refused before it takes one of the two slots
            with pytest.raises(InvalidArgument, match="CORRID control 'CORRID' is UINT64, so the sequence id must"):
                await step(scheduler, "x" * 128, 1.0, start=True)
        both = asyncio.gather(step(scheduler, 5, 1.0, start=True), step(scheduler, 6, 2.0, start=True))
        assert await asyncio.wait_for(both, 5) == [1.0, 2.0]
        with pytest.raises(InvalidArgument, match="Unable to parse 'sequence_start'.*must be a boolean"):
            await scheduler.infer(one(1), ["OUT"], parameters={"sequence_id": 3, "sequence_start": 1})
        two = {"IN": np.ones((2, 1), dtype=np.float32)}
        with pytest.raises(InvalidArgument, match="must specify batch-size 1 due to requirements of sequence batcher"):
            await scheduler.infer(two, ["OUT"], parameters=params(3, start=True))
        await scheduler.close(0)
        with pytest.raises(Unavailable, match="Server is stopping"):
            await step(scheduler, 4, 1.0, start=True)

    asyncio.run(scenario())


def test_the_backlog_waits_for_an_end_and_the_reaper_frees_idle_slots() -> None:
    async def scenario() -> None:
        text = CONTROLS + " max_sequence_idle_microseconds: 200000"
        scheduler = make_scheduler(config(text, max_batch_size=1), [Recorder()], ModelStats())
        assert await step(scheduler, 1, 1.0, start=True) == 1.0
        waiting = asyncio.ensure_future(step(scheduler, 2, 5.0, start=True))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # one slot, held by sequence 1
        assert await step(scheduler, 1, 2.0, end=True) == 2.0
        assert await asyncio.wait_for(waiting, 5) == 5.0
        # Sequence 2 never ends: after the idle limit its slot goes to sequence 3, and sequence 2
        # must START again.
        assert await asyncio.wait_for(step(scheduler, 3, 7.0, start=True, end=True), 5) == 7.0
        with pytest.raises(InvalidArgument, match="sequence 2 .* must specify the START flag"):
            await step(scheduler, 2, 1.0)
        await scheduler.close(0)

    asyncio.run(scenario())


def test_implicit_state_starts_at_zero_and_follows_the_sequence() -> None:
    async def scenario() -> list[float]:
        text = 'state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]'
        scheduler = make_scheduler(config(text), [Recorder()], ModelStats())
        got = [
            await step(scheduler, "a", 1.0, start=True),
            await step(scheduler, "b", 10.0, start=True),
            await step(scheduler, "a", 2.0),
            await step(scheduler, "b", 5.0, end=True),
            await step(scheduler, "a", 4.0, start=True),  # START on a live sequence: state from zero
        ]
        out = await scheduler.infer(one(1.0), ["OUT", "STATE_OUT"], parameters=params("a"))
        got.append(float(out["STATE_OUT"][0, 0]))  # asked for by name, a state output comes back
        await scheduler.close(0)
        return got

    assert asyncio.run(scenario()) == [1.0, 10.0, 3.0, 15.0, 4.0, 5.0]


def test_a_backlogged_sequence_whose_request_times_out_fails_whole() -> None:
    async def scenario() -> None:
        scheduler = make_scheduler(config(CONTROLS, max_batch_size=1), [Recorder()], ModelStats())
        assert await step(scheduler, 1, 1.0, start=True) == 1.0  # holds the only slot
        first = asyncio.ensure_future(
            scheduler.infer(one(2.0), ["OUT"], parameters=params(2, start=True), timeout_us=20_000)
        )
        second = asyncio.ensure_future(step(scheduler, 2, 3.0))  # queued behind it, no timeout of its own
        expired = "timeout of the corresponding sequence has been expired"
        with pytest.raises(Unavailable, match=expired):
            await asyncio.wait_for(first, 5)
        with pytest.raises(Unavailable, match=expired):
            await asyncio.wait_for(second, 5)
        with pytest.raises(InvalidArgument, match="sequence 2 .* must specify the START flag"):
            await step(scheduler, 2, 1.0)  # gone, as in Triton
        assert await step(scheduler, 1, 1.0, end=True) == 1.0  # the slot holder is untouched
        assert await step(scheduler, 3, 4.0, start=True, end=True) == 4.0
        await scheduler.close(0)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (("TYPE_INT32", (-1, 1)), None),
        (("TYPE_FP32", (-1, 1)), "sequence control 'START', the model expects data-type TYPE_FP32 but the model "
                                 "configuration specifies data-type TYPE_INT32"),
        (("TYPE_INT32", (-1, 2)), "sequence control 'START' in model has dims [2] but dims [1] is expected"),
        (None, "configuration specified sequence control 'START', but model does not provide that input"),
    ],
)  # fmt: skip
def test_an_onnx_graph_must_take_the_controls_as_configured(
    start: tuple[str, tuple[int, ...]] | None, message: str | None
) -> None:
    text = 'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]'
    graph = [TensorSignature("IN", "TYPE_FP32", (-1, 1))]
    if start is not None:
        graph.append(TensorSignature("START", start[0], start[1]))
    outputs = [TensorSignature("OUT", "TYPE_FP32", (-1, 1))]
    where = {"model_name": "seq", "config_path": Path("seq/config.pbtxt"), "model_path": Path("seq/1/model.onnx")}
    if message is None:
        completed = complete_config(config(text), graph, outputs, **where)
        # The control is the batcher's: not an input of the config, so neither of the metadata.
        assert [i.name for i in completed.input] == ["IN"]
        assert completed.sequence_batching.max_sequence_idle_microseconds == 1_000_000
        return
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        complete_config(config(text), graph, outputs, **where)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ('input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32', None),
        ('input_name: "S_IN" output_name: "NOPE" data_type: TYPE_FP32', "state output 'NOPE' is not a model output"),
        ('input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT64',
         "state input 'S_IN' has data_type TYPE_INT64 but the model's is TYPE_FP32"),
    ],
)  # fmt: skip
def test_an_onnx_graph_must_carry_each_state(state: str, message: str | None) -> None:
    text = f"state [ {{ {state} dims: [ 2 ] }} ]"
    graph = [TensorSignature("IN", "TYPE_FP32", (-1, 2)), TensorSignature("S_IN", "TYPE_FP32", (-1, 2))]
    outputs = [TensorSignature("OUT", "TYPE_FP32", (-1, 2)), TensorSignature("S_OUT", "TYPE_FP32", (-1, 2))]
    where = {"model_name": "seq", "config_path": Path("seq/config.pbtxt"), "model_path": Path("seq/1/model.onnx")}
    if message is None:
        completed = complete_config(config(text), graph, outputs, **where)
        assert ([i.name for i in completed.input], [o.name for o in completed.output]) == (["IN"], ["OUT"])
        return
    with pytest.raises(ModelConfigError, match=re.escape(message)):
        complete_config(config(text), graph, outputs, **where)
